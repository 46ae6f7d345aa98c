"""specs/tsp.md and specs/binary-star.md are checked, not just written, and the pure machines
are pure.

- Every rule a spec defines (the first cell of a table row) is cited by some test.
- Every rule id the code names is defined in its spec.
- ``domo.titanic.protocol`` (and the Binary Star machine) import nothing of I/O, statically and
  in a fresh interpreter.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.protocol.test_purity import PURE_STDLIB

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SOURCES = ROOT / "src" / "domo"
SPECS = {"tsp.md": "TSP", "binary-star.md": "BSTAR"}
PURE_MODULES = {"domo.titanic.protocol": SOURCES / "titanic" / "protocol.py"}
BINARY_STAR = SOURCES / "binarystar" / "fsm.py"
if BINARY_STAR.exists():
    PURE_MODULES["domo.binarystar.fsm"] = BINARY_STAR
ALLOWED_DOMO = ("domo.protocol.errors",)


def rule_id(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"\b{prefix}-[A-Z]-\d\d\b" if prefix == "TSP" else rf"\b{prefix}-\d\d\b")


def defined(name: str) -> list[str]:
    prefix = SPECS[name]
    path = ROOT / "specs" / name
    if not path.exists():
        pytest.skip(f"specs/{name} is not written yet")
    pattern = r"[A-Z]-\d\d" if prefix == "TSP" else r"\d\d"
    return re.findall(rf"^\|\s*({prefix}-{pattern})\s*\|", path.read_text(), re.MULTILINE)


def all_test_sources() -> str:
    this = Path(__file__).resolve()
    return "\n".join(
        p.read_text(encoding="utf-8") for p in sorted(TESTS.rglob("*.py")) if p.resolve() != this
    )


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_rule_is_defined_once_and_cited_by_a_test(name: str) -> None:
    rules = defined(name)
    assert rules, f"specs/{name} defines no rule"
    assert len(rules) == len(set(rules)), "a rule id is defined twice"
    cited = set(rule_id(SPECS[name]).findall(all_test_sources()))
    assert [rule for rule in rules if rule not in cited] == []


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_rule_the_code_names_is_defined(name: str) -> None:
    rules = set(defined(name))
    named = set()
    for path in sorted(SOURCES.rglob("*.py")):
        named.update(rule_id(SPECS[name]).findall(path.read_text(encoding="utf-8")))
    assert sorted(named - rules) == []


def test_the_spec_checks_can_fail() -> None:
    assert rule_id("TSP").findall("TSP-S-01 and TSP-D-99, not TSP-1") == ["TSP-S-01", "TSP-D-99"]
    assert rule_id("BSTAR").findall("BSTAR-07 BSTAR-7") == ["BSTAR-07"]


def _impure_imports(path: Path) -> list[str]:
    problems = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom):
            problems.append(f"{path.name}:{node.lineno}: relative import")
        for module in names:
            top = module.split(".")[0]
            if top not in PURE_STDLIB and top != "typing_extensions" and module not in ALLOWED_DOMO:
                problems.append(f"{path.name}:{getattr(node, 'lineno', '?')}: imports {module}")
    return problems


def test_the_pure_machines_import_nothing_impure() -> None:
    """TSP-D-09, TSP-D-16: no clock, no ids, no I/O in the machine (statically)."""
    problems = [p for path in PURE_MODULES.values() for p in _impure_imports(path)]
    assert problems == []
    assert _impure_imports(SOURCES / "titanic" / "store.py") != []  # the check can fail


def test_importing_the_pure_machines_loads_no_io() -> None:
    """A fresh interpreter: importing them loads no I/O, clock-free of threads and sockets."""
    probe = (
        "import sys\n"
        f"for name in {sorted(PURE_MODULES)!r}:\n"
        "    __import__(name)\n"
        "print(sorted(sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded = ast.literal_eval(result.stdout)
    for banned in ("trio", "zmq", "socket", "asyncio", "threading", "sqlite3", "uuid", "random"):
        assert [m for m in loaded if m.split(".")[0] == banned] == [], banned
