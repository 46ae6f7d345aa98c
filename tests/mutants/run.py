"""Plant each bug listed in tests/mutants/*.toml in a copy of the core; the suite must catch it.

Each mutant names a file under ``src/``, an ``old`` snippet that must occur exactly once there, the
``new`` snippet that replaces it, and the rule of ``specs/mdp-0.2.md`` it breaks. For each mutant
this script copies ``src/domo`` to a temporary directory, applies the change, and runs the core's
tests (``tests/protocol``) against the copy with ``PYTHONPATH`` pointing at it.

Before any mutant, the same suite runs once against an unmutated copy: a red baseline would make
every mutant look killed, so the run stops there. A mutant counts as *killed* only when a test's
own check fails on it (an ``assert``, ``pytest.fail``, a ``pytest.raises`` that saw nothing), as
the plugin ``_killcheck.py`` records. A mutant that only makes the code crash (``NameError``,
``TypeError``, ``ImportError``, an assertion inside the core itself, a hang) is reported as
*crashed*: it proves the mutant is broken Python, not that a test checks its rule, so it fails the
session just as a survivor does. Stale mutants (their ``old`` text not found once) fail it too.

Usage: ``python tests/mutants/run.py [--only ID ...] [--jobs N] [--list] [--no-baseline]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_DIR = Path(__file__).resolve().parent
PYTEST_TARGET = "tests/protocol"
# A mutant can make the core loop forever (a timer re-armed in the past); that is caught too,
# but it must not hang CI.
TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class Mutant:
    """One planted bug."""

    id: str
    rule: str
    file: str
    old: str
    new: str
    description: str
    # The tests that judge it: the core's by default; a module of its own for a mutant of a
    # layer that only that module exercises (memo01), so it costs seconds, not a suite run.
    tests: str = PYTEST_TARGET


KILLED, CRASHED, SURVIVED, STALE = "killed", "crashed", "SURVIVED", "stale"


@dataclass(frozen=True)
class Outcome:
    """What the suite did with one mutant: a verdict (KILLED, CRASHED, SURVIVED or STALE)."""

    mutant: Mutant
    verdict: str
    detail: str
    seconds: float

    @property
    def killed(self) -> bool:
        """Whether a test's own check caught the mutant."""
        return self.verdict == KILLED


def verdict_from(returncode: int, records: list[dict[str, object]]) -> tuple[str, str]:
    """The verdict for one mutated run from pytest's exit code and ``_killcheck`` records.

    Killed needs at least one failure classified ``assertion``; failures that are all crashes
    (or a pytest that could not collect the tests) make the mutant CRASHED.
    """
    if returncode == 0:
        return SURVIVED, "every test passed"
    checks = [r for r in records if _kinds(r) & {"assertion"}]
    if returncode == 1 and checks:
        return KILLED, f"assertion in {checks[0]['test']}"
    if records:
        first = records[0]
        types = ", ".join(sorted({str(e["type"]) for e in _errors(first)}))
        return CRASHED, f"only crashes ({types}) in {first['test']}"
    return CRASHED, f"pytest exit {returncode} without a failing check"


def _errors(record: dict[str, object]) -> list[dict[str, str]]:
    errors = record.get("errors", [])
    return errors if isinstance(errors, list) else []


def _kinds(record: dict[str, object]) -> set[str]:
    return {str(e.get("kind")) for e in _errors(record)}


def read_records(path: Path) -> list[dict[str, object]]:
    """The JSON lines ``_killcheck`` wrote (none if the file was never created)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_mutants() -> list[Mutant]:
    """Every mutant of every ``*.toml`` file next to this script, in file then list order."""
    mutants: list[Mutant] = []
    for path in sorted(MUTANTS_DIR.glob("*.toml")):
        with path.open("rb") as handle:
            data = tomllib.load(handle)
        for entry in data.get("mutant", []):
            mutants.append(Mutant(**entry))
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"duplicate mutant ids: {duplicates}")
    return mutants


def plant(mutant: Mutant | None, workdir: Path) -> Path:
    """Copy src/domo into ``workdir`` and apply ``mutant`` (if any); return the new ``src``."""
    src = workdir / "src"
    shutil.copytree(ROOT / "src" / "domo", src / "domo")
    if mutant is None:
        return src
    target = src / Path(mutant.file).relative_to("src")
    text = target.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"'old' occurs {count} times in {mutant.file}, expected exactly once")
    target.write_text(text.replace(mutant.old, mutant.new))
    return src


def run_one(mutant: Mutant | None) -> Outcome:
    """Plant one mutant (``None``: none, the baseline) and run the core's tests against it."""
    started = time.monotonic()
    label = mutant.id if mutant is not None else "baseline"
    with tempfile.TemporaryDirectory(prefix=f"domo-mutant-{label}-") as tmp:
        try:
            src = plant(mutant, Path(tmp))
        except ValueError as error:
            assert mutant is not None
            return Outcome(mutant, STALE, f"stale mutant: {error}", time.monotonic() - started)
        records_path = Path(tmp) / "killcheck.jsonl"
        env = dict(os.environ, PYTHONPATH=str(src), CI="true", PYTHONDONTWRITEBYTECODE="1")
        env["HYPOTHESIS_PROFILE"] = "mutants"  # the ci profile without shrinking
        env["DOMO_KILLCHECK_FILE"] = str(records_path)
        # Prove the copy is what the tests import before trusting the result.
        probe = subprocess.run(
            [sys.executable, "-c", "import domo; print(domo.__file__)"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        subject = mutant if mutant is not None else BASELINE
        if not probe.stdout.strip().startswith(str(src)):
            detail = f"imports {probe.stdout.strip()!r}, not the copy"
            return Outcome(subject, CRASHED, detail, 0.0)
        try:
            target = PYTEST_TARGET if mutant is None else mutant.tests
            result = run_suite(env, target=target)
            records = read_records(records_path)
            if mutant is not None and verdict_from(result.returncode, records)[0] == CRASHED:
                # -x stopped at the first failure, a crash; a check further on may still catch
                # the mutant, so run the whole suite once more before calling it a crash.
                records_path.unlink(missing_ok=True)
                result = run_suite(env, stop_at_first=False, target=target)
                records = read_records(records_path)
        except subprocess.TimeoutExpired:
            seconds = time.monotonic() - started
            return Outcome(subject, CRASHED, f"the suite hung (> {TIMEOUT_SECONDS}s)", seconds)
    seconds = time.monotonic() - started
    if mutant is None:
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        summary = lines[-1] if lines else result.stderr.strip()[-300:]
        verdict = SURVIVED if result.returncode == 0 else CRASHED
        return Outcome(BASELINE, verdict, summary, seconds)
    verdict, detail = verdict_from(result.returncode, records)
    return Outcome(mutant, verdict, detail, seconds)


# The unmutated run: it must pass (it "survives") for any mutant's verdict to mean anything.
BASELINE = Mutant("baseline", "-", "-", "", "", "the core as it is")


def run_suite(
    env: dict[str, str], stop_at_first: bool = True, target: str = PYTEST_TARGET
) -> subprocess.CompletedProcess[str]:
    """Run the core's tests (or ``target``) with ``env`` (whose PYTHONPATH points at a mutated
    copy)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *(["-x"] if stop_at_first else []),
            "-q",
            "-p",
            "no:cacheprovider",
            "--no-header",
            "-p",
            "tests.mutants._killcheck",
            # The spec-vs-code table check would "kill" any mutant of a table without a
            # behaviour test noticing; only behaviour counts here.
            "--ignore=tests/protocol/test_spec.py",
            target,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_SECONDS,
    )


def main() -> int:
    """Run the mutants; exit 0 only if every one was killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only these mutant ids")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel runs")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the unmutated run (debugging only)"
    )
    args = parser.parse_args()
    mutants = load_mutants()
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            parser.error(f"unknown mutant ids: {unknown}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id:32} {m.rule:9} {m.description}")
        return 0
    if not args.no_baseline:
        print("running the suite on the unmutated core first", flush=True)
        baseline = run_one(None)
        if baseline.verdict != SURVIVED:
            print(f"RED BASELINE ({baseline.seconds:.1f}s): {baseline.detail}", flush=True)
            print("the suite fails without any mutant: fix it before judging mutants")
            return 1
        print(f"baseline green in {baseline.seconds:.1f}s", flush=True)
    print(f"planting {len(mutants)} mutants, {args.jobs} at a time", flush=True)
    counts: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for outcome in pool.map(run_one, mutants):
            counts[outcome.verdict] = counts.get(outcome.verdict, 0) + 1
            print(
                f"{outcome.verdict:8} {outcome.mutant.id:32} {outcome.mutant.rule:9} "
                f"{outcome.seconds:6.1f}s  {outcome.detail}",
                flush=True,
            )
    killed = counts.get(KILLED, 0)
    others = ", ".join(f"{counts[v]} {v}" for v in (CRASHED, SURVIVED, STALE) if counts.get(v))
    print(
        f"{killed}/{len(mutants)} mutants killed by an assertion"
        + (f"; {others}" if others else "")
    )
    return 0 if mutants and killed == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
