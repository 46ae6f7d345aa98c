"""MDP-A-03 (requests served in the order they came) is judged on a loaded machine too.

The order oracle judges two requests only when the first certainly reached the broker before the
second was sent (its arrival plus the slack, which grows with the jitter measured), and a request
dispatched after the other only when that is certain. Under load (issue 28: load average 10-13 on
two cores) the slack outgrew the order motif's fixed waits, so the motif never put two requests in
a certain order and the planted ``newest-first`` broker went unfound in majortomo at 40 s; and a
request served after the other by the same worker, after its FINAL, counted as "later" only past
the slack. Here the jitter meter's floor stands for the load (40 ms: a slack of 0.18 s; the fuzzer
measured 50-200 ms under heavy load, but a higher floor would leave the fuzzer's own workers at
any real hiccup past it, its keep-alive limit shrinking with it), and every variant of the order
motif (requests waiting for a READY, or queued behind a busy worker's FINAL; two or three at once)
must find ``newest-first`` in each dialect, and leave domo's unaltered core clean.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from domo.fuzz import Step
from domo.fuzz.broker_target import BrokerRun, Timing
from domo.fuzz.dialect import Wire
from domo.fuzz.jitter import JitterMeter
from domo.fuzz.plans import _order

from .conftest import INTERVAL, LIVENESS

LOADED_FLOOR = 0.04  # seconds of jitter: a slack of 0.18 s, more than the old waits allowed


def _variants() -> list[tuple[str, list[Step]]]:
    """One plan of each shape the order motif draws (READY or FINAL path, two or three)."""
    found: dict[str, list[Step]] = {}
    for seed in range(200):
        steps = _order(random.Random(seed))
        path = "final" if steps[0].kind == "ready" else "ready"
        shape = f"{path}-{sum(s.kind == 'request' for s in steps)}"
        found.setdefault(shape, steps)
    assert sorted(found) == ["final-3", "final-4", "ready-2", "ready-3"]
    return sorted(found.items())


VARIANTS = _variants()


def _play(endpoint: str, steps: list[Step], dialect: str) -> list[str]:
    timing = Timing(INTERVAL, LIVENESS, JitterMeter(floor=LOADED_FLOOR))
    run = BrokerRun(endpoint, timing, wire=Wire(dialect))
    try:
        run.first_probe()
        return [v.rule for v in run.run(steps)]
    finally:
        run.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dialect", ["mdp02", "mdp01", "majortomo"])
@pytest.mark.parametrize(("shape", "steps"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_order_motif_finds_newest_first_under_load(
    planted: Callable[..., str], dialect: str, shape: str, steps: list[Step]
) -> None:
    endpoint = planted("newest-first", dialect)
    # Twice at most: on a machine loaded past the floor (load 14 with two CPU hogs of other
    # jobs), the settle's 2 s may fall short of the real slack, and the order goes unjudged.
    assert any("MDP-A-03" in _play(endpoint, steps, dialect) for _ in range(2))
    assert _play(planted("none", dialect), steps, dialect) == []


@pytest.mark.timeout(120)
def test_a_disconnect_of_the_holder_judges_redispatch_in_majortomo(
    planted: Callable[..., str],
) -> None:
    """In majortomo a busy worker that goes silent is kept (MAJ-08): only its DISCONNECT loses
    its request, so MDP-S-01 (resent to another worker) is judged only then. The redispatch
    motif's DISCONNECT came from w0 whoever held the request; ``disconnect`` with argument 1 is
    now the holder's, so that the planted ``no-redispatch`` is found however the broker chose
    (missed after 170 and 202 scenarios in majortomo and MDP/0.1, issue 28)."""
    endpoint = planted("no-redispatch", "majortomo")
    steps = [
        Step("ready", 0, 0),
        Step("ready", 1, 0),
        Step("request", 0, 0),
        Step("wait", 0, 1),
        Step("disconnect", 1, 1),  # w1, or the worker holding the request (w0: idle longest)
    ]
    timing = Timing(INTERVAL, LIVENESS)
    run = BrokerRun(endpoint, timing, wire=Wire("majortomo"))
    try:
        run.first_probe()
        assert "MDP-S-01" in [v.rule for v in run.run(steps)]
    finally:
        run.close()
