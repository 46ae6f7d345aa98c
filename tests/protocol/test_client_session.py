"""``ClientSession`` (the client's side of MDP/0.2) against ``specs/mdp-0.2.md``.

As for the worker session: a table test over every (state, input) pair of
``CLIENT_SESSION_TRANSITIONS`` with the expected outcome of each cell written out from the spec
(new state, exact outbox, events, next deadline), refused cells checked against an untouched
twin; then one scenario per rule: one request at a time, PARTIAL* then FINAL, the service frame,
timeouts and retries, cancel and close, time that runs backwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import product

import pytest

from domo.protocol import ClientConfig, ClientSession, ClientState, LocalProtocolError
from domo.protocol.client import CLIENT_SESSION_TRANSITIONS, ClientSessionInput
from domo.protocol.events import (
    ClientEvent,
    FinalReceived,
    MessageDropped,
    PartialReceived,
    ProtocolViolation,
    ReconnectRequired,
    RequestFailed,
    RequestSent,
)
from domo.protocol.mdp import Frames

from .mdp_strategies import fresh

S = ClientState
In = ClientSessionInput

CONFIG = ClientConfig(timeout=2.0, retries=2)
TIMEOUT = CONFIG.timeout
SERVICE = b"echo"
OTHER = b"echo2"  # a service the session did not ask for
BODY = (fresh(b"request body"), fresh(b"second frame"))
NEW_BODY = (fresh(b"next request"),)
REPLY = (fresh(b"reply body"),)
T0 = 10.0


def request(service: bytes, body: Frames = BODY) -> Frames:
    """A client REQUEST (MDP-C-01)."""
    return (b"MDPC02", b"\x01", service, *body)


def partial(service: bytes, body: Frames = REPLY) -> Frames:
    """A broker PARTIAL (MDP-C-02)."""
    return (b"MDPC02", b"\x02", service, *body)


def final(service: bytes, body: Frames = REPLY) -> Frames:
    """A broker FINAL (MDP-C-03)."""
    return (b"MDPC02", b"\x03", service, *body)


def normalized(events: list[ClientEvent]) -> list[ClientEvent]:
    """Events with free-text reasons blanked (after checking there is one)."""
    out: list[ClientEvent] = []
    for event in events:
        if isinstance(event, ProtocolViolation | MessageDropped):
            assert event.reason, event
            event = replace(event, reason="")
        out.append(event)
    return out


def observe(session: ClientSession) -> tuple[object, ...]:
    """Everything a runtime can see of a session; drains its outbox."""
    return (
        session.state,
        session.now,
        session.next_deadline(),
        session.service,
        session.attempt,
        session.take_outgoing(),
    )


def follow_up(session: ClientSession) -> tuple[object, ...]:
    """Drive a session further (timeouts, reconnects, a reply) and observe it."""
    seen: list[object] = []
    for _ in range(CONFIG.retries + 2):
        deadline = session.next_deadline()
        later = session.now + 0.125 if deadline is None else deadline
        seen.append(normalized(session.tick(later)))
        if session.state is S.RECONNECTING:
            seen.append(normalized(session.connected(later)))
        seen.append(observe(session))
    if session.state is S.WAITING:
        seen.append(normalized(session.receive(final(SERVICE), session.now)))
    seen.append(observe(session))
    return tuple(seen)


def assert_refused(
    make: Callable[[], ClientSession], call: Callable[[ClientSession], object]
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
    state: ClientState
    steps: Callable[[ClientSession], object]
    outbox: list[Frames]  # left in the outbox when the input arrives
    at: float  # when the table test applies its input (no timeout is due then)
    deadline: float | None = None  # the reply timeout, while waiting
    attempt: int = 0
    partials: int = 0
    first_sent: float = math.nan
    timeout_means: ClientSessionInput | None = None  # what a tick at the deadline is here

    def make(self) -> ClientSession:
        """A fresh session driven to this start."""
        session = ClientSession(CONFIG)
        self.steps(session)
        assert session.state is self.state
        return session


def _connect(s: ClientSession) -> None:
    s.connected(T0)


def _waiting(s: ClientSession) -> None:
    s.connected(T0)
    s.request(SERVICE, BODY, T0 + 0.25)


def _after_partial(s: ClientSession) -> None:
    _waiting(s)
    s.receive(partial(SERVICE), T0 + 0.5)


def _reconnecting(s: ClientSession) -> None:
    _waiting(s)
    s.tick(T0 + 0.25 + TIMEOUT)


def _last_attempt(s: ClientSession) -> None:
    _waiting(s)
    now = T0 + 0.25
    for _ in range(CONFIG.retries):
        now += TIMEOUT
        s.tick(now)
        s.connected(now)


def _idle_after_final(s: ClientSession) -> None:
    _waiting(s)
    s.receive(final(SERVICE), T0 + 0.5)


def _after_cancel(s: ClientSession) -> None:
    _waiting(s)
    s.cancel(T0 + 0.5)


def _closed(s: ClientSession) -> None:
    s.connected(T0)
    s.close(T0 + 0.25)


LAST_SENT = T0 + 0.25 + CONFIG.retries * TIMEOUT
STARTS = [
    Start("fresh", S.DISCONNECTED, lambda s: None, [], T0),
    Start("after-cancel", S.DISCONNECTED, _after_cancel, [], T0 + 0.75, attempt=1),
    Start("idle", S.IDLE, _connect, [], T0 + 0.5),
    Start("idle-after-final", S.IDLE, _idle_after_final, [request(SERVICE)], T0 + 0.75, attempt=1),
    Start(
        "waiting",
        S.WAITING,
        _waiting,
        [request(SERVICE)],
        T0 + 0.5,
        deadline=T0 + 0.25 + TIMEOUT,
        attempt=1,
        first_sent=T0 + 0.25,
        timeout_means=In.TIMEOUT_RETRY,
    ),
    Start(
        "waiting-after-partial",
        S.WAITING,
        _after_partial,
        [request(SERVICE)],
        T0 + 0.75,
        deadline=T0 + 0.5 + TIMEOUT,
        attempt=1,
        partials=1,
        first_sent=T0 + 0.25,
        timeout_means=In.TIMEOUT_FAIL,
    ),
    Start(
        "waiting-last-attempt",
        S.WAITING,
        _last_attempt,
        [request(SERVICE)],
        LAST_SENT + 0.5,
        deadline=LAST_SENT + TIMEOUT,
        attempt=CONFIG.retries + 1,
        first_sent=T0 + 0.25,
        timeout_means=In.TIMEOUT_FAIL,
    ),
    Start("reconnecting", S.RECONNECTING, _reconnecting, [], T0 + 0.5 + TIMEOUT, attempt=1),
    Start("closed", S.CLOSED, _closed, [], T0 + 0.5),
]

# --- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One concrete stimulus for an input: the frames received and, if malformed, its rule."""

    name: str
    frames: Frames = ()
    rule: str = ""


VARIANTS: dict[ClientSessionInput, list[Variant]] = {
    In.PARTIAL: [Variant("PARTIAL", partial(SERVICE))],
    In.FINAL: [Variant("FINAL", final(SERVICE))],
    In.FOREIGN_REPLY: [Variant("PARTIAL", partial(OTHER)), Variant("FINAL", final(OTHER))],
    In.UNEXPECTED: [Variant("REQUEST", request(SERVICE))],
    In.INVALID: [
        Variant("empty", (), "MDP-W-08"),
        Variant("worker-header", (b"MDPW02", b"\x05"), "MDP-W-08"),
        Variant("0.1-reply", (b"", b"MDPC01", b"echo", b"x"), "MDP-W-08"),
        Variant("header-only", (b"MDPC02",), "MDP-C-01"),
        Variant("unknown-code", (b"MDPC02", b"\x04", SERVICE, b"x"), "MDP-C-01"),
        Variant("partial-no-body", partial(SERVICE)[:3], "MDP-C-02"),
        Variant("final-no-body", final(SERVICE)[:3], "MDP-C-03"),
        Variant("final-empty-service", final(b""), "MDP-D-01"),
        Variant("final-unprintable-service", final(b"ech\x00"), "MDP-D-01"),
    ],
}
REMOTE = (In.PARTIAL, In.FINAL, In.FOREIGN_REPLY, In.UNEXPECTED, In.INVALID)
TIMEOUTS = (In.TIMEOUT_RETRY, In.TIMEOUT_FAIL)


def when(start: Start, input_: ClientSessionInput) -> float:
    """The time of the input: a timeout fires exactly at the deadline."""
    if input_ in TIMEOUTS:
        return start.deadline if start.deadline is not None else start.at + 50
    return start.at


def stimulate(
    session: ClientSession, input_: ClientSessionInput, variant: Variant, now: float
) -> list[ClientEvent]:
    """Make ``input_`` happen to ``session`` at ``now``."""
    if input_ is In.CONNECT:
        return session.connected(now)
    if input_ is In.REQUEST:
        return session.request(SERVICE, NEW_BODY, now)
    if input_ in REMOTE:
        return session.receive(variant.frames, now)
    if input_ is In.CANCEL:
        return session.cancel(now)
    if input_ is In.CLOSE:
        return session.close(now)
    return session.tick(now)  # the timeouts


# --- the expected outcome of every cell, from the spec ----------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a cell does: new state, the whole outbox afterwards, events, next deadline."""

    state: ClientState
    outbox: list[Frames]
    events: list[ClientEvent]
    deadline: float | None = None
    service: bytes | None = None
    attempt: int | None = None  # None: unchanged


REFUSED = None  # local misuse: LocalProtocolError, nothing changes


def expected(
    start: Start, input_: ClientSessionInput, variant: Variant, now: float
) -> Outcome | None:
    """The spec's answer for ``input_`` in ``start``, at ``now``."""
    prior = start.outbox
    waiting = start.state in (S.WAITING, S.RECONNECTING)
    service = SERVICE if waiting else None
    keep = dict(deadline=start.deadline, service=service)
    dropped = MessageDropped(None, "", now)
    violation = ProtocolViolation(None, variant.rule or "MDP-D-20", "", "dropped", now)
    failed_reason = "timeout-after-partial" if start.partials else "retries-exhausted"
    cancelled = RequestFailed(SERVICE, start.attempt, "cancelled", now)
    cells: dict[tuple[ClientState, ClientSessionInput], Outcome | None] = {}
    for state in S:
        for timer in TIMEOUTS:  # MDP-D-03: only WAITING has a timer
            cells[state, timer] = Outcome(state, prior, [], **keep)  # type: ignore[arg-type]
        cells[state, In.CLOSE] = Outcome(S.CLOSED, prior, [])  # MDP-C-08
    for state in (S.DISCONNECTED, S.RECONNECTING, S.CLOSED):
        for remote in REMOTE:  # MDP-C-08: replies on a socket given up
            cells[state, remote] = Outcome(state, prior, [dropped], **keep)  # type: ignore[arg-type]
    for state in (S.IDLE, S.WAITING):
        cells[state, In.CONNECT] = REFUSED  # MDP-C-04: one socket at a time
        for remote in REMOTE:  # MDP-D-20: no request, another service, garbage
            cells[state, remote] = Outcome(state, prior, [violation], **keep)  # type: ignore[arg-type]
    cells.update(
        {
            (S.DISCONNECTED, In.CONNECT): Outcome(S.IDLE, prior, []),  # MDP-C-04
            (S.DISCONNECTED, In.REQUEST): REFUSED,
            (S.DISCONNECTED, In.CANCEL): REFUSED,
            # MDP-C-08: the new socket gets the same REQUEST again, with a fresh timeout.
            (S.RECONNECTING, In.CONNECT): Outcome(
                S.WAITING,
                [*prior, request(SERVICE)],
                [RequestSent(SERVICE, start.attempt + 1, now)],
                now + TIMEOUT,
                SERVICE,
                start.attempt + 1,
            ),
            (S.RECONNECTING, In.REQUEST): REFUSED,  # MDP-C-07
            (S.RECONNECTING, In.CANCEL): Outcome(S.DISCONNECTED, prior, [cancelled]),
            (S.RECONNECTING, In.CLOSE): Outcome(S.CLOSED, prior, [cancelled]),
            # MDP-C-01, MDP-C-07
            (S.IDLE, In.REQUEST): Outcome(
                S.WAITING,
                [*prior, request(SERVICE, NEW_BODY)],
                [RequestSent(SERVICE, 1, now)],
                now + TIMEOUT,
                SERVICE,
                1,
            ),
            (S.IDLE, In.CANCEL): REFUSED,
            (S.WAITING, In.REQUEST): REFUSED,  # MDP-C-07
            # MDP-C-05, MDP-D-19: a PARTIAL restarts the timeout.
            (S.WAITING, In.PARTIAL): Outcome(
                S.WAITING,
                prior,
                [PartialReceived(SERVICE, REPLY, start.attempt, now)],
                now + TIMEOUT,
                SERVICE,
            ),
            # MDP-C-06: the FINAL ends the request.
            (S.WAITING, In.FINAL): Outcome(
                S.IDLE,
                prior,
                [FinalReceived(SERVICE, REPLY, start.attempt, now - start.first_sent, now)],
            ),
            # MDP-C-08: close the socket (outbox discarded), resend on the next one.
            (S.WAITING, In.TIMEOUT_RETRY): Outcome(
                S.RECONNECTING, [], [ReconnectRequired("timeout", now, now)], None, SERVICE
            ),
            # MDP-C-08, MDP-D-19: no retries left, or PARTIALs already arrived.
            (S.WAITING, In.TIMEOUT_FAIL): Outcome(
                S.DISCONNECTED,
                [],
                [
                    RequestFailed(SERVICE, start.attempt, failed_reason, now),  # type: ignore[arg-type]
                    ReconnectRequired("request-failed", now, now),
                ],
            ),
            (S.WAITING, In.CANCEL): Outcome(
                S.DISCONNECTED, [], [cancelled, ReconnectRequired("request-failed", now, now)]
            ),
            (S.WAITING, In.CLOSE): Outcome(S.CLOSED, [], [cancelled]),
            (S.CLOSED, In.CONNECT): REFUSED,
            (S.CLOSED, In.REQUEST): REFUSED,
            (S.CLOSED, In.CANCEL): REFUSED,
            (S.CLOSED, In.CLOSE): Outcome(S.CLOSED, prior, []),
        }
    )
    return cells[start.state, input_]


# --- the table test ---------------------------------------------------------------------------


def _cases() -> list[tuple[Start, ClientSessionInput, Variant]]:
    cases = []
    for start, input_ in product(STARTS, ClientSessionInput):
        if input_ in TIMEOUTS and start.timeout_means not in (None, input_):
            continue  # a tick at this start's deadline means the other timeout
        for variant in VARIANTS.get(input_, [Variant("-")]):
            cases.append((start, input_, variant))
    return cases


CASES = _cases()


def test_the_table_is_total_and_every_cell_is_exercised() -> None:
    """Every (state, input) pair has a cell, and the table test below reaches every one."""
    pairs = set(product(ClientState, ClientSessionInput))
    assert set(CLIENT_SESSION_TRANSITIONS) == pairs
    assert {(start.state, input_) for start, input_, _ in CASES} == pairs


@pytest.mark.parametrize(
    ("start", "input_", "variant"),
    CASES,
    ids=[f"{s.name}-{i.name}-{v.name}" for s, i, v in CASES],
)
def test_cell(start: Start, input_: ClientSessionInput, variant: Variant) -> None:
    """One (state, input) cell: new state, exact outbox, events, deadline; or refused unchanged."""
    now = when(start, input_)
    outcome = expected(start, input_, variant, now)
    cell = CLIENT_SESSION_TRANSITIONS[start.state, input_]
    if outcome is REFUSED:
        assert cell.error is not None
        assert_refused(start.make, lambda s: stimulate(s, input_, variant, now))
        if start.deadline is not None:
            # At the reply deadline too: a refused call must not fire the timeout (MDP-D-03).
            deadline = start.deadline
            assert_refused(start.make, lambda s: stimulate(s, input_, variant, deadline))
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
    assert session.service == outcome.service
    assert session.attempt == (start.attempt if outcome.attempt is None else outcome.attempt)


TIMED_CASES = [case for case in CASES if case[0].name != "fresh"]  # a fresh session has no time


@pytest.mark.parametrize(
    ("start", "input_", "variant"),
    TIMED_CASES,
    ids=[f"{s.name}-{i.name}-{v.name}" for s, i, v in TIMED_CASES],
)
def test_time_never_goes_backwards(
    start: Start, input_: ClientSessionInput, variant: Variant
) -> None:
    """MDP-D-03: any call with ``now`` before the session's latest time is refused, unchanged."""
    earlier = start.make().now - 0.125
    assert_refused(start.make, lambda s: stimulate(s, input_, variant, earlier))


# --- scenarios --------------------------------------------------------------------------------


def waiting_session(now: float = T0, config: ClientConfig = CONFIG) -> ClientSession:
    """A connected session that has just sent REQUEST for SERVICE with BODY (outbox drained)."""
    session = ClientSession(config)
    assert session.connected(now) == []
    assert session.request(SERVICE, BODY, now) == [RequestSent(SERVICE, 1, now)]
    assert session.take_outgoing() == [request(SERVICE)]
    return session


def test_one_request_at_a_time() -> None:
    """MDP-C-07: a second request while one is outstanding is refused; after FINAL it is fine."""
    session = waiting_session()
    with pytest.raises(LocalProtocolError):
        session.request(SERVICE, BODY, T0 + 0.5)
    with pytest.raises(LocalProtocolError):
        session.request(OTHER, BODY, T0 + 0.5)
    assert session.take_outgoing() == []
    session.receive(final(SERVICE), T0 + 1)
    assert session.request(OTHER, NEW_BODY, T0 + 1.5) == [RequestSent(OTHER, 1, T0 + 1.5)]
    assert session.take_outgoing() == [request(OTHER, NEW_BODY)]
    session.tick(T0 + 1.5 + TIMEOUT)  # and while reconnecting it is still outstanding
    assert session.state is S.RECONNECTING
    with pytest.raises(LocalProtocolError):
        session.request(SERVICE, BODY, T0 + 1.5 + TIMEOUT)


def test_partials_then_final() -> None:
    """MDP-C-05, MDP-C-06: zero or more PARTIALs, then the FINAL; nothing after it."""
    session = waiting_session()
    for number in range(5):
        body = (fresh(b"part %d" % number),)
        events = session.receive(partial(SERVICE, body), T0 + 0.1 * (number + 1))
        assert events == [PartialReceived(SERVICE, body, 1, T0 + 0.1 * (number + 1))]
        assert isinstance(events[0], PartialReceived)
        assert events[0].body[0] is body[0]  # MDP-S-03
    done = (fresh(b"the end"), fresh(b"really"))
    events = session.receive(final(SERVICE, done), T0 + 1)
    assert events == [FinalReceived(SERVICE, done, 1, 1.0, T0 + 1)]
    assert session.state is S.IDLE
    assert session.next_deadline() is None
    late = session.receive(final(SERVICE), T0 + 1.5)  # a second FINAL: no request outstanding
    assert normalized(late) == [ProtocolViolation(None, "MDP-D-20", "", "dropped", T0 + 1.5)]
    assert session.take_outgoing() == []


def test_a_final_with_no_partials() -> None:
    """MDP-C-05: zero PARTIALs is fine."""
    session = waiting_session()
    assert session.receive(final(SERVICE), T0 + 0.5) == [
        FinalReceived(SERVICE, REPLY, 1, 0.5, T0 + 0.5)
    ]


def test_reply_for_another_service_is_dropped() -> None:
    """MDP-D-20, MDP-C-09: the service frame must match exactly; a foreign PARTIAL is no reply."""
    session = waiting_session()
    for service in (OTHER, b"ECHO", b"echo ", b"ech"):
        for frames in (partial(service), final(service)):
            events = session.receive(frames, T0 + 1)
            assert normalized(events) == [
                ProtocolViolation(None, "MDP-D-20", "", "dropped", T0 + 1)
            ]
            assert session.state is S.WAITING
    assert session.next_deadline() == T0 + TIMEOUT  # the foreign replies restarted nothing
    assert session.receive(final(SERVICE), T0 + 1.5) == [
        FinalReceived(SERVICE, REPLY, 1, 1.5, T0 + 1.5)
    ]


def test_a_request_from_the_broker_is_dropped() -> None:
    """MDP-D-20: REQUEST is a client-to-broker command; it changes nothing."""
    session = waiting_session()
    events = session.receive(request(SERVICE), T0 + 1)
    assert normalized(events) == [ProtocolViolation(None, "MDP-D-20", "", "dropped", T0 + 1)]
    assert session.state is S.WAITING
    assert session.next_deadline() == T0 + TIMEOUT


def test_timeout_reconnect_resend_then_fail() -> None:
    """MDP-C-08: timeout, new socket, the same REQUEST again, up to ``retries``, then failure."""
    session = waiting_session(T0)
    now = T0
    for attempt in range(2, CONFIG.retries + 2):
        deadline = now + TIMEOUT
        assert session.next_deadline() == deadline
        assert session.tick(math.nextafter(deadline, -math.inf)) == []
        assert session.tick(deadline) == [ReconnectRequired("timeout", deadline, deadline)]
        assert session.state is S.RECONNECTING
        assert session.take_outgoing() == []
        now = deadline + 0.25  # the runtime takes a moment to open the new socket
        assert session.connected(now) == [RequestSent(SERVICE, attempt, now)]
        resent = session.take_outgoing()
        assert resent == [request(SERVICE)]
        assert resent[0][3] is BODY[0]  # the very frames the application gave (MDP-S-03)
        assert resent[0][4] is BODY[1]
    deadline = now + TIMEOUT
    assert session.tick(deadline) == [
        RequestFailed(SERVICE, CONFIG.retries + 1, "retries-exhausted", deadline),
        ReconnectRequired("request-failed", deadline, deadline),
    ]
    assert session.state is S.DISCONNECTED
    assert session.next_deadline() is None
    assert session.take_outgoing() == []
    assert session.service is None


@pytest.mark.parametrize("retries", [0, 1, 4])
def test_exactly_retries_resends(retries: int) -> None:
    """MDP-C-08, MDP-D-19: 1 + retries attempts in all, never one more."""
    session = waiting_session(T0, ClientConfig(timeout=1.0, retries=retries))
    sent = 1
    now = T0
    while True:
        now += 1.0
        events = session.tick(now)
        if session.state is not S.RECONNECTING:
            break
        session.connected(now)
        sent += len(session.take_outgoing())
    assert sent == retries + 1
    assert isinstance(events[0], RequestFailed)
    assert events[0].attempts == retries + 1


def test_partial_restarts_the_timeout_and_forbids_a_retry() -> None:
    """MDP-D-19: the timeout runs from the latest PARTIAL; a timeout after one fails at once."""
    session = waiting_session(T0)
    session.receive(partial(SERVICE), T0 + 1.5)
    assert session.next_deadline() == T0 + 1.5 + TIMEOUT
    assert session.tick(T0 + TIMEOUT) == []  # the first deadline has moved
    session.receive(partial(SERVICE), T0 + 3)
    deadline = T0 + 3 + TIMEOUT
    assert session.tick(math.nextafter(deadline, -math.inf)) == []
    assert session.tick(deadline) == [
        RequestFailed(SERVICE, 1, "timeout-after-partial", deadline),
        ReconnectRequired("request-failed", deadline, deadline),
    ]
    assert session.take_outgoing() == []
    assert session.state is S.DISCONNECTED


def test_partial_on_a_retry_counts_for_that_attempt() -> None:
    """MDP-D-19: PARTIALs are counted per attempt: the resend starts clean."""
    session = waiting_session(T0)
    session.tick(T0 + TIMEOUT)
    session.connected(T0 + TIMEOUT)
    session.take_outgoing()
    events = session.receive(partial(SERVICE), T0 + TIMEOUT + 1)
    assert events == [PartialReceived(SERVICE, REPLY, 2, T0 + TIMEOUT + 1)]
    done = session.receive(final(SERVICE), T0 + TIMEOUT + 1.5)
    assert done == [FinalReceived(SERVICE, REPLY, 2, TIMEOUT + 1.5, T0 + TIMEOUT + 1.5)]


def test_replies_on_an_abandoned_socket_are_dropped() -> None:
    """MDP-C-08: after a timeout the old socket's replies are not the new attempt's."""
    session = waiting_session(T0)
    session.tick(T0 + TIMEOUT)
    for frames in (partial(SERVICE), final(SERVICE), final(OTHER), (b"junk",)):
        events = session.receive(frames, T0 + TIMEOUT + 0.1)
        assert normalized(events) == [MessageDropped(None, "", T0 + TIMEOUT + 0.1)]
        assert session.state is S.RECONNECTING


def test_cancel_while_waiting() -> None:
    """MDP-C-08: cancel fails the request, discards the outbox and asks for a new socket."""
    session = ClientSession(CONFIG)
    session.connected(T0)
    session.request(SERVICE, BODY, T0)  # REQUEST left in the outbox
    assert session.cancel(T0 + 1) == [
        RequestFailed(SERVICE, 1, "cancelled", T0 + 1),
        ReconnectRequired("request-failed", T0 + 1, T0 + 1),
    ]
    assert session.take_outgoing() == []
    assert session.state is S.DISCONNECTED
    with pytest.raises(LocalProtocolError):
        session.cancel(T0 + 1)
    with pytest.raises(LocalProtocolError):
        session.request(SERVICE, BODY, T0 + 1)
    session.connected(T0 + 2)
    assert session.request(SERVICE, NEW_BODY, T0 + 2) == [RequestSent(SERVICE, 1, T0 + 2)]


def test_cancel_while_reconnecting() -> None:
    """MDP-C-08: the request waiting for a new socket fails; no socket to replace."""
    session = waiting_session(T0)
    session.tick(T0 + TIMEOUT)
    assert session.cancel(T0 + TIMEOUT + 0.5) == [
        RequestFailed(SERVICE, 1, "cancelled", T0 + TIMEOUT + 0.5)
    ]
    assert session.state is S.DISCONNECTED
    assert session.connected(T0 + TIMEOUT + 1) == []
    assert session.take_outgoing() == []


def test_cancel_at_the_last_deadline_returns_the_timeout() -> None:
    """MDP-D-03: the timeout due at ``now`` fires first; cancel has nothing left to cancel."""
    session = waiting_session(T0, ClientConfig(timeout=1.0, retries=0))
    assert session.cancel(T0 + 1.0) == [
        RequestFailed(SERVICE, 1, "retries-exhausted", T0 + 1.0),
        ReconnectRequired("request-failed", T0 + 1.0, T0 + 1.0),
    ]
    assert session.state is S.DISCONNECTED


def test_cancel_at_a_deadline_with_retries_left() -> None:
    """MDP-D-03: the timeout fires first (RECONNECTING), then cancel fails the request."""
    session = waiting_session(T0)
    assert session.cancel(T0 + TIMEOUT) == [
        ReconnectRequired("timeout", T0 + TIMEOUT, T0 + TIMEOUT),
        RequestFailed(SERVICE, 1, "cancelled", T0 + TIMEOUT),
    ]
    assert session.state is S.DISCONNECTED


def test_close() -> None:
    """MDP-C-08: close fails an outstanding request; a closed session refuses everything else."""
    session = waiting_session(T0)
    assert session.close(T0 + 1) == [RequestFailed(SERVICE, 1, "cancelled", T0 + 1)]
    assert session.state is S.CLOSED
    assert session.next_deadline() is None
    assert session.close(T0 + 2) == []
    assert session.tick(T0 + 100) == []
    calls: list[Callable[[], object]] = [
        lambda: session.connected(T0 + 101),
        lambda: session.request(SERVICE, BODY, T0 + 101),
        lambda: session.cancel(T0 + 101),
    ]
    for call in calls:
        with pytest.raises(LocalProtocolError):
            call()
    assert normalized(session.receive(final(SERVICE), T0 + 102)) == [
        MessageDropped(None, "", T0 + 102)
    ]


@pytest.mark.parametrize(
    ("service", "body"),
    [
        (b"", BODY),
        (b"a" * 256, BODY),
        (b"ech\x00", BODY),
        ("echo", BODY),
        (SERVICE, ()),
        (SERVICE, b"not frames"),
        (SERVICE, ("text",)),
    ],
    ids=repr,
)
def test_an_invalid_request_is_refused_unchanged(service: object, body: object) -> None:
    """MDP-C-01, MDP-D-01: a bad service name or body is misuse; nothing changes."""

    def make() -> ClientSession:
        session = ClientSession(CONFIG)
        session.connected(T0)
        return session

    assert_refused(make, lambda s: s.request(service, body, T0 + 1))  # type: ignore[arg-type]


def test_time_backwards_is_refused() -> None:
    """MDP-D-03: ``now`` never decreases; a call that says otherwise raises."""
    session = waiting_session(T0 + 5)
    calls: list[Callable[[], object]] = [
        lambda: session.tick(T0),
        lambda: session.receive(final(SERVICE), T0),
        lambda: session.cancel(T0),
        lambda: session.close(T0),
    ]
    for call in calls:
        with pytest.raises(LocalProtocolError):
            call()
    assert session.state is S.WAITING
    assert session.now == T0 + 5
    assert session.tick(T0 + 5) == []  # the same time again is fine


def test_invalid_config_is_refused() -> None:
    """MDP-C-08: a timeout must be positive and retries not negative."""
    with pytest.raises(ValueError, match="timeout"):
        ClientConfig(timeout=0.0)
    with pytest.raises(ValueError, match="retries"):
        ClientConfig(retries=-1)


def test_a_reply_with_frames_that_are_not_bytes_is_malformed() -> None:
    """MDP-W-08, MDP-C-01: a reply naming the right service is still checked frame by frame (the
    session's quick path for the expected reply takes only ``bytes``; the rest is validated)."""
    session = waiting_session()
    shapes = [
        (bytearray(b"MDPC02"), b"\x03", SERVICE, *REPLY),
        (b"MDPC02", bytearray(b"\x03"), SERVICE, *REPLY),
        (b"MDPC02", b"\x03", bytearray(SERVICE), *REPLY),
    ]
    for frames in shapes:
        events = session.receive(frames, T0 + 1)  # type: ignore[arg-type]
        assert [type(e) for e in events] == [ProtocolViolation]
        assert session.state is S.WAITING
    assert session.receive(final(SERVICE), T0 + 1) == [
        FinalReceived(SERVICE, REPLY, 1, 1.0, T0 + 1)
    ]


def test_a_reply_at_the_deadline_comes_too_late() -> None:
    """MDP-C-08: at the reply deadline the timeout fires first, even for the expected FINAL; the
    FINAL then belongs to a socket given up and is dropped."""
    session = waiting_session()
    events = session.receive(final(SERVICE), T0 + TIMEOUT)
    assert [type(e) for e in events] == [ReconnectRequired, MessageDropped]
    assert session.state is S.RECONNECTING


def test_a_service_name_is_checked_until_it_was_valid_once() -> None:
    """MDP-D-01: the session skips checking the name of its last request again; an invalid name,
    the same object or not, is refused every time."""
    session = waiting_session()
    session.receive(final(SERVICE), T0 + 1)
    bad = b"bad\x00name"
    for _ in range(2):
        with pytest.raises(LocalProtocolError):
            session.request(bad, BODY, T0 + 1)
    assert session.state is S.IDLE
    assert session.request(SERVICE, BODY, T0 + 2) == [RequestSent(SERVICE, 1, T0 + 2)]
