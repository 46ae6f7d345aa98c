"""Two Binary Star machines on a simulated network, in virtual time: whatever the freezes,
kills and clients, at no instant do both serve (BSTAR-10, BSTAR-11, BSTAR-12).

Each node ticks every heartbeat and publishes its state; a state message reaches the other node
``delay`` later and only the newest waits in its inbox (the runtime's CONFLATE). A frozen node
(SIGSTOP) handles nothing until it resumes; a killed node handles nothing and comes back as a
fresh machine. After every input a node handles, its ``serving`` is sampled; a frozen or dead
node serves nobody. The serving intervals of the two nodes must not overlap, and once every
disturbance is over, exactly one node serves.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from domo.binarystar.fsm import PairConfig, PairMachine, Role, decode_state

HEARTBEAT = 1.0


@dataclass
class Node:
    role: Role
    machine: PairMachine
    down_until: float = -1.0  # frozen or dead until then
    dead: bool = False
    disturbance: int = -1  # the freeze or kill in force (its resume ends it), -1: none
    inbox: tuple[float, list[bytes]] | None = None  # (arrives at, newest state message)
    samples: list[tuple[float, bool]] = field(default_factory=list)
    admitted: int = 0

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def sample(self, now: float) -> None:
        self.samples.append((now, self.machine.serving))


def serving_intervals(samples: list[tuple[float, bool]], end: float) -> list[tuple[float, float]]:
    intervals, since = [], None
    for at, serving in sorted(samples, key=lambda s: s[0]):
        if serving and since is None:
            since = at
        elif not serving and since is not None:
            if at > since:
                intervals.append((since, at))
            since = None
    if since is not None and end > since:
        intervals.append((since, end))
    return intervals


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


Action = tuple[str, int, float]  # (kind, node, amount)

ACTIONS = st.one_of(
    st.tuples(st.just("client"), st.integers(0, 1), st.sampled_from([0.05, 0.25, 0.5, 1.0])),
    st.tuples(st.just("freeze"), st.integers(0, 1), st.sampled_from([0.5, 1.5, 2.0, 2.5, 4.0])),
    st.tuples(st.just("kill"), st.integers(0, 1), st.sampled_from([1.0, 3.0, 6.0])),
    st.tuples(st.just("wait"), st.integers(0, 1), st.sampled_from([0.25, 1.0, 3.0])),
)


def simulate(
    actions: list[Action], delay: float, roles: tuple[Role, Role] = (Role.PRIMARY, Role.BACKUP)
) -> tuple[list[Node], float]:
    """Run the pair through ``actions``; the nodes (with their samples) and the end time."""
    config = {role: PairConfig(role, heartbeat=HEARTBEAT) for role in Role}
    nodes = [Node(role, PairMachine(config[role], 0.0)) for role in roles]
    events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, node, disturbance)
    seq = itertools.count()

    def schedule(at: float, kind: str, index: int, disturbance: int = -1) -> None:
        heapq.heappush(events, (at, next(seq), kind, index, disturbance))

    now = 0.0
    for index in (0, 1):
        schedule(0.0, "tick", index)
    last_resume = 0.0
    for number, (kind, index, amount) in enumerate(actions):  # they overlap in time
        now += amount if kind in ("client", "wait") else 0.1
        if kind == "client":
            schedule(now, "client", index)
            schedule(now, "client", 1 - index)  # a client tries one broker, then the other
        elif kind in ("freeze", "kill"):
            schedule(now, kind, index, number)
            schedule(now + amount, "resume", index, number)
            last_resume = max(last_resume, now + amount)
    end = max(now, last_resume) + 10 * HEARTBEAT  # then quiet time: the pair must settle
    for at in (end - 2 * HEARTBEAT, end - HEARTBEAT):
        schedule(at, "client", 0)
        schedule(at, "client", 1)

    for _ in range(100_000):  # bounded: every event is finite and ticks stop at ``end``
        if not events:
            break
        at, _, kind, index, disturbance = heapq.heappop(events)
        node, other = nodes[index], nodes[1 - index]
        if kind in ("freeze", "kill"):
            if node.disturbance != -1:
                continue  # already stopped or dead: this one does nothing
            node.disturbance = disturbance
            node.samples.append((at, False))  # a stopped or dead process serves nobody
            node.dead = kind == "kill"
            node.down_until = at + 1e9
            continue
        if kind == "resume":
            if disturbance != node.disturbance:
                continue
            node.disturbance = -1
            node.down_until = at
            if node.dead:  # back as a fresh process
                node.dead = False
                node.inbox = None
                node.machine = PairMachine(config[node.role], at)
            schedule(at, "tick", index)
            continue
        if not node.up(at):
            if kind == "tick":
                continue  # the resume schedules the next tick
            if kind == "deliver":
                continue  # it waits in the inbox
            continue  # a client of a stopped broker times out and tries the other
        machine = node.machine
        if node.inbox is not None and node.inbox[0] <= at:
            _, frames = node.inbox
            node.inbox = None
            decoded = decode_state(frames)
            assert decoded is not None
            machine.peer_state(*decoded, max(at, machine.now))
            node.sample(machine.now)
        if kind == "tick":
            if machine.tick(at) and not other.dead:
                other.inbox = (at + delay, machine.message())  # conflated: newest only
                schedule(at + delay, "deliver", 1 - index)
            node.sample(at)
            if at < end:
                schedule(machine.next_deadline(), "tick", index)
        elif kind == "client":
            if machine.client_request(at):
                node.admitted += 1
            node.sample(at)
        elif kind == "deliver":
            node.sample(at)
    return nodes, end


# A primary stopped just before its tick for 1.5 heartbeats, with a client just before the stop:
# the backup takes over meanwhile. Counting the gap from the last input (the first version of
# BSTAR-12) missed it and both served for 0.7 s; counted from the last state sent, it is seen.
STOPPED_BEFORE_ITS_TICK = [
    ("wait", 0, 3.0), ("client", 0, 0.5), ("client", 0, 0.25), ("freeze", 0, 1.5),
    ("client", 1, 1.0), ("client", 1, 0.25), ("client", 1, 0.05),
]  # fmt: skip


@settings(max_examples=200, deadline=None)
@example(STOPPED_BEFORE_ITS_TICK, 0.05)
@given(st.lists(ACTIONS, max_size=12), st.sampled_from([0.0, 0.05, 0.2, 0.45]))
def test_at_no_instant_do_both_serve(actions: list[Action], delay: float) -> None:
    """BSTAR-10, BSTAR-11, BSTAR-12: the split-brain rule holds in every run."""
    nodes, end = simulate(actions, delay)
    primary, backup = (serving_intervals(node.samples, end) for node in nodes)
    assert overlap(primary, backup) == 0.0, (primary, backup)
    # Once all is quiet, one of them serves: the clients at the end were served.
    assert nodes[0].machine.serving != nodes[1].machine.serving
    assert any(node.admitted for node in nodes)


def test_the_model_can_see_both_serving() -> None:
    """The check can fail: two primaries that never hear each other both serve."""
    roles = (Role.PRIMARY, Role.PRIMARY)
    nodes, end = simulate([("client", 0, 3.0), ("client", 1, 0.1)], delay=1e9, roles=roles)
    primary, backup = (serving_intervals(node.samples, end) for node in nodes)
    assert overlap(primary, backup) > 0
