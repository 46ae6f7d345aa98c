"""Each planted worker and client misbehaves on its own: a short scenario written by hand shows
its flaw, named by the rule it breaks, and the unaltered planted peer passes the same steps (the
direct checks of the planted suite, like ``test_planted_brokers.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from domo.fuzz import FuzzOptions, Replay, Step, replay_file

from .conftest import INTERVAL, LIVENESS

PLANTED = Path(__file__).with_name("planted_peers.py")
S = Step
# "lose" leaves the request unanswered until the client asks again: the planted client's
# timeout is 1 s.

# (role, flaw) -> (rule, steps that show it)
DIRECT: dict[tuple[str, str], tuple[str, list[Step]]] = {
    ("worker", "final-without-request"): ("MDP-R-01", [S("request"), S("wait", 0, 2)]),
    ("worker", "no-heartbeat"): ("MDP-H-04", [S("wait", 0, 4)] * 3),
    ("worker", "ignore-disconnect"): ("MDP-W-17", [S("disconnect"), S("wait", 0, 2)]),
    ("worker", "wrong-address"): ("MDP-R-03", [S("request"), S("wait", 0, 2)]),
    ("worker", "die-on-garbage"): ("MDP-W-08", [S("garbage", 0, 1), S("wait", 0, 2)]),
    ("worker", "ready-twice"): ("MDP-W-10", [S("request"), S("wait", 0, 2)]),
    ("worker", "heartbeat-before-ready"): ("MDP-W-09", [S("wait", 0, 2)]),
    ("worker", "no-reconnect"): ("MDP-W-17", [S("disconnect"), S("wait", 0, 2)]),
    ("worker", "early-give-up"): ("MDP-H-05", [S("silence", 0, 4), S("wait", 0, 2)]),
    ("worker", "never-gives-up"): ("MDP-H-06", [S("silence", 0, 8), S("wait", 0, 2)]),
    ("client", "ignore-service"): ("MDP-D-20", [S("wrong-service", 0, 0), S("wait", 0, 4)]),
    ("client", "partial-is-final"): ("MDP-C-05", [S("partial"), S("wait", 0, 4)]),
    # A provocation the client ignores, then its timeout: the resend comes long after the
    # provocation (later than the client's turnaround), so it is named MDP-C-07, not MDP-D-20.
    ("client", "resend-same-socket"): ("MDP-C-07", [S("wrong-service", 0, 0), S("lose")]),
    ("client", "garbage-is-final"): ("MDP-W-08", [S("garbage", 0, 0), S("wait", 0, 4)]),
    ("client", "request-is-reply"): ("MDP-D-20", [S("garbage", 0, 6), S("wait", 0, 4)]),
    ("client", "no-body-on-retry"): ("MDP-C-01", [S("lose")]),
}


def _replay(role: str, flaw: str, steps: list[Step]) -> list[str]:
    argv = [sys.executable, str(PLANTED), role, flaw, "{endpoint}"]
    if role == "worker":
        argv += [str(INTERVAL), str(LIVENESS)]
    options = FuzzOptions("tcp://127.0.0.1:0", target=role, command=argv)
    replay = Replay(role, INTERVAL, LIVENESS, steps)
    return [v.rule for v in replay_file(options, replay)]


@pytest.mark.parametrize(("role", "flaw"), sorted(DIRECT))
def test_planted_peer_misbehaves(role: str, flaw: str) -> None:
    rule, steps = DIRECT[(role, flaw)]
    assert rule in _replay(role, flaw, steps)
    assert _replay(role, "none", steps) == []
