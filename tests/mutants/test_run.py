"""The mutants runner itself: it tells a check that fails from code that crashes.

These run pytest in a subprocess on small throwaway test modules with the ``_killcheck`` plugin,
so what is checked is exactly what ``run.py`` reads from a mutated run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.mutants import run

ROOT = Path(__file__).resolve().parents[2]


def killcheck(
    tmp_path: Path, body: str, first_on_path: Path | None = None
) -> tuple[int, list[dict[str, object]]]:
    """Run a one-file test module under the plugin; pytest's exit code and the records.

    ``first_on_path``: a directory put before the repository on PYTHONPATH (a ``domo`` of its
    own, as run.py's mutated copy is)."""
    module = tmp_path / "test_sample.py"
    module.write_text(textwrap.dedent(body))
    records = tmp_path / "records.jsonl"
    path = [str(first_on_path)] if first_on_path is not None else []
    env = dict(
        os.environ,
        DOMO_KILLCHECK_FILE=str(records),
        PYTHONPATH=os.pathsep.join([*path, str(ROOT)]),
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.mutants._killcheck",
            "-o",
            "addopts=",
            "-c",
            os.devnull,
            str(module),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return result.returncode, run.read_records(records)


def test_a_failing_assert_is_a_kill(tmp_path: Path) -> None:
    code, records = killcheck(tmp_path, "def test_x():\n    assert 1 + 1 == 3\n")
    assert code == 1
    assert records == [
        {
            "test": "test_sample.py::test_x",
            "when": "call",
            "errors": [{"type": "AssertionError", "kind": "assertion"}],
        }
    ]
    assert run.verdict_from(code, records)[0] == run.KILLED


@pytest.mark.parametrize(
    ("body", "type_name"),
    [
        ("def test_x():\n    undefined_name\n", "NameError"),
        ("def test_x():\n    len(3)\n", "TypeError"),
        ("def test_x():\n    import domo.no_such_module\n", "ModuleNotFoundError"),
    ],
)
def test_an_error_in_the_code_is_a_crash(tmp_path: Path, body: str, type_name: str) -> None:
    code, records = killcheck(tmp_path, body)
    assert code == 1
    assert [r["errors"] for r in records] == [[{"type": type_name, "kind": "crash"}]]
    verdict, detail = run.verdict_from(code, records)
    assert verdict == run.CRASHED
    assert type_name in detail


def test_pytest_fail_and_raises_are_checks(tmp_path: Path) -> None:
    body = """
        import pytest

        def test_fail():
            pytest.fail("the rule was broken")

        def test_raises():
            with pytest.raises(ValueError):
                pass
    """
    code, records = killcheck(tmp_path, body)
    assert code == 1
    assert [(r["test"], r["errors"]) for r in records] == [
        ("test_sample.py::test_fail", [{"type": "Failed", "kind": "assertion"}]),
        ("test_sample.py::test_raises", [{"type": "Failed", "kind": "assertion"}]),
    ]


def test_an_assert_inside_domo_itself_is_a_crash(tmp_path: Path) -> None:
    """An invariant tripping inside the package under test is not a test noticing the rule."""
    package = tmp_path / "pkg" / "domo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def broken():\n    assert False, 'internal'\n")
    body = "import domo\n\ndef test_x():\n    domo.broken()\n"
    code, records = killcheck(tmp_path, body, first_on_path=tmp_path / "pkg")
    assert [r["errors"] for r in records] == [[{"type": "AssertionError", "kind": "crash"}]]
    assert run.verdict_from(code, records)[0] == run.CRASHED


def test_a_group_counts_each_leaf(tmp_path: Path) -> None:
    """Hypothesis reports several distinct bugs as an exception group; one check is enough."""
    body = """
        def test_x():
            raise ExceptionGroup("two bugs", [AssertionError("seen"), KeyError("k")])
    """
    code, records = killcheck(tmp_path, body)
    assert [r["errors"] for r in records] == [
        [{"type": "AssertionError", "kind": "assertion"}, {"type": "KeyError", "kind": "crash"}]
    ]
    assert run.verdict_from(code, records)[0] == run.KILLED


def test_an_unimportable_test_module_is_a_crash(tmp_path: Path) -> None:
    code, records = killcheck(tmp_path, "import no_such_module_anywhere\n")
    assert code == 2
    assert [r["when"] for r in records] == ["collect"]
    assert run.verdict_from(code, records)[0] == run.CRASHED


def test_passing_suite_is_a_survivor() -> None:
    assert run.verdict_from(0, []) == (run.SURVIVED, "every test passed")


def test_a_red_baseline_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unmutated suite failing means no mutant verdict can be trusted: exit 1 at once."""
    planted: list[str] = []

    def fake_run_one(mutant: run.Mutant | None) -> run.Outcome:
        planted.append("baseline" if mutant is None else mutant.id)
        return run.Outcome(run.BASELINE, run.CRASHED, "1 failed", 0.1)

    monkeypatch.setattr(run, "run_one", fake_run_one)
    monkeypatch.setattr(sys, "argv", ["run.py", "--only", run.load_mutants()[0].id])
    assert run.main() == 1
    assert planted == ["baseline"]


def test_every_mutant_file_loads_and_plants_once(tmp_path: Path) -> None:
    """Every mutant's ``old`` text occurs exactly once in today's source (none is stale)."""
    mutants = run.load_mutants()
    assert mutants
    for mutant in mutants:
        target = ROOT / mutant.file
        assert target.read_text().count(mutant.old) == 1, mutant.id
