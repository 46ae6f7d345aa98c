"""The planted suite's short form, as CI runs it: the search finds at least 95 % of each dialect's
planted mistakes, each named by its rule, and finds nothing in domo's own broker or peers.

Each plant gets its own broker (or peer) process and a search of a short budget (seed 1, 0.1 s
heartbeat) that stops once it names the planted rule; four searches run at a time
(``tests/fuzz/measure_planted.py``, the same harness as the long form, ``nox -s
fuzz_planted``, 40 s per plant). The budget is short because the search steers to the rules
judged least: most plants are named within a few seconds. Whether each plant changes behaviour
at all is shown by its direct check (``test_planted_brokers.py``, ``test_planted_peers.py``,
and each dialect's own test file, which replays a finding's plan on the unaltered broker).
"""

from __future__ import annotations

import pytest

from .measure_planted import measure, plants

pytestmark = [pytest.mark.io]

BUDGET = 20.0  # seconds per plant at most; the search stops at the planted rule
REQUIRED = 0.95


@pytest.mark.parametrize(
    "dialect", ["mdp02", "mdp01", "majortomo", "emqp", "dcp", "memo01", "peers"]
)
def test_the_search_finds_the_planted_suite(dialect: str) -> None:
    targets = plants((dialect,))
    controls = (
        [("worker", 1, 8.0), ("client", 1, 8.0)] if dialect == "peers" else [(dialect, 1, 8.0)]
    )
    results = measure(targets, seed=1, budget=BUDGET, jobs=4, lanes=6, controls=controls)
    planted = [r for r in results if r["flaw"] != "domo"]
    missed = [(r["flaw"], r["rules"], r["others"][:2]) for r in planted if not r["found"]]
    found = len(planted) - len(missed)
    assert found >= REQUIRED * len(planted), f"{found}/{len(planted)} found; missed: {missed}"
    dirty = [(r["dialect"], r["others"]) for r in results if r["flaw"] == "domo" and r["others"]]
    assert dirty == [], dirty
