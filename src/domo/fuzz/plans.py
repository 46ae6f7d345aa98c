"""What the broker fuzzer plays next: random scenarios, and short ones aimed at the rules judged
least.

:class:`BrokerPlanner` is the MDP broker target's :class:`domo.fuzz.engine.Planner`. Most rules
need a particular run of events before a check has anything to judge: a request held by one of
two workers when it dies (MDP-S-01), two requests of different clients queued before a worker
comes (MDP-A-03), ``mmi.service`` for a service that has just lost its last worker (MDP-M-01), a
reply naming another client (MDP-D-13). A random list of steps meets such a run rarely, so each
rule family has *motifs*, short step lists that reach it (written from the spec's rules and
transition tables, not from any broker's code), and the planner draws the motif whose rules
have been judged least so far, with random steps before or after it; one scenario in three is
wholly random, for what no motif foresees. Actors, services and bodies of a motif vary per draw.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .scenario import (
    BODIES,
    GARBAGE,
    MMI_QUERIES,
    REPLY_BODIES,
    SERVICES,
    STRAY_REPLIES,
    Step,
    random_step,
)

__all__ = ["BROKER_RULES", "MOTIFS", "BrokerPlanner"]

# Every rule the broker target judges (besides MDP-A-04 with --dispatch lru, and the dialect's
# frame rules); docs/fuzz.md lists the others with why they are not judged.
BROKER_RULES: Final = (
    "MDP-A-01",
    "MDP-A-03",
    "MDP-A-05",
    "MDP-A-06",
    "MDP-C-02",
    "MDP-C-03",
    "MDP-C-06",
    "MDP-C-09",
    "MDP-C-10",
    "MDP-D-09",
    "MDP-D-10",
    "MDP-D-12",
    "MDP-D-13",
    "MDP-D-14",
    "MDP-H-01",
    "MDP-H-04",
    "MDP-H-05",
    "MDP-H-07",
    "MDP-M-01",
    "MDP-M-02",
    "MDP-R-01",
    "MDP-R-02",
    "MDP-R-03",
    "MDP-S-01",
    "MDP-S-02",
    "MDP-S-03",
    "MDP-W-02",
    "MDP-W-05",
    "MDP-W-06",
    "MDP-W-08",
    "MDP-W-10",
    "MDP-W-13",
    "MDP-W-14",
    "MDP-W-15",
    "MDP-W-16",
)
MMI_RULES: Final = ("MDP-M-01", "MDP-M-02", "MDP-D-14")

S = Step


@dataclass(frozen=True)
class Motif:
    """A short run of steps that gives ``rules`` something to judge."""

    name: str
    rules: tuple[str, ...]
    build: Callable[[random.Random], list[Step]]


def _w(rng: random.Random) -> int:
    return rng.randrange(2)


def _reply(rng: random.Random) -> list[Step]:
    body = rng.randrange(len(BODIES))
    return [
        S("ready", 0, 0),
        S("request", rng.randrange(2), SERVICES * body),
        S("wait", 0, rng.randint(1, 2)),
        S("reply", 0, rng.randrange(3 * len(REPLY_BODIES))),
        S("wait", 0, 2),
    ]


def _redispatch(rng: random.Random) -> list[Step]:
    # READY w0, READY w1, REQUEST, the holder dies (or leaves), wait: MDP-S-01.
    # The holder dies (in MDP/0.1 and majortomo a busy worker that goes silent is not lost:
    # MDP01-12, MAJ-08), or leaves with DISCONNECT (w0, the first registered, is usually it).
    # The holder leaves in a third of the draws: in MDP/0.1 and majortomo that is the only loss
    # judged, and a DISCONNECT from the idle worker (as before) lost nothing.
    loss = rng.choice((S("die", 0, 1), S("late-final", 0, 0), S("disconnect", 0, 1)))
    return [S("ready", 0, 0), S("ready", 1, 0), S("request", _w(rng), 0), S("wait", 0, 1), loss]


def _after_partial(rng: random.Random) -> list[Step]:
    # A PARTIAL reaches the client, then the holder dies: not dispatched again (MDP-D-09).
    return [
        S("ready", 0, 0),
        S("ready", 1, 0),
        S("request", 0, 0),
        S("wait", 0, 1),
        S("partial", 0, 0),
        S("wait", 0, 1),
        # Dies, or leaves (a busy MDP/0.1 or majortomo worker that goes silent is not lost).
        rng.choice((S("die", 0, 1), S("disconnect", 0, 1))),
    ]


def _mmi_lost(rng: random.Random) -> list[Step]:
    # The service's only worker leaves or dies, then mmi.service for it: 404 (MDP-M-01).
    loss = rng.choice((S("disconnect", 0, 0), S("die", 0, 0), S("garbage", 0, 1)))
    return [S("ready", 0, 0), S("wait", 0, 3), loss, S("mmi", 1, 0)]


def _mmi(rng: random.Random) -> list[Step]:
    return [
        S("ready", 0, 0),
        S("request", 0, 0),
        S("wait", 0, 1),
        S("mmi", 1, rng.randrange(len(MMI_QUERIES))),
        S("wait", 0, 2),
    ]


def _order(rng: random.Random) -> list[Step]:
    # Requests of one service queued in a certain order (each sent once the ones before it have
    # certainly reached the broker: ``settle``, which waits as long as the load needs), then a
    # worker takes them one by one: served in the order they came (MDP-A-03). A broker may pick
    # the next request in more than one place, so each is reached: the requests wait for a
    # worker's READY, or queue behind a busy worker and wait for its FINAL; and two or three
    # wait at once (the third a client's ask again on a new socket, its old request still
    # queued), so that an order wrong only past the first pick (the oldest, then the newest) or
    # by client name shows too.
    a, b = (0, 1) if rng.random() < 0.5 else (1, 0)
    third = [S("request", a, 0), S("settle")] if rng.random() < 0.5 else []
    serve = [S("wait", 0, 2), S("reply", 0, 0)] * (2 + len(third) // 2)
    if rng.random() < 0.5:
        # Queued while no worker serves the service: the READY picks them up.
        queued = [S("request", a, 0), S("settle"), S("request", b, 0), S("settle"), *third]
        return [*queued, S("ready", 0, 0), *serve, S("wait", 0, 2)]
    # Queued behind a busy worker: its FINAL picks the next one up.
    busy = [S("ready", 0, 0), S("request", b, 0), S("wait", 0, 2)]
    queued = [S("request", a, 0), S("settle"), S("request", b, 0), S("settle"), *third]
    return [*busy, *queued, *serve, S("wait", 0, 2), S("reply", 0, 0), S("wait", 0, 2)]


def _on_final(rng: random.Random) -> list[Step]:
    # A busy worker's FINAL picks the next queued request up (MDP-A-05).
    return [
        S("ready", 0, 0),
        S("request", 0, 0),
        S("wait", 0, 1),
        S("request", 1, 0),
        S("wait", 0, 1),
        S("reply", 0, 0),
        S("wait", 0, 2),
    ]


def _on_ready(rng: random.Random) -> list[Step]:
    return [S("request", _w(rng), 0), S("wait", 0, rng.randint(1, 3)), S("ready", 0, 0)]


def _busy(rng: random.Random) -> list[Step]:
    # A worker holds a request for longer than the liveness span: heartbeats go on (MDP-H-04).
    return [S("ready", 0, 0), S("request", 0, 0), S("wait", 0, 6), S("wait", 0, 4)]


def _idle(rng: random.Random) -> list[Step]:
    return [S("ready", _w(rng), rng.randrange(SERVICES)), S("wait", 0, 6), S("wait", 0, 4)]


def _pause(rng: random.Random) -> list[Step]:
    # Heartbeats skipped short of the liveness span: still alive (MDP-H-05).
    first = [S("ready", 0, 0)] + ([S("request", 0, 0)] if rng.random() < 0.5 else [])
    return [*first, S("wait", 0, 1), S("pause", 0, 4), S("wait", 0, 6), S("reply", 0, 0)]


def _dead(rng: random.Random) -> list[Step]:
    return [S("ready", 0, 0), S("wait", 0, 3), S("die", 0, 0), S("wait", 0, 8), S("wait", 0, 4)]


def _disconnect(rng: random.Random) -> list[Step]:
    # A wait first: what comes after a DISCONNECT is judged once the broker has answered the
    # worker's socket (its connection is up).
    held = [S("request", 0, 0)] if rng.random() < 0.5 else []
    return [S("ready", 0, 0), *held, S("wait", 0, 3), S("disconnect", 0, 0), S("wait", 0, 4)]


def _unexpected(which: int) -> Callable[[random.Random], list[Step]]:
    def build(rng: random.Random) -> list[Step]:
        held = [S("request", 0, 0), S("wait", 0, 1)] if which == 0 and rng.random() < 0.5 else []
        return [S("ready", 0, 0), *held, S("unexpected", 0, which), S("wait", 0, 8)]

    return build


def _stray(which: int) -> Callable[[random.Random], list[Step]]:
    def build(rng: random.Random) -> list[Step]:
        if which in (0, 1):
            return [
                S("request", 0, 0),
                S("wait", 0, 2),
                S("stray-reply", 1, which),
                S("wait", 0, 8),
            ]
        return [
            S("ready", 0, 0),
            S("request", 0, 0),
            S("request", 1, 0),
            S("wait", 0, 2),
            S("stray-reply", 0, which),
            S("wait", 0, 8),
        ]

    return build


def _late(rng: random.Random) -> list[Step]:
    return [S("ready", 0, 0), S("request", 0, 0), S("wait", 0, 1), S("late-final", 0, 0)]


def _second(rng: random.Random) -> list[Step]:
    # Two REQUESTs on one socket, then a worker: the first stands (MDP-D-12). Then that worker
    # replies, so that a broker that queued the second too hands it on (MDP-S-02: both
    # dispatched); without the reply a broker that kept both shows nothing while one worker is
    # busy with the first.
    busy = [S("ready", 0, 0), S("request", 1, 0), S("wait", 0, 1)] if rng.random() < 0.5 else []
    return [
        *busy,
        S("second-request", 0, 0),
        S("wait", 0, 2),
        S("ready", 1, 0),
        S("wait", 0, 3),
        S("reply", 1, 0),
        S("wait", 0, 3),
    ]


def _garbage(rng: random.Random) -> list[Step]:
    return [S("ready", 0, 0), S("garbage", 0, rng.randrange(len(GARBAGE))), S("wait", 0, 2)]


def _mmi_ready(rng: random.Random) -> list[Step]:
    return [S("ready", 0, SERVICES), S("wait", 0, 8)]


def _bodies(rng: random.Random) -> list[Step]:
    body = rng.randrange(1, len(BODIES))
    return [
        S("ready", 0, 0),
        S("request", 0, SERVICES * body),
        S("wait", 0, 1),
        S("reply", 0, 3 * rng.randrange(len(REPLY_BODIES)) + rng.randrange(3)),
        S("wait", 0, 2),
    ]


MOTIFS: Final = (
    Motif("reply", ("MDP-R-01", "MDP-C-06", "MDP-C-02", "MDP-C-03", "MAJ-03"), _reply),
    Motif("redispatch", ("MDP-S-01", "MDP-A-06"), _redispatch),
    Motif("after-partial", ("MDP-D-09",), _after_partial),
    Motif("mmi-lost", ("MDP-M-01",), _mmi_lost),
    Motif("mmi", ("MDP-M-01", "MDP-M-02"), _mmi),
    Motif("order", ("MDP-A-03",), _order),
    Motif("on-final", ("MDP-A-05",), _on_final),
    Motif("on-ready", ("MDP-C-10",), _on_ready),
    Motif("busy", ("MDP-H-04", "MDP-W-02", "MDP-R-02", "MDP-R-03", "MDP-C-09"), _busy),
    Motif("idle", ("MDP-H-04", "MDP-W-05"), _idle),
    Motif("pause", ("MDP-H-05",), _pause),
    Motif("dead", ("MDP-H-07",), _dead),
    Motif("disconnect", ("MDP-W-13",), _disconnect),
    Motif("ready-again", ("MDP-W-10",), _unexpected(0)),
    Motif("final-idle", ("MDP-W-15",), _unexpected(1)),
    Motif("request-from-worker", ("MDP-W-15",), _unexpected(2)),
    Motif("heartbeat-first", ("MDP-H-01", "MDP-W-06", "MDP-W-14"), _unexpected(3)),
    *(
        Motif(
            f"stray-{i}",
            ("MDP-W-15", "MDP-D-13", "MDP-D-10")[min(i // 2, 2) : min(i // 2, 2) + 1],
            _stray(i),
        )
        for i in range(len(STRAY_REPLIES))
    ),
    Motif("late-final", ("MDP-D-10",), _late),
    Motif("second-request", ("MDP-S-02", "MDP-D-12"), _second),
    Motif("garbage", ("MDP-W-16", "MDP-A-01"), _garbage),
    Motif("mmi-ready", ("MDP-D-14",), _mmi_ready),
    Motif("bodies", ("MDP-S-03",), _bodies),
)


def _swap(step: Step, workers: bool, clients: bool, service: bool) -> Step:
    """The same step with the two workers, clients or services exchanged."""
    actor, arg = step.actor, step.arg
    if step.kind in ("request", "wait", "mmi", "second-request"):
        if clients and step.kind != "wait":
            actor = 1 - actor
    elif workers:
        actor = 1 - actor
    flips = step.kind in ("ready", "request", "second-request") and arg % SERVICES < 2
    if service and flips and not (step.kind == "ready" and arg == SERVICES):
        arg = arg - arg % SERVICES + (1 - arg % SERVICES)
    return Step(step.kind, actor, arg)


class BrokerPlanner:
    """Plans for the MDP broker target: motifs for the rules judged least, and random ones."""

    death_rule = "MDP-A-01"

    def __init__(
        self, rules: Sequence[str], max_steps: int = 12, mmi: bool = True, partials: bool = True
    ) -> None:
        self.rules = tuple(rules)
        self.max_steps = max_steps
        judged = set(self.rules)
        self.motifs = [
            m
            for m in MOTIFS
            if any(rule in judged for rule in m.rules)
            and (mmi or not set(m.rules) <= set(MMI_RULES))
            and (partials or m.name != "after-partial")
        ]
        self.mmi = mmi

    def draw(self, rng: random.Random, judged: Mapping[str, int]) -> tuple[Step, ...]:
        if rng.random() < 1 / 3 or not self.motifs:
            n = rng.randint(min(3, self.max_steps), self.max_steps)
            return tuple(random_step(rng) for _ in range(n))

        # The motif for the rules judged least: ties broken at random, the counts smoothed so
        # that every motif still comes up now and then.
        def need(m: Motif) -> float:
            counts = [judged.get(rule, 0) for rule in m.rules if rule in self.rules]
            return min(counts, default=0) + rng.random() * 2

        motif = min(self.motifs, key=need)
        steps = motif.build(rng)
        swap = (rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.3)
        steps = [_swap(s, *swap) for s in steps]
        room = max(0, self.max_steps - len(steps))
        before = [random_step(rng) for _ in range(rng.randint(0, min(1, room)))]
        after = [random_step(rng) for _ in range(rng.randint(0, max(0, room - len(before))) // 2)]
        plan = tuple([*before, *steps, *after][: max(self.max_steps, len(steps))])
        if not self.mmi:
            plan = tuple(
                s for s in plan if s.kind != "mmi" and not (s.kind == "ready" and s.arg == SERVICES)
            )
        return plan

    def simpler(self, step: object) -> Sequence[Step]:
        """Simpler forms of one step, for shrinking: shorter waits, the plainest bodies."""
        if not isinstance(step, Step):
            return []
        found: list[Step] = []
        if step.kind in ("wait", "pause") and step.arg > 1:
            found += [
                Step(step.kind, step.actor, a) for a in sorted({1, step.arg // 2}) if a < step.arg
            ]
        elif step.kind == "request" and step.arg >= SERVICES:
            found.append(Step("request", step.actor, step.arg % SERVICES))
        elif step.kind == "reply" and step.arg > 0:
            found.append(Step("reply", step.actor, 0))
        if step.actor != 0 and step.kind not in ("wait",):
            found.append(Step(step.kind, 0, step.arg))
        return found
