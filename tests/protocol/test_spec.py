"""The specs, the code and the tests agree: specs/*.md are checked, not just written.

specs/mdp-0.2.md gets every check below; the dialect specs (specs/mdp-0.1.md, majortomo.md,
reqrep.md, with ids like ``MDP01-05``, ``MAJ-03``, ``REQREP-01``) and the family core's
(specs/family.md, ``FAM-01``) get the citation checks.

- The transition tables in the spec are exactly what ``domo.spec_tables`` renders from the code.
- Every rule the spec defines is cited by some test (a rule nobody tests is a rule nobody keeps).
- Every rule id the code or a planted bug names is defined in the spec.

A rule is *defined* by a row of one of the spec's rule tables whose first cell is its id. A test
*cites* a rule by naming its id anywhere in its source (name, docstring, comment or string), as
``MDP-X-NN``, or in a test name as ``mdp_x_nn``.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from domo.spec_tables import extract_block, render_block

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "mdp-0.2.md"
TESTS = ROOT / "tests"
SOURCES = ROOT / "src" / "domo"
MUTANTS = TESTS / "mutants"

RULE_ID = re.compile(r"\bMDP-[A-Z]-\d\d\b")
RULE_ID_IN_NAME = re.compile(r"\bmdp_([a-z])_(\d\d)(?!\d)", re.IGNORECASE)
DEFINITION = re.compile(r"^\|\s*(MDP-[A-Z]-\d\d)\s*\|", re.MULTILINE)
DIALECT_SPECS = {
    "mdp-0.1.md": "MDP01",
    "majortomo.md": "MAJ",
    "reqrep.md": "REQREP",
    "dcp-v1.md": "DCP",
    "emqp-1.0.md": "EMQP",
    "memo01.md": "MEMO",
    "family.md": "FAM",
}
DIALECT_RULE_ID = re.compile(r"\b(?:MDP01|MAJ|REQREP|DCP|EMQP|MEMO|FAM)-\d\d\b")
# Specs of what runs beside the broker, by file: the pattern of their rule ids.
LAYER_SPECS = {"tsp.md": r"TSP-[A-Z]-\d\d", "binary-star.md": r"BSTAR-\d\d"}
LAYER_RULE_ID = re.compile(r"\b(?:" + "|".join(LAYER_SPECS.values()) + r")\b")


def dialect_rules(name: str) -> list[str]:
    """The rule ids defined (first column of a table row) in one dialect spec."""
    prefix = DIALECT_SPECS[name]
    text = (ROOT / "specs" / name).read_text(encoding="utf-8")
    return re.findall(rf"^\|\s*({prefix}-\d\d)\s*\|", text, re.MULTILINE)


def all_test_sources() -> str:
    """Every test file's text but this one's and the mutants'."""
    this_file = Path(__file__).resolve()
    return "\n".join(
        path.read_text(encoding="utf-8")
        for path in sorted(TESTS.rglob("*.py"))
        if path.resolve() != this_file and MUTANTS not in path.parents
    )


def spec_text() -> str:
    return SPEC.read_text(encoding="utf-8")


def defined_rules() -> list[str]:
    """Rule ids in the first column of the spec's tables, in order of appearance."""
    return DEFINITION.findall(spec_text())


def cited_rules(source: str) -> set[str]:
    """Rule ids a test source names, either spelling."""
    cited = set(RULE_ID.findall(source))
    cited.update(f"MDP-{letter.upper()}-{num}" for letter, num in RULE_ID_IN_NAME.findall(source))
    return cited


def test_spec_defines_rules_once_each() -> None:
    """The rule tables are there, and no id is defined twice."""
    rules = defined_rules()
    assert len(rules) > 50, f"only {len(rules)} rule rows found in {SPEC}; is the format intact?"
    twice = sorted(rule for rule, count in Counter(rules).items() if count > 1)
    assert not twice, f"rule ids defined more than once: {twice}"


def test_transition_tables_in_spec_match_the_code() -> None:
    """The block between the table markers is the renderer's current output."""
    in_spec = extract_block(spec_text())
    rendered = render_block()
    assert in_spec == rendered, (
        "the transition tables in specs/mdp-0.2.md differ from the code; regenerate them with "
        "`python -m domo.spec_tables --write specs/mdp-0.2.md` and review the diff"
    )


def test_every_rule_is_cited_by_a_test() -> None:
    """Each rule of the spec is named by at least one test file other than this one."""
    this_file = Path(__file__).resolve()
    cited: set[str] = set()
    for path in sorted(TESTS.rglob("*.py")):
        if path.resolve() == this_file or MUTANTS in path.parents:
            continue
        cited |= cited_rules(path.read_text(encoding="utf-8"))
    uncited = [rule for rule in defined_rules() if rule not in cited]
    assert not uncited, f"{len(uncited)} rules are cited by no test: {', '.join(uncited)}"


def test_rule_ids_in_the_code_are_defined() -> None:
    """Every rule id the code names (in events, errors, tables, docs or comments) exists."""
    defined = set(defined_rules())
    unknown = [
        f"{path.relative_to(ROOT)}:{number}: {rule}"
        for path in sorted(SOURCES.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for rule in RULE_ID.findall(line)
        if rule not in defined
    ]
    assert not unknown, "rule ids used in src/domo but not defined in the spec:\n" + "\n".join(
        unknown
    )


def test_code_names_rules() -> None:
    """The scan above is looking at the right files: the core does name rules."""
    named = {
        rule
        for path in SOURCES.rglob("*.py")
        for rule in RULE_ID.findall(path.read_text(encoding="utf-8"))
    }
    assert len(named) > 30, f"only {len(named)} rule ids found under {SOURCES}"


@pytest.mark.parametrize("name", sorted(DIALECT_SPECS))
def test_every_dialect_rule_is_defined_once_and_cited(name: str) -> None:
    """MDP01-*, MAJ-*, REQREP-*, DCP-*: each rule of a dialect spec is named by some test."""
    rules = dialect_rules(name)
    assert len(rules) >= 5, f"only {len(rules)} rule rows in specs/{name}"
    assert len(rules) == len(set(rules)), f"a rule id is defined twice in specs/{name}"
    cited = set(DIALECT_RULE_ID.findall(all_test_sources()))
    uncited = [rule for rule in rules if rule not in cited]
    assert not uncited, f"rules of specs/{name} cited by no test: {', '.join(uncited)}"


def test_dialect_rule_ids_in_the_code_are_defined() -> None:
    defined = {rule for name in DIALECT_SPECS for rule in dialect_rules(name)}
    unknown = [
        f"{path.relative_to(ROOT)}: {rule}"
        for path in sorted(SOURCES.rglob("*.py"))
        for rule in DIALECT_RULE_ID.findall(path.read_text(encoding="utf-8"))
        if rule not in defined
    ]
    assert not unknown, "dialect rule ids named in src/domo but not defined:\n" + "\n".join(unknown)


def test_rules_of_planted_bugs_are_defined() -> None:
    """Each mutant of tests/mutants/*.toml names at least one rule, and only defined ones."""
    files = sorted(MUTANTS.glob("*.toml"))
    if not files:
        pytest.skip("no mutant files in tests/mutants")
    defined = set(defined_rules()) | {r for name in DIALECT_SPECS for r in dialect_rules(name)}
    # The specs of the services beside the broker (9/TSP's Titanic, the Binary Star pair):
    # their rule ids are the first column of their tables too.
    for name, pattern in LAYER_SPECS.items():
        text = (ROOT / "specs" / name).read_text(encoding="utf-8")
        defined |= set(re.findall(rf"^\|\s*({pattern})\s*\|", text, re.MULTILINE))
    problems: list[str] = []
    for path in files:
        with path.open("rb") as handle:
            mutants = tomllib.load(handle).get("mutant", [])
        for mutant in mutants:
            where = f"{path.name}: mutant {mutant.get('id', '?')}"
            named = str(mutant.get("rule", ""))
            rules = [
                *RULE_ID.findall(named),
                *DIALECT_RULE_ID.findall(named),
                *LAYER_RULE_ID.findall(named),
            ]
            if not rules:
                problems.append(f"{where} names no rule id")
            problems += [f"{where} names {rule}" for rule in rules if rule not in defined]
    assert not problems, "mutants naming rules the spec does not define:\n" + "\n".join(problems)
