"""Each planted broker misbehaves on its own: a short scenario written by hand shows its flaw,
named by the rule it breaks, and the unaltered planted broker passes the same steps.

These are the direct checks of the planted suite (``tests/fuzz/planted_broker.py``): a flaw the
search then misses is the search's miss, not a plant that does nothing. The find rate of the
search over the whole suite is measured by ``tests/fuzz/measure_planted.py`` (``nox -s
fuzz_planted``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from domo.fuzz import FuzzOptions, Replay, Step, replay_file

from .conftest import INTERVAL, LIVENESS, PLANTED

S = Step
# flaw -> (rule, steps that show it)
DIRECT: dict[str, tuple[str, list[Step]]] = {
    "drop-partial": ("MDP-R-01", [S("ready"), S("request"), S("wait", 0, 2), S("reply", 0, 1)]),
    "no-redispatch": (
        "MDP-S-01",
        [S("ready"), S("ready", 1), S("request"), S("wait", 0, 2), S("die", 0, 1), S("wait", 0, 8)],
    ),
    "slow-heartbeat": ("MDP-H-04", [S("wait", 0, 2)]),
    "no-dispatch-on-ready": ("MDP-C-10", [S("request"), S("wait", 0, 2), S("ready")]),
    "no-dispatch-on-final": (
        "MDP-A-05",
        [S("ready"), S("request"), S("request", 1), S("wait", 0, 2), S("reply")],
    ),
    "second-request-queued": ("MDP-S-02", [S("ready"), S("ready", 1), S("second-request")]),
    "truncate-body": ("MDP-S-03", [S("ready"), S("request", 0, 4), S("wait", 0, 2)]),
    "strip-empty-frames": (
        "MDP-S-03",
        [S("ready"), S("request"), S("wait", 0, 2), S("reply", 0, 3), S("wait", 0, 2)],
    ),
    "cut-large-body": ("MDP-S-03", [S("ready"), S("request", 0, 8), S("wait", 0, 2)]),
    "no-disconnect-on-unexpected": ("MDP-W-15", [S("ready"), S("unexpected", 0, 2)]),
    "forward-stray-reply": ("MDP-W-15", [S("request"), S("stray-reply", 0, 0), S("wait", 0, 2)]),
    "heartbeat-expired": (
        "MDP-H-07",
        [S("ready"), S("wait", 0, 3), S("die"), S("wait", 0, 8), S("wait", 0, 4)],
    ),
    "mmi-404-for-busy": (
        "MDP-M-01",
        [S("ready"), S("request"), S("wait", 0, 6), S("wait", 0, 4), S("mmi", 1, 0)],
    ),
    "mmi-unknown-404": ("MDP-M-02", [S("mmi", 0, 3), S("wait", 0, 2)]),
    "register-mmi-ready": ("MDP-D-14", [S("ready", 0, 2), S("wait", 0, 8)]),
    "busy-dispatch": (
        "MDP-A-06",
        [S("ready"), S("request"), S("request", 1), S("wait", 0, 2)],
    ),
    "late-final": (
        "MDP-D-10",
        [S("ready"), S("request"), S("die"), S("wait", 0, 6), S("late-final"), S("wait", 0, 2)],
    ),
    "ignore-disconnect": (
        "MDP-W-13",
        [S("ready", 0, 1), S("wait", 0, 3), S("disconnect"), S("wait", 0, 4)],
    ),
    "no-heartbeat": ("MDP-H-04", [S("ready"), S("wait", 0, 8)]),
    "early-expiry": ("MDP-H-05", [S("ready"), S("pause", 0, 4), S("wait", 0, 6)]),
    "die-on-garbage": ("MDP-W-16", [S("garbage", 0, 1)]),
    "mmi-stale-200": ("MDP-M-01", [S("ready"), S("wait", 0, 3), S("disconnect"), S("mmi", 1, 0)]),
    "disconnect-answers-disconnect": (
        "MDP-W-13",
        [S("ready"), S("wait", 0, 1), S("disconnect"), S("wait", 0, 4)],
    ),
    "newest-first": (
        "MDP-A-03",
        [S("request"), S("wait", 0, 6), S("request", 1), S("wait", 0, 2), S("ready")],
    ),
    "no-heartbeat-busy": ("MDP-H-04", [S("ready"), S("request"), S("wait", 0, 6), S("wait", 0, 4)]),
    "reply-to-other-client": (
        "MDP-R-03",
        [
            S("ready"),
            S("request"),
            S("request", 1),
            S("wait", 0, 2),
            S("reply"),
            S("wait", 0, 2),
            S("reply"),
            S("wait", 0, 2),
        ],
    ),
    "partial-as-final": ("MDP-R-01", [S("ready"), S("request"), S("wait", 0, 2), S("reply", 0, 1)]),
    "redispatch-after-partial": (
        "MDP-D-09",
        [
            S("ready"),
            S("ready", 1),
            S("request"),
            S("wait", 0, 2),
            S("partial"),
            S("wait", 0, 2),
            S("die", 0, 1),
            S("wait", 0, 8),
        ],
    ),
    "ready-again-ignored": ("MDP-W-10", [S("ready"), S("unexpected", 0, 0), S("wait", 0, 8)]),
    "heartbeat-first-ignored": ("MDP-H-01", [S("unexpected", 0, 3), S("wait", 0, 8)]),
}
# The plants that are no flaw in MDP/0.1, so not in its set: those that need a PARTIAL from a
# worker (MDP/0.1's workers have none), and a second REQUEST on one socket served as well, which
# MDP/0.1 asks for (MDP01-09: a DEALER client may have several outstanding).
PARTIAL_PLANTS = ("drop-partial", "partial-as-final", "redispatch-after-partial")
NOT_MDP01_PLANTS = (*PARTIAL_PLANTS, "second-request-queued")
# Plants of a dialect's framing (planted_broker.py DIALECT): flaw -> (dialect, rule, steps).
DIALECT_DIRECT: dict[str, tuple[str, str, list[Step]]] = {
    "mdp01-heartbeat-no-delimiter": ("mdp01", "MDP01-02", [S("ready"), S("wait", 0, 4)]),
    "mdp01-reply-in-mdp02": (
        "mdp01",
        "MDP01-03",
        [S("ready"), S("request"), S("wait", 0, 2), S("reply"), S("wait", 0, 2)],
    ),
    "maj-final-with-service": (
        "majortomo",
        "MAJ-04",
        [S("ready"), S("request"), S("wait", 0, 2), S("reply"), S("wait", 0, 2)],
    ),
    "maj-request-without-delimiter": (
        "majortomo",
        "MAJ-01",
        [S("ready"), S("request"), S("wait", 0, 2)],
    ),
}


def plants(dialect: str) -> dict[str, tuple[str, list[Step]]]:
    """The planted set of ``dialect``: flaw -> (rule, steps that show it)."""
    found = {f: v for f, v in DIRECT.items() if dialect != "mdp01" or f not in NOT_MDP01_PLANTS}
    found.update({f: (r, steps) for f, (d, r, steps) in DIALECT_DIRECT.items() if d == dialect})
    return found


def _replay(endpoint: str, steps: list[Step], dialect: str = "mdp02") -> list[str]:
    replay = Replay("broker", INTERVAL, LIVENESS, steps, dialect=dialect)
    return [v.rule for v in replay_file(FuzzOptions(endpoint), replay)]


@pytest.fixture(scope="module")
def unaltered() -> Iterator[Callable[[str], str]]:
    """The planted broker with no flaw, one per dialect for the module (each replay uses
    names of its own, so the controls share it)."""
    started: dict[str, subprocess.Popen[str]] = {}
    endpoints: dict[str, str] = {}

    def endpoint(dialect: str) -> str:
        if dialect not in started:
            argv = [sys.executable, str(PLANTED), "none", str(INTERVAL), str(LIVENESS), dialect]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            started[dialect] = proc
            assert proc.stdout is not None
            endpoints[dialect] = proc.stdout.readline().split()[-1]
        return endpoints[dialect]

    yield endpoint
    for proc in started.values():
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("flaw", sorted(DIRECT))
def test_planted_broker_misbehaves(
    planted: Callable[[str], str], unaltered: Callable[[str], str], flaw: str
) -> None:
    rule, steps = DIRECT[flaw]
    assert rule in _replay(planted(flaw), steps)
    assert _replay(unaltered("mdp02"), steps) == []


@pytest.mark.parametrize("flaw", sorted(DIALECT_DIRECT))
def test_planted_dialect_broker_misbehaves(
    planted: Callable[..., str], unaltered: Callable[[str], str], flaw: str
) -> None:
    dialect, rule, steps = DIALECT_DIRECT[flaw]
    assert rule in _replay(planted(flaw, dialect), steps, dialect)
    assert _replay(unaltered(dialect), steps, dialect) == []
