"""``WorkerSession`` (the worker's side of MDP/0.2) against ``specs/mdp-0.2.md``.

Two parts, in the manner of h2's ``tests/test_state_machines.py``:

1. The table test: every (state, input) pair of ``WORKER_SESSION_TRANSITIONS``, reached from
   several starting points. The expected outcome of each cell is written out below, from the
   spec, independently of the code's table: the new state, the whole outbox (exact frames), the
   events and the next deadline. A refused cell (local misuse) must raise ``LocalProtocolError``
   and change nothing, which is checked against a twin session that was not called at all.
2. Scenarios, one per rule: READY once per socket, heartbeat timing to the exact boundary, broker
   loss at exactly ``last_heard + liveness * interval``, DISCONNECT obeyed, backoff, unexpected
   commands, close while busy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import product

import pytest

from domo.protocol import LocalProtocolError, WorkerConfig, WorkerSession, WorkerState
from domo.protocol.events import (
    MessageDropped,
    ProtocolViolation,
    ReconnectRequired,
    RequestAbandoned,
    RequestReceived,
    WorkerConnected,
    WorkerEvent,
)
from domo.protocol.mdp import Frames
from domo.protocol.worker import WORKER_SESSION_TRANSITIONS, WorkerSessionInput

from .mdp_strategies import fresh

S = WorkerState
In = WorkerSessionInput

CONFIG = WorkerConfig(heartbeat_interval=1.0, liveness=3, reconnect_initial=0.25, reconnect_max=2.0)
INTERVAL = CONFIG.heartbeat_interval
SPAN = CONFIG.liveness * CONFIG.heartbeat_interval  # broker silence that means it is lost
SERVICE = b"echo"
CLIENT = b"\x00client-1"  # the client of the request a busy start is working on
NEW_CLIENT = b"\x00client-2"  # the client of the REQUEST the table test sends
BODY = (fresh(b"request body"), fresh(b"second frame"))
REPLY = (fresh(b"reply body"),)
T0 = 10.0

# The frames, written out (RFC 18 frame tables).
READY = (b"MDPW02", b"\x01", b"echo")
HEARTBEAT = (b"MDPW02", b"\x05")
DISCONNECT = (b"MDPW02", b"\x06")


def request(client: bytes, body: Frames = BODY) -> Frames:
    """A broker REQUEST (MDP-W-02)."""
    return (b"MDPW02", b"\x02", client, b"", *body)


def partial(client: bytes, body: Frames = REPLY) -> Frames:
    """A worker PARTIAL (MDP-W-03)."""
    return (b"MDPW02", b"\x03", client, b"", *body)


def final(client: bytes, body: Frames = REPLY) -> Frames:
    """A worker FINAL (MDP-W-04)."""
    return (b"MDPW02", b"\x04", client, b"", *body)


def normalized(events: list[WorkerEvent]) -> list[WorkerEvent]:
    """Events with free-text reasons blanked (after checking there is one): wording may change."""
    out: list[WorkerEvent] = []
    for event in events:
        if isinstance(event, ProtocolViolation | MessageDropped):
            assert event.reason, event
            event = replace(event, reason="")
        out.append(event)
    return out


def observe(session: WorkerSession) -> tuple[object, ...]:
    """Everything a runtime can see of a session; drains its outbox."""
    return (
        session.state,
        session.now,
        session.next_deadline(),
        session.broker_expires_at,
        session.reconnect_at,
        session.current_client,
        session.current_request,
        session.take_outgoing(),
    )


def follow_up(session: WorkerSession) -> tuple[object, ...]:
    """Drive a session through its next deadlines (heartbeats, broker loss, reconnection with
    its backoff) and observe it at each: tells apart hidden state too."""
    seen: list[object] = []
    for _ in range(2 * CONFIG.liveness + 2):
        deadline = session.next_deadline()
        if deadline is None or math.isinf(deadline):
            later = session.now + 0.125 if not math.isinf(session.now) else T0
        else:
            later = max(deadline, session.now)
        if session.state is S.DISCONNECTED:
            seen.append(normalized(session.connected(later)))
        else:
            seen.append(normalized(session.tick(later)))
        seen.append(observe(session))
    seen.append(normalized(session.receive(HEARTBEAT, session.now)))
    seen.append(observe(session))
    return tuple(seen)


def assert_refused(
    make: Callable[[], WorkerSession], call: Callable[[WorkerSession], object]
) -> None:
    """``call`` raises LocalProtocolError and leaves the session exactly like an untouched twin."""
    session, twin = make(), make()
    with pytest.raises(LocalProtocolError):
        call(session)
    assert observe(session) == observe(twin)
    assert follow_up(session) == follow_up(twin)


# --- starting points --------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """A way into a state, and what the session looks like there."""

    name: str
    state: WorkerState
    steps: Callable[[WorkerSession], object]
    outbox: list[Frames]  # left in the outbox (not drained) when the input arrives
    at: float  # when the table test applies its input (no timer is due then)
    last_sent: float = math.nan
    last_heard: float = math.nan
    reconnect_at: float = -math.inf
    client: bytes | None = None
    requests: int = 0

    def make(self) -> WorkerSession:
        """A fresh session driven to this start."""
        session = WorkerSession(SERVICE, CONFIG)
        self.steps(session)
        assert session.state is self.state
        return session


def _connect(s: WorkerSession) -> None:
    s.connected(T0)


def _after_broker_disconnect(s: WorkerSession) -> None:
    s.connected(T0)
    s.receive(DISCONNECT, T0 + 0.5)


def _after_violation(s: WorkerSession) -> None:
    s.connected(T0)
    s.receive(READY, T0 + 0.5)  # a READY from the broker: DISCONNECT queued, then reconnect


def _busy(s: WorkerSession) -> None:
    s.connected(T0)
    s.receive(request(CLIENT), T0 + 0.25)


def _busy_after_partial(s: WorkerSession) -> None:
    _busy(s)
    s.send_partial(REPLY, T0 + 0.5)


def _idle_after_final(s: WorkerSession) -> None:
    _busy(s)
    s.send_final(REPLY, T0 + 0.5)


def _closed(s: WorkerSession) -> None:
    s.connected(T0)
    s.disconnect(T0 + 0.25)


def _closed_unconnected(s: WorkerSession) -> None:
    s.disconnect(T0)


STARTS = [
    Start("fresh", S.DISCONNECTED, lambda s: None, [], T0),
    Start(
        "after-broker-disconnect",
        S.DISCONNECTED,
        _after_broker_disconnect,
        [],
        T0 + 1.0,
        reconnect_at=T0 + 0.75,
    ),
    Start(
        "after-violation",
        S.DISCONNECTED,
        _after_violation,
        [DISCONNECT],
        T0 + 1.0,
        reconnect_at=T0 + 0.75,
    ),
    Start("idle", S.IDLE, _connect, [READY], T0 + 0.5, last_sent=T0, last_heard=T0),
    Start(
        "idle-after-final",
        S.IDLE,
        _idle_after_final,
        [READY, final(CLIENT)],
        T0 + 0.75,
        last_sent=T0 + 0.5,
        last_heard=T0 + 0.25,
        requests=1,
    ),
    Start(
        "busy",
        S.BUSY,
        _busy,
        [READY],
        T0 + 0.5,
        last_sent=T0,
        last_heard=T0 + 0.25,
        client=CLIENT,
        requests=1,
    ),
    Start(
        "busy-after-partial",
        S.BUSY,
        _busy_after_partial,
        [READY, partial(CLIENT)],
        T0 + 0.75,
        last_sent=T0 + 0.5,
        last_heard=T0 + 0.25,
        client=CLIENT,
        requests=1,
    ),
    Start("closed", S.CLOSED, _closed, [READY, DISCONNECT], T0 + 0.5),
    Start("closed-unconnected", S.CLOSED, _closed_unconnected, [], T0 + 0.5),
]

# --- inputs and their variants ----------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One concrete stimulus for an input: the frames received and, if malformed, its rule."""

    name: str
    frames: Frames = ()
    rule: str = ""


UNEXPECTED_VARIANTS = [
    Variant("READY", READY),
    Variant("PARTIAL", partial(CLIENT)),
    Variant("FINAL", final(CLIENT)),
]
INVALID_VARIANTS = [
    Variant("empty", (), "MDP-W-08"),
    Variant("client-header", (b"MDPC02", b"\x03", b"echo", b"x"), "MDP-W-08"),
    Variant("0.1-header", (b"", b"MDPW01", b"\x05"), "MDP-W-08"),
    Variant("header-only", (b"MDPW02",), "MDP-W-08"),
    Variant("unknown-code", (b"MDPW02", b"\x07"), "MDP-W-08"),
    Variant("ready-extra-frame", (*READY, b"x"), "MDP-W-01"),
    Variant("ready-bad-service", (b"MDPW02", b"\x01", b"ech\x00"), "MDP-D-01"),
    Variant("request-short", request(NEW_CLIENT)[:4], "MDP-W-02"),
    Variant("request-no-delimiter", (b"MDPW02", b"\x02", NEW_CLIENT, b"a", b"b"), "MDP-R-02"),
    Variant("request-empty-address", request(b""), "MDP-D-02"),
    Variant("heartbeat-extra-frame", (*HEARTBEAT, b""), "MDP-W-05"),
    Variant("disconnect-extra-frame", (*DISCONNECT, b"bye"), "MDP-W-06"),
]
VARIANTS: dict[WorkerSessionInput, list[Variant]] = {
    In.UNEXPECTED: UNEXPECTED_VARIANTS,
    In.INVALID: INVALID_VARIANTS,
}
REMOTE = (In.REQUEST, In.HEARTBEAT, In.DISCONNECT, In.UNEXPECTED, In.INVALID)


def when(start: Start, input_: WorkerSessionInput) -> float:
    """The time of the input: timers fire exactly at their deadline, everything else at ``at``."""
    connected = start.state in (S.IDLE, S.BUSY)
    if input_ is In.HEARTBEAT_DUE:
        return start.last_sent + INTERVAL if connected else start.at + 50
    if input_ is In.BROKER_EXPIRED:
        return start.last_heard + SPAN if connected else start.at + 50
    return start.at


def stimulate(
    session: WorkerSession, input_: WorkerSessionInput, variant: Variant, now: float
) -> list[WorkerEvent]:
    """Make ``input_`` happen to ``session`` at ``now``."""
    if input_ is In.CONNECT:
        return session.connected(now)
    if input_ is In.REQUEST:
        return session.receive(request(NEW_CLIENT), now)
    if input_ is In.HEARTBEAT:
        return session.receive(HEARTBEAT, now)
    if input_ is In.DISCONNECT:
        return session.receive(DISCONNECT, now)
    if input_ in (In.UNEXPECTED, In.INVALID):
        return session.receive(variant.frames, now)
    if input_ is In.SEND_PARTIAL:
        return session.send_partial(REPLY, now)
    if input_ is In.SEND_FINAL:
        return session.send_final(REPLY, now)
    if input_ is In.CLOSE:
        return session.disconnect(now)
    return session.tick(now)  # HEARTBEAT_DUE, BROKER_EXPIRED


# --- the expected outcome of every cell, from the spec ----------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a cell does: new state, the whole outbox afterwards, events, next deadline."""

    state: WorkerState
    outbox: list[Frames]
    events: list[WorkerEvent]
    deadline: float | None
    client: bytes | None = None


REFUSED = None  # local misuse: LocalProtocolError, nothing changes


def expected(
    start: Start, input_: WorkerSessionInput, variant: Variant, now: float
) -> Outcome | None:
    """The spec's answer for ``input_`` in ``start``, at ``now``."""
    prior, client = start.outbox, start.client or b"?"

    def alive(last_sent: float = start.last_sent, last_heard: float = start.last_heard) -> float:
        # MDP-D-05 (heartbeat due) and MDP-D-04 (broker lost), whichever comes first.
        return min(last_sent + INTERVAL, last_heard + SPAN)

    backoff = now + CONFIG.reconnect_initial  # every IDLE/BUSY start has a fresh backoff
    violation = ProtocolViolation(None, "MDP-D-17", "", "reconnecting", now)
    malformed = ProtocolViolation(None, variant.rule, "", "dropped", now)
    dropped = MessageDropped(None, "", now)

    def gone(why: str, *events: WorkerEvent, sent: list[Frames] | None = None) -> Outcome:
        # MDP-W-17 / MDP-H-06 / MDP-D-17: the outbox is discarded, a new socket at the backoff.
        reconnect = ReconnectRequired(why, backoff, now)  # type: ignore[arg-type]
        return Outcome(S.DISCONNECTED, sent or [], [*events, reconnect], backoff)

    def abandoned(why: str) -> RequestAbandoned:
        return RequestAbandoned(client, why, now)  # type: ignore[arg-type]

    quiet = start.reconnect_at if start.state is S.DISCONNECTED else None
    not_connected = start.state in (S.DISCONNECTED, S.CLOSED)
    cells: dict[tuple[WorkerState, WorkerSessionInput], Outcome | None] = {}
    for state in (S.DISCONNECTED, S.CLOSED):
        for remote in REMOTE:  # MDP-W-17: stale messages of a socket given up
            cells[state, remote] = Outcome(state, prior, [dropped], quiet)
        for timer in (In.HEARTBEAT_DUE, In.BROKER_EXPIRED):  # MDP-D-03: no timers here
            cells[state, timer] = Outcome(state, prior, [], quiet)
        cells[state, In.SEND_PARTIAL] = REFUSED  # MDP-R-01
        cells[state, In.SEND_FINAL] = REFUSED
    if not_connected:
        cells[S.DISCONNECTED, In.CONNECT] = Outcome(  # MDP-W-09: READY on the new socket only
            S.IDLE, [READY], [WorkerConnected(SERVICE, now)], alive(now, now)
        )
        cells[S.DISCONNECTED, In.CLOSE] = Outcome(S.CLOSED, prior, [], None)  # MDP-W-12
        cells[S.CLOSED, In.CONNECT] = REFUSED
        cells[S.CLOSED, In.CLOSE] = Outcome(S.CLOSED, prior, [], None)
        return cells[start.state, input_]

    cells.update(
        {
            (S.IDLE, In.CONNECT): REFUSED,  # MDP-W-10: one READY per socket
            (S.BUSY, In.CONNECT): REFUSED,
            # MDP-R-01, MDP-H-02: a REQUEST refreshes the broker's liveness.
            (S.IDLE, In.REQUEST): Outcome(
                S.BUSY,
                prior,
                [RequestReceived(NEW_CLIENT, BODY, start.requests + 1, now)],
                alive(last_heard=now),
                NEW_CLIENT,
            ),
            # MDP-D-17: a REQUEST while busy breaks the dialog.
            (S.BUSY, In.REQUEST): gone(
                "protocol-violation", violation, abandoned("protocol-violation"), sent=[DISCONNECT]
            ),
            (S.IDLE, In.HEARTBEAT): Outcome(S.IDLE, prior, [], alive(last_heard=now)),  # MDP-H-02
            (S.BUSY, In.HEARTBEAT): Outcome(S.BUSY, prior, [], alive(last_heard=now), client),
            (S.IDLE, In.DISCONNECT): gone("broker-disconnect"),  # MDP-W-17
            (S.BUSY, In.DISCONNECT): gone("broker-disconnect", abandoned("broker-disconnect")),
            (S.IDLE, In.UNEXPECTED): gone("protocol-violation", violation, sent=[DISCONNECT]),
            (S.BUSY, In.UNEXPECTED): gone(
                "protocol-violation", violation, abandoned("protocol-violation"), sent=[DISCONNECT]
            ),
            # MDP-W-08: malformed is dropped; it is no heartbeat.
            (S.IDLE, In.INVALID): Outcome(S.IDLE, prior, [malformed], alive()),
            (S.BUSY, In.INVALID): Outcome(S.BUSY, prior, [malformed], alive(), client),
            (S.IDLE, In.SEND_PARTIAL): REFUSED,  # MDP-R-01
            (S.IDLE, In.SEND_FINAL): REFUSED,
            (S.BUSY, In.SEND_PARTIAL): Outcome(
                S.BUSY, [*prior, partial(client)], [], alive(last_sent=now), client
            ),
            (S.BUSY, In.SEND_FINAL): Outcome(
                S.IDLE, [*prior, final(client)], [], alive(last_sent=now)
            ),
            (S.IDLE, In.CLOSE): Outcome(S.CLOSED, [*prior, DISCONNECT], [], None),  # MDP-W-12
            (S.BUSY, In.CLOSE): Outcome(  # MDP-D-22
                S.CLOSED, [*prior, DISCONNECT], [abandoned("local-disconnect")], None
            ),
            # MDP-H-04, MDP-D-05: heartbeat exactly at last_sent + interval, busy or not.
            (S.IDLE, In.HEARTBEAT_DUE): Outcome(
                S.IDLE, [*prior, HEARTBEAT], [], alive(last_sent=now)
            ),
            (S.BUSY, In.HEARTBEAT_DUE): Outcome(
                S.BUSY, [*prior, HEARTBEAT], [], alive(last_sent=now), client
            ),
            # MDP-D-04, MDP-H-05, MDP-H-06: lost at exactly last_heard + liveness * interval.
            (S.IDLE, In.BROKER_EXPIRED): gone("broker-lost"),
            (S.BUSY, In.BROKER_EXPIRED): gone("broker-lost", abandoned("broker-lost")),
        }
    )
    return cells[start.state, input_]


# --- the table test ---------------------------------------------------------------------------


def _cases() -> list[tuple[Start, WorkerSessionInput, Variant]]:
    cases = []
    for start, input_ in product(STARTS, WorkerSessionInput):
        for variant in VARIANTS.get(input_, [Variant("-")]):
            cases.append((start, input_, variant))
    return cases


CASES = _cases()


def test_the_table_is_total_and_every_cell_is_exercised() -> None:
    """Every (state, input) pair has a cell, and the table test below reaches every one."""
    pairs = set(product(WorkerState, WorkerSessionInput))
    assert set(WORKER_SESSION_TRANSITIONS) == pairs
    assert {(start.state, input_) for start, input_, _ in CASES} == pairs


@pytest.mark.parametrize(
    ("start", "input_", "variant"),
    CASES,
    ids=[f"{s.name}-{i.name}-{v.name}" for s, i, v in CASES],
)
def test_cell(start: Start, input_: WorkerSessionInput, variant: Variant) -> None:
    """One (state, input) cell: new state, exact outbox, events, deadline; or refused unchanged."""
    now = when(start, input_)
    outcome = expected(start, input_, variant, now)
    cell = WORKER_SESSION_TRANSITIONS[start.state, input_]
    if outcome is REFUSED:
        assert cell.error is not None
        assert_refused(start.make, lambda s: stimulate(s, input_, variant, now))
        if start.state in (S.IDLE, S.BUSY):
            # At the heartbeat deadline too: a refused call must not fire the timer (MDP-D-03).
            due = start.last_sent + INTERVAL
            assert_refused(start.make, lambda s: stimulate(s, input_, variant, due))
        return
    assert cell.error is None
    assert (cell.next_state or start.state) is outcome.state
    session = start.make()
    events = stimulate(session, input_, variant, now)
    assert normalized(events) == outcome.events
    assert session.state is outcome.state
    assert session.now == now
    assert session.take_outgoing() == outcome.outbox
    assert session.next_deadline() == outcome.deadline
    assert session.current_client == outcome.client
    if outcome.state in (S.IDLE, S.BUSY):
        assert session.broker_expires_at is not None
    else:
        assert session.broker_expires_at is None


TIMED_CASES = [case for case in CASES if case[0].name != "fresh"]  # a fresh session has no time


@pytest.mark.parametrize(
    ("start", "input_", "variant"),
    TIMED_CASES,
    ids=[f"{s.name}-{i.name}-{v.name}" for s, i, v in TIMED_CASES],
)
def test_time_never_goes_backwards(
    start: Start, input_: WorkerSessionInput, variant: Variant
) -> None:
    """MDP-D-03: any call with ``now`` before the session's latest time is refused, unchanged."""
    earlier = start.make().now - 0.125
    assert_refused(start.make, lambda s: stimulate(s, input_, variant, earlier))


# --- scenarios --------------------------------------------------------------------------------


def connected_session(now: float = T0) -> WorkerSession:
    """A session on its first socket, READY taken."""
    session = WorkerSession(SERVICE, CONFIG)
    assert session.connected(now) == [WorkerConnected(SERVICE, now)]
    assert session.take_outgoing() == [READY]
    return session


def test_ready_once_per_socket() -> None:
    """MDP-W-09, MDP-W-10, MDP-W-11: READY first and once on each socket, nothing answers it."""
    session = connected_session()
    sent: list[Frames] = []
    now = T0
    for step in range(40):  # requests, replies, heartbeats both ways
        now += 0.5
        session.receive(HEARTBEAT, now)
        if step % 4 == 0:
            session.receive(request(CLIENT), now)
        elif step % 4 == 2:
            session.send_final(REPLY, now)
        session.tick(now + 0.25)
        now += 0.25
        sent += session.take_outgoing()
    assert READY not in sent
    assert HEARTBEAT in sent
    with pytest.raises(LocalProtocolError):
        session.connected(now)
    # A new socket after DISCONNECT: READY again, exactly once, first.
    session.receive(DISCONNECT, now)
    session.connected(session.reconnect_at)
    assert session.take_outgoing() == [READY]
    session.tick(session.reconnect_at + INTERVAL)
    assert session.take_outgoing() == [HEARTBEAT]


def test_connected_before_the_backoff_is_refused() -> None:
    """MDP-D-18: ``connected()`` before ``reconnect_at`` is misuse and changes nothing."""
    session = connected_session()
    session.receive(DISCONNECT, T0 + 1)
    assert session.reconnect_at == T0 + 1 + CONFIG.reconnect_initial
    early = math.nextafter(session.reconnect_at, -math.inf)

    def make() -> WorkerSession:
        twin = connected_session()
        twin.receive(DISCONNECT, T0 + 1)
        return twin

    assert_refused(make, lambda s: s.connected(early))
    assert session.connected(session.reconnect_at) == [
        WorkerConnected(SERVICE, session.reconnect_at)
    ]


def test_heartbeat_exact_boundary() -> None:
    """MDP-D-05, MDP-H-04: a heartbeat at exactly last_sent + interval, not a hair before."""
    session = connected_session(T0)
    just_before = math.nextafter(T0 + INTERVAL, -math.inf)
    assert session.next_deadline() == T0 + INTERVAL
    assert session.tick(just_before) == []
    assert session.take_outgoing() == []
    assert session.tick(T0 + INTERVAL) == []
    assert session.take_outgoing() == [HEARTBEAT]
    assert session.next_deadline() == T0 + 2 * INTERVAL
    # A late call sends one heartbeat (timers fire first, MDP-D-03), the next due an interval on.
    session.receive(HEARTBEAT, T0 + 2.5)
    assert session.take_outgoing() == [HEARTBEAT]
    assert session.next_deadline() == T0 + 3.5
    assert session.tick(T0 + 3.25) == []
    assert session.take_outgoing() == []


def test_no_heartbeat_when_something_else_was_sent() -> None:
    """MDP-H-03, MDP-D-05: a PARTIAL or FINAL counts as sent; the heartbeat waits an interval."""
    session = connected_session(T0)
    session.receive(request(CLIENT), T0 + 0.5)
    now = T0 + 0.75
    for _ in range(8):  # a PARTIAL every 0.75 s: never a full interval of silence
        session.send_partial(REPLY, now)
        assert session.take_outgoing() == [partial(CLIENT)]
        session.receive(HEARTBEAT, now + 0.25)
        assert session.tick(now + 0.7) == []
        assert session.take_outgoing() == []
        now += 0.75
    session.send_final(REPLY, now)
    assert session.take_outgoing() == [final(CLIENT)]
    session.tick(math.nextafter(now + INTERVAL, -math.inf))
    assert session.take_outgoing() == []
    session.tick(now + INTERVAL)
    assert session.take_outgoing() == [HEARTBEAT]


def test_receiving_does_not_suppress_heartbeats() -> None:
    """MDP-H-04: only what the worker sent delays its heartbeat, not what it heard."""
    session = connected_session(T0)
    for step in range(1, 9):
        session.receive(HEARTBEAT, T0 + step * 0.5 - 0.25)
        session.tick(T0 + step * 0.5)
        expected = [HEARTBEAT] if step % 2 == 0 else []
        assert session.take_outgoing() == expected, step


def test_busy_worker_keeps_heartbeating() -> None:
    """MDP-H-04: while a request is in progress, heartbeats go out every interval."""
    session = connected_session(T0)
    session.receive(request(CLIENT), T0 + 0.25)
    for step in range(1, 11):
        now = T0 + step * INTERVAL
        session.receive(HEARTBEAT, now - 0.5)
        assert session.tick(now) == []
        assert session.take_outgoing() == [HEARTBEAT]
        assert session.state is S.BUSY
    session.send_final(REPLY, T0 + 10.5)
    assert session.take_outgoing() == [final(CLIENT)]


@pytest.mark.parametrize("busy", [False, True])
def test_broker_lost_at_exactly_liveness_intervals(busy: bool) -> None:
    """MDP-D-04, MDP-H-05, MDP-H-06: lost at now >= last_heard + liveness * interval."""
    session = connected_session(T0)
    heard = T0
    if busy:
        heard = T0 + 0.5
        session.receive(request(CLIENT), heard)
    for beat in range(1, CONFIG.liveness):  # our own heartbeats do not keep the broker alive
        session.tick(T0 + beat * INTERVAL)
        assert session.take_outgoing() == [HEARTBEAT]
    expiry = heard + SPAN
    assert session.broker_expires_at == expiry
    assert session.next_deadline() == min(expiry, T0 + CONFIG.liveness * INTERVAL)
    just_before = math.nextafter(expiry, -math.inf)
    session.tick(just_before)
    assert (session.state, session.current_client) == ((S.BUSY, CLIENT) if busy else (S.IDLE, None))
    session.take_outgoing()
    events = session.tick(expiry)
    backoff = expiry + CONFIG.reconnect_initial
    lost: list[WorkerEvent] = [ReconnectRequired("broker-lost", backoff, expiry)]
    if busy:
        lost.insert(0, RequestAbandoned(CLIENT, "broker-lost", expiry))
    assert events == lost
    assert session.state is S.DISCONNECTED
    assert session.take_outgoing() == []
    assert session.next_deadline() == backoff


def test_any_broker_command_but_disconnect_refreshes_liveness() -> None:
    """MDP-H-02: HEARTBEAT and REQUEST keep the broker alive; malformed input does not."""
    session = connected_session(T0)
    session.receive(HEARTBEAT, T0 + 2)
    assert session.broker_expires_at == T0 + 2 + SPAN
    session.receive(request(CLIENT), T0 + 4)
    assert session.broker_expires_at == T0 + 4 + SPAN
    session.receive((b"MDPW02", b"\x05", b"junk"), T0 + 6)
    assert session.broker_expires_at == T0 + 4 + SPAN
    session.tick(T0 + 4 + SPAN)
    assert session.state is S.DISCONNECTED


def test_disconnect_is_obeyed() -> None:
    """MDP-W-17: outbox discarded, nothing more sent on that socket, ReconnectRequired."""
    session = connected_session(T0)
    session.receive(request(CLIENT), T0 + 0.5)
    session.send_partial(REPLY, T0 + 0.75)  # queued, not yet sent by the runtime
    events = session.receive(DISCONNECT, T0 + 1)
    assert events == [
        RequestAbandoned(CLIENT, "broker-disconnect", T0 + 1),
        ReconnectRequired("broker-disconnect", T0 + 1 + CONFIG.reconnect_initial, T0 + 1),
    ]
    assert session.take_outgoing() == []
    for now in (T0 + 1.1, T0 + 2, T0 + 5, T0 + 100):  # no heartbeat, no expiry, nothing
        assert session.tick(now) == []
        assert session.take_outgoing() == []
    with pytest.raises(LocalProtocolError):
        session.send_final(REPLY, T0 + 100)
    assert normalized(session.receive(HEARTBEAT, T0 + 100)) == [MessageDropped(None, "", T0 + 100)]
    assert session.take_outgoing() == []


def test_stale_messages_after_disconnect_are_dropped() -> None:
    """MDP-W-17: a message of the abandoned socket changes nothing."""
    session = connected_session(T0)
    session.receive(DISCONNECT, T0 + 1)
    reconnect_at = session.reconnect_at
    for frames in (request(CLIENT), HEARTBEAT, READY, DISCONNECT, (b"junk",)):
        events = session.receive(frames, T0 + 1.1)
        assert normalized(events) == [MessageDropped(None, "", T0 + 1.1)]
        assert session.state is S.DISCONNECTED
        assert session.reconnect_at == reconnect_at
        assert session.take_outgoing() == []


def _lose_broker(session: WorkerSession) -> float:
    """Let the broker go silent until lost; returns the delay the session asks to wait."""
    expiry = session.broker_expires_at
    assert expiry is not None
    session.tick(expiry)
    assert session.state is S.DISCONNECTED
    session.take_outgoing()
    return session.reconnect_at - expiry


def test_backoff_doubles_to_the_bound_and_resets() -> None:
    """MDP-D-18: 0.25, 0.5, 1, 2, 2 ... ; the first HEARTBEAT or REQUEST resets it."""
    session = connected_session(T0)
    delays = []
    for _ in range(6):
        delays.append(_lose_broker(session))
        session.connected(session.reconnect_at)
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    session.receive(HEARTBEAT, session.now + 0.5)  # the broker answered: back to the start
    assert _lose_broker(session) == 0.25
    session.connected(session.reconnect_at)
    assert _lose_broker(session) == 0.5
    session.connected(session.reconnect_at)
    session.receive(request(CLIENT), session.now + 0.5)  # a REQUEST is an answer too
    assert _lose_broker(session) == 0.25


def test_backoff_is_not_reset_by_disconnect_or_garbage() -> None:
    """MDP-D-18: a DISCONNECT or a malformed message is not the broker answering."""
    session = connected_session(T0)
    assert _lose_broker(session) == 0.25
    session.connected(session.reconnect_at)
    session.receive((b"MDPW02", b"\x09"), session.now + 0.5)
    session.receive(DISCONNECT, session.now + 0.5)
    assert session.reconnect_at - session.now == 0.5
    session.connected(session.reconnect_at)
    session.receive(READY, session.now + 0.5)  # unexpected: DISCONNECT and reconnect
    assert session.reconnect_at - session.now == 1.0


def test_backoff_survives_thousands_of_failed_connections() -> None:
    """MDP-D-18: the wait stays at the bound however long the broker is away (no overflow)."""
    session = connected_session(T0)
    for _ in range(1100):
        delay = _lose_broker(session)
        session.connected(session.reconnect_at)
    assert delay == CONFIG.reconnect_max


@pytest.mark.parametrize(
    "frames", [READY, partial(CLIENT), final(CLIENT), request(NEW_CLIENT)], ids=repr
)
@pytest.mark.parametrize("busy", [False, True])
def test_unexpected_commands_break_the_dialog(frames: Frames, busy: bool) -> None:
    """MDP-D-17: READY/PARTIAL/FINAL from the broker, or REQUEST while busy: DISCONNECT."""
    session = connected_session(T0)
    if busy:
        session.receive(request(CLIENT), T0 + 0.25)
        session.send_partial(REPLY, T0 + 0.5)
    elif frames[1] == b"\x02":
        return  # a REQUEST while idle is the normal case
    events = session.receive(frames, T0 + 1)
    assert isinstance(events[0], ProtocolViolation)
    assert events[0].rule == "MDP-D-17"
    assert events[0].action == "reconnecting"
    rest = [RequestAbandoned(CLIENT, "protocol-violation", T0 + 1)] if busy else []
    reconnect_at = T0 + 1 + CONFIG.reconnect_initial
    rest.append(ReconnectRequired("protocol-violation", reconnect_at, T0 + 1))  # type: ignore[arg-type]
    assert events[1:] == rest
    assert session.take_outgoing() == [DISCONNECT]  # the pending PARTIAL is not sent
    assert session.state is S.DISCONNECTED
    assert session.current_client is None
    assert session.tick(T0 + 50) == []
    assert session.take_outgoing() == []


def test_close_while_busy() -> None:
    """MDP-D-22, MDP-W-12: DISCONNECT after what was queued, the request abandoned, then CLOSED."""
    session = connected_session(T0)
    session.receive(request(CLIENT), T0 + 0.25)
    session.send_partial(REPLY, T0 + 0.5)
    assert session.disconnect(T0 + 0.75) == [
        RequestAbandoned(CLIENT, "local-disconnect", T0 + 0.75)
    ]
    assert session.take_outgoing() == [partial(CLIENT), DISCONNECT]
    assert session.state is S.CLOSED
    assert session.next_deadline() is None
    assert session.tick(T0 + 100) == []
    assert session.take_outgoing() == []
    assert session.disconnect(T0 + 101) == []
    assert session.take_outgoing() == []
    calls: list[Callable[[], object]] = [
        lambda: session.connected(T0 + 102),
        lambda: session.send_final(REPLY, T0 + 102),
        lambda: session.send_partial(REPLY, T0 + 102),
    ]
    for call in calls:
        with pytest.raises(LocalProtocolError):
            call()


def test_close_before_connecting_sends_nothing() -> None:
    """MDP-W-12: DISCONNECT may be sent at any time, but with no socket there is nothing to send."""
    session = WorkerSession(SERVICE, CONFIG)
    assert session.disconnect(T0) == []
    assert session.take_outgoing() == []
    assert session.state is S.CLOSED


def test_replies_only_while_busy() -> None:
    """MDP-R-01: PARTIAL* then exactly one FINAL per REQUEST; anything else is refused."""
    session = connected_session(T0)
    session.take_outgoing()
    with pytest.raises(LocalProtocolError):
        session.send_final(REPLY, T0 + 0.1)
    events = session.receive(request(CLIENT, BODY), T0 + 0.25)
    assert events == [RequestReceived(CLIENT, BODY, 1, T0 + 0.25)]
    assert (session.current_request, session.current_client) == (1, CLIENT)
    session.send_partial((b"p1",), T0 + 0.3)
    session.send_partial((b"p2",), T0 + 0.35)
    session.send_final((b"f",), T0 + 0.4)
    assert session.take_outgoing() == [
        partial(CLIENT, (b"p1",)),
        partial(CLIENT, (b"p2",)),
        final(CLIENT, (b"f",)),
    ]
    assert (session.current_request, session.state) == (None, S.IDLE)
    with pytest.raises(LocalProtocolError):
        session.send_final(REPLY, T0 + 0.45)
    with pytest.raises(LocalProtocolError):
        session.send_partial(REPLY, T0 + 0.45)
    events = session.receive(request(NEW_CLIENT), T0 + 0.5)
    assert events == [RequestReceived(NEW_CLIENT, BODY, 2, T0 + 0.5)]
    session.send_final(REPLY, T0 + 0.6)
    assert session.take_outgoing() == [final(NEW_CLIENT)]


@pytest.mark.parametrize("body", [(), b"bytes, not frames", ("text",), [b"ok", None]], ids=repr)
def test_an_invalid_reply_body_is_refused_unchanged(body: object) -> None:
    """MDP-R-01, MDP-W-03: a body is one or more bytes frames; misuse changes nothing."""

    def make() -> WorkerSession:
        session = connected_session(T0)
        session.receive(request(CLIENT), T0 + 0.25)
        return session

    assert_refused(make, lambda s: s.send_partial(body, T0 + INTERVAL))  # type: ignore[arg-type]
    assert_refused(make, lambda s: s.send_final(body, T0 + INTERVAL))  # type: ignore[arg-type]


def test_body_frames_pass_through_as_the_same_objects() -> None:
    """MDP-S-03: request body frames reach the application, reply frames the outbox, uncopied."""
    session = connected_session(T0)
    received = [fresh(frame) for frame in request(CLIENT, BODY)]
    (event,) = session.receive(received, T0 + 0.25)
    assert isinstance(event, RequestReceived)
    assert event.body[0] is received[4]
    assert event.body[1] is received[5]
    reply = [fresh(b"partial reply"), fresh(b"more")]
    session.send_partial(reply, T0 + 0.5)
    session.send_final(reply[:1], T0 + 0.75)
    sent_partial, sent_final = session.take_outgoing()
    assert sent_partial[4] is reply[0]
    assert sent_partial[5] is reply[1]
    assert sent_final[4] is reply[0]


def test_a_final_when_the_broker_is_found_lost_is_not_sent() -> None:
    """MDP-D-03, MDP-H-06: timers fire first; the reply of a lost connection is abandoned."""
    session = connected_session(T0)
    session.receive(request(CLIENT), T0 + 0.25)
    events = session.send_final(REPLY, T0 + 0.25 + SPAN)
    assert events == [
        RequestAbandoned(CLIENT, "broker-lost", T0 + 0.25 + SPAN),
        ReconnectRequired("broker-lost", T0 + 0.5 + SPAN, T0 + 0.25 + SPAN),
    ]
    assert session.take_outgoing() == []
    assert session.state is S.DISCONNECTED


def test_a_final_just_after_a_partial_still_sees_the_broker_lost() -> None:
    """MDP-H-06: a PARTIAL sent just before the broker's expiry leaves no heartbeat due at the
    FINAL; the broker is lost all the same, and the FINAL is not sent (``send_final``'s quick
    path checks both timers)."""
    session = connected_session(T0)
    session.receive(request(CLIENT), T0 + 0.25)
    session.send_partial(REPLY, T0 + 0.25 + SPAN - 0.01)
    assert session.take_outgoing()[-1] == partial(CLIENT)
    events = session.send_final(REPLY, T0 + 0.25 + SPAN)
    assert [type(event) for event in events] == [RequestAbandoned, ReconnectRequired]
    assert session.take_outgoing() == []
    assert session.state is S.DISCONNECTED


def test_invalid_config_is_refused() -> None:
    """MDP-H-04, MDP-D-18: the timing must make sense."""
    for bad in (
        {"heartbeat_interval": 0.0},
        {"liveness": 0},
        {"reconnect_initial": -1.0},
        {"reconnect_initial": 3.0, "reconnect_max": 2.0},
    ):
        with pytest.raises(ValueError, match=r"."):
            WorkerConfig(**bad)
    with pytest.raises(LocalProtocolError):
        WorkerSession(b"bad\x00service", CONFIG)
