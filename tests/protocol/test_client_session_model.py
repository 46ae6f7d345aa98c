"""A Hypothesis state machine: ``ClientSession`` against a model written here from the spec.

The model (``ClientModel``) restates ``specs/mdp-0.2.md`` for one client: one request at a time
(MDP-C-07), PARTIAL* then FINAL for the service asked (MDP-C-05, MDP-C-06, MDP-D-20), a reply
timeout from the REQUEST restarted by each PARTIAL, a resend on a new socket up to ``retries``
times unless a PARTIAL arrived, then failure (MDP-C-08, MDP-D-19), timers first at every call
(MDP-D-03). The rules drive the session with every broker message (replies for the right and
for other services, a REQUEST, malformed near misses), every local call (misuse included, which
must raise ``LocalProtocolError`` and change nothing), reconnections, and time drawn from an
exact grid of ``timeout / 4`` steps mixed with floats, plus jumps to exactly the deadline.

Every call's events are compared with the model's; every drained outbox frame for frame, and
on the wire: only REQUESTs, each the application's own frames (the same objects, MDP-S-03), each
attempt on its own socket, and a socket never carries a second request before the first's FINAL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from domo.protocol import ClientConfig, ClientSession, ClientState, LocalProtocolError, mdp
from domo.protocol.events import (
    ClientEvent,
    FailureReason,
    FinalReceived,
    MessageDropped,
    PartialReceived,
    ProtocolViolation,
    ReconnectRequired,
    RequestFailed,
    RequestSent,
)
from domo.protocol.mdp import Frames

from .mdp_strategies import NearMiss, bodies, near_misses, worker_commands

S = ClientState
CONFIG = ClientConfig(timeout=1.0, retries=1)
TIMEOUT = CONFIG.timeout
START = 100.0
SERVICES = [b"echo", b"db.query", b"x"]

# Time steps: the exact grid and floats; mostly shorter than the timeout, so that a request
# lives long enough to get replies; the jump rule reaches the deadline exactly.
GRID = st.integers(0, 3).map(lambda k: k * TIMEOUT / 4)
LONG_GRID = st.integers(0, 6).map(lambda k: k * TIMEOUT / 4)
FLOATS = st.floats(min_value=0.0, max_value=TIMEOUT, allow_nan=False)
STEPS = st.one_of(GRID, GRID, FLOATS, LONG_GRID)
BACKWARDS = st.one_of(
    st.integers(1, 8).map(lambda k: k * TIMEOUT / 4),
    st.floats(min_value=1e-9, max_value=TIMEOUT * 3),
)
_CLIENT_COMMANDS = st.one_of(
    st.builds(mdp.ClientPartial, st.sampled_from(SERVICES), bodies),
    st.builds(mdp.ClientFinal, st.sampled_from(SERVICES), bodies),
    st.builds(mdp.ClientRequest, st.sampled_from(SERVICES), bodies),
)
MALFORMED = st.one_of(
    _CLIENT_COMMANDS.flatmap(lambda command: st.sampled_from(near_misses(command))),
    worker_commands.map(lambda command: NearMiss("worker", mdp.encode(command), "MDP-W-08")),
    st.just(NearMiss("empty", (), "MDP-W-08")),
)
BAD_REQUESTS: st.SearchStrategy[tuple[object, object]] = st.one_of(
    st.tuples(st.sampled_from([b"", b"a" * 256, b"ech\x00", b"\xc3\xa9", "echo"]), bodies),
    st.tuples(st.sampled_from(SERVICES), st.sampled_from([(), b"frame", ("text",), [b"a", 1]])),
)


def request(service: bytes, body: Frames) -> Frames:
    """A client REQUEST (MDP-C-01)."""
    return (b"MDPC02", b"\x01", service, *body)


def normalized(events: list[ClientEvent]) -> list[ClientEvent]:
    """Events with free-text reasons blanked, after checking there is one."""
    out: list[ClientEvent] = []
    for event in events:
        if isinstance(event, ProtocolViolation | MessageDropped):
            assert event.reason, event
            event = replace(event, reason="")
        out.append(event)
    return out


@dataclass
class Socket:
    """What went out on one socket: the numbers of the requests sent on it."""

    requests: list[int] = field(default_factory=list)


@dataclass
class ClientModel:
    """One client session as the spec describes it."""

    state: ClientState = S.DISCONNECTED
    now: float = -math.inf
    service: bytes = b""
    body: Frames = ()
    number: int = 0  # requests made so far; the current one's number
    attempt: int = 0
    partials: int = 0
    deadline: float = math.inf
    first_sent: float = 0.0
    outbox: list[tuple[Frames, int]] = field(default_factory=list)  # frames, request number
    sockets: list[Socket] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)  # requests whose FINAL arrived

    def next_deadline(self) -> float | None:
        """The reply timeout, while waiting (MDP-D-19)."""
        return self.deadline if self.state is S.WAITING else None

    def advance(self, now: float, events: list[ClientEvent]) -> None:
        """MDP-D-03: a timeout due at or before ``now`` fires before the input."""
        self.now = now
        if self.state is not S.WAITING or now < self.deadline:
            return
        self.outbox.clear()  # the socket is closed (MDP-C-08)
        if self.attempt <= CONFIG.retries and not self.partials:
            events.append(ReconnectRequired("timeout", now, now))
            self.state = S.RECONNECTING
            return
        reason: FailureReason = "timeout-after-partial" if self.partials else "retries-exhausted"
        events.append(RequestFailed(self.service, self.attempt, reason, now))
        events.append(ReconnectRequired("request-failed", now, now))
        self.state = S.DISCONNECTED

    def send_request(self, now: float, events: list[ClientEvent]) -> None:
        """REQUEST on the current socket, the timeout from now."""
        self.attempt += 1
        self.partials = 0
        self.deadline = now + TIMEOUT
        self.outbox.append((request(self.service, self.body), self.number))
        events.append(RequestSent(self.service, self.attempt, now))
        self.state = S.WAITING

    def connect(self, now: float) -> list[ClientEvent]:
        """MDP-C-04: a new socket; an outstanding request is resent on it (MDP-C-08)."""
        events: list[ClientEvent] = []
        self.advance(now, events)
        self.sockets.append(Socket())
        if self.state is S.RECONNECTING:
            self.send_request(now, events)
        else:
            self.state = S.IDLE
        return events

    def request(self, service: bytes, body: Frames, now: float) -> list[ClientEvent]:
        """MDP-C-01: a new request, attempt 1."""
        events: list[ClientEvent] = []
        self.advance(now, events)
        self.service, self.body = service, body
        self.number += 1
        self.attempt = 0
        self.first_sent = now
        self.send_request(now, events)
        return events

    def receive(self, kind: str, now: float, **details: object) -> list[ClientEvent]:
        """A message from the broker: partial, final, request (unexpected) or malformed."""
        events: list[ClientEvent] = []
        self.advance(now, events)
        if self.state not in (S.IDLE, S.WAITING):  # MDP-C-08: a socket given up
            events.append(MessageDropped(None, "", now))
            return events
        service, body = details.get("service"), details.get("body")
        if kind == "malformed":
            rule = details["rule"]
            assert isinstance(rule, str)
            events.append(ProtocolViolation(None, rule, "", "dropped", now))
        elif kind == "request" or self.state is S.IDLE or service != self.service:
            events.append(ProtocolViolation(None, "MDP-D-20", "", "dropped", now))  # MDP-D-20
        elif kind == "partial":  # MDP-C-05, MDP-D-19
            assert isinstance(body, tuple)
            self.partials += 1
            self.deadline = now + TIMEOUT
            events.append(PartialReceived(self.service, body, self.attempt, now))
        else:  # MDP-C-06
            assert isinstance(body, tuple)
            elapsed = now - self.first_sent
            events.append(FinalReceived(self.service, body, self.attempt, elapsed, now))
            self.answered.add(self.number)
            self.state = S.IDLE
        return events

    def cancel(self, now: float) -> list[ClientEvent]:
        """MDP-C-08: give up the request (if a timeout did not end it at ``now`` already)."""
        events: list[ClientEvent] = []
        self.advance(now, events)
        if self.state in (S.WAITING, S.RECONNECTING):
            events.append(RequestFailed(self.service, self.attempt, "cancelled", now))
            if self.state is S.WAITING:
                self.outbox.clear()
                events.append(ReconnectRequired("request-failed", now, now))
            self.state = S.DISCONNECTED
        return events

    def close(self, now: float) -> list[ClientEvent]:
        """MDP-C-08: the end; an outstanding request fails as cancelled."""
        events: list[ClientEvent] = []
        self.advance(now, events)
        if self.state in (S.WAITING, S.RECONNECTING):
            events.append(RequestFailed(self.service, self.attempt, "cancelled", now))
            self.outbox.clear()  # a REQUEST not yet sent must not go out (nobody would read it)
        self.state = S.CLOSED
        return events


class ClientSessionMachine(RuleBasedStateMachine):
    """Drives a ClientSession and its model side by side."""

    session: ClientSession
    model: ClientModel

    manual_connect: bool

    @initialize(manual_connect=st.booleans())
    def start(self, manual_connect: bool = False) -> None:
        """A fresh session, no socket yet.

        Unless ``manual_connect``, the runtime opens a socket whenever the session has none, as
        ``domo.trio`` does, before each input; with it only the ``connect`` rules do, which
        leaves time for stale replies and misuse in DISCONNECTED and RECONNECTING.
        """
        self.session = ClientSession(CONFIG)
        self.model = ClientModel()
        self.manual_connect = manual_connect

    @precondition(lambda self: self.model.state is S.CLOSED)
    @rule()
    def start_again(self) -> None:
        """The application makes a new session after closing one (the old one is checked)."""
        self.flush()
        self.start(self.manual_connect)

    # -- helpers -------------------------------------------------------------------------------

    def clock(self, step: float) -> float:
        """The time ``step`` after the latest one."""
        return (START if math.isinf(self.model.now) else self.model.now) + step

    def at(self, step: float) -> float:
        """The time ``step`` after the latest one (a socket opened first, if the runtime does)."""
        now = self.clock(step)
        if not self.manual_connect and self.model.state in (S.DISCONNECTED, S.RECONNECTING):
            self.expect(self.session.connected(now), self.model.connect(now))
        return now

    def expect(self, events: list[ClientEvent], expected: list[ClientEvent]) -> None:
        """The session's events are the model's."""
        assert normalized(events) == expected

    def refused(self, call: Callable[[], object]) -> None:
        """Misuse: LocalProtocolError; the invariants and the next flush prove nothing changed."""
        with pytest.raises(LocalProtocolError):
            call()

    def maybe_flush(self, flush: bool) -> None:
        if flush:
            self.flush()

    def reply_service(self, matching: bool, other: int) -> bytes:
        """The service a reply names: the request's, or another one."""
        own = self.model.service or SERVICES[0]
        if matching:
            return own
        others = [service for service in SERVICES if service != own]
        return others[other % len(others)]

    # -- the broker's messages -----------------------------------------------------------------

    @rule(
        step=STEPS,
        final_reply=st.booleans(),
        matching=st.booleans(),
        other=st.integers(0, 3),
        body=bodies,
        flush=st.booleans(),
    )
    def broker_reply(
        self, step: float, final_reply: bool, matching: bool, other: int, body: Frames, flush: bool
    ) -> None:
        """PARTIAL or FINAL, for the service asked or another (MDP-C-05/06, MDP-D-20)."""
        now = self.at(step)
        service = self.reply_service(matching, other)
        command = (mdp.ClientFinal if final_reply else mdp.ClientPartial)(service, body)
        events = self.session.receive(mdp.encode(command), now)
        kind = "final" if final_reply else "partial"
        self.expect(events, self.model.receive(kind, now, service=service, body=body))
        for event in events:  # MDP-S-03: reply bodies reach the application uncopied
            if isinstance(event, PartialReceived | FinalReceived):
                assert all(a is b for a, b in zip(event.body, body, strict=True))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state is S.WAITING)
    @rule(step=GRID, body=bodies, flush=st.booleans())
    def broker_sends_partial(self, step: float, body: Frames, flush: bool) -> None:
        """The common case, made common: a PARTIAL for the request outstanding (MDP-C-05)."""
        self.broker_reply(step, False, True, 0, body, flush)

    @precondition(lambda self: self.model.state is S.WAITING)
    @rule(step=GRID, body=bodies, flush=st.booleans())
    def broker_sends_final(self, step: float, body: Frames, flush: bool) -> None:
        """The common case, made common: the FINAL for the request outstanding (MDP-C-06)."""
        self.broker_reply(step, True, True, 0, body, flush)

    @rule(step=STEPS, body=bodies, flush=st.booleans())
    def broker_request(self, step: float, body: Frames, flush: bool) -> None:
        """A REQUEST from the broker: a client-to-broker command (MDP-D-20)."""
        now = self.at(step)
        frames = mdp.encode(mdp.ClientRequest(self.reply_service(True, 0), body))
        self.expect(self.session.receive(frames, now), self.model.receive("request", now))
        self.maybe_flush(flush)

    @rule(step=STEPS, miss=MALFORMED, flush=st.booleans())
    def broker_malformed(self, step: float, miss: NearMiss, flush: bool) -> None:
        """A near miss of a client command (MDP-C-01..03, MDP-W-08, MDP-D-01)."""
        now = self.at(step)
        events = self.session.receive(miss.frames, now)
        self.expect(events, self.model.receive("malformed", now, rule=miss.rule))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state is S.WAITING)
    @rule(step=GRID, final_reply=st.booleans(), body=bodies, data=st.data(), flush=st.booleans())
    def broker_malformed_reply(
        self, step: float, final_reply: bool, body: Frames, data: st.DataObject, flush: bool
    ) -> None:
        """A near miss of a reply to the request outstanding, where accepting it would show."""
        command = (mdp.ClientFinal if final_reply else mdp.ClientPartial)(self.model.service, body)
        miss = data.draw(st.sampled_from(near_misses(command)))
        self.broker_malformed(step, miss, flush)

    # -- the local application -----------------------------------------------------------------

    @rule(step=STEPS, flush=st.booleans())
    def connect(self, step: float, flush: bool) -> None:
        """``connected()``: only without a socket (MDP-C-04)."""
        now = self.clock(step)
        if self.model.state in (S.DISCONNECTED, S.RECONNECTING):
            self.expect(self.session.connected(now), self.model.connect(now))
        else:
            self.refused(lambda: self.session.connected(now))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state in (S.DISCONNECTED, S.RECONNECTING))
    @rule(flush=st.booleans())
    def reconnect_at_once(self, flush: bool) -> None:
        """The runtime opens the new socket in the same instant (MDP-C-08)."""
        now = self.clock(0.0)
        self.expect(self.session.connected(now), self.model.connect(now))
        self.maybe_flush(flush)

    @rule(step=STEPS, service=st.sampled_from(SERVICES), body=bodies, flush=st.booleans())
    def request(self, step: float, service: bytes, body: Frames, flush: bool) -> None:
        """``request()``: only when connected and idle (MDP-C-07)."""
        now = self.at(step)
        if self.model.state is S.IDLE:
            self.expect(
                self.session.request(service, body, now), self.model.request(service, body, now)
            )
        else:
            self.refused(lambda: self.session.request(service, body, now))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state is S.IDLE)
    @rule(step=GRID, service=st.sampled_from(SERVICES), body=bodies, flush=st.booleans())
    def request_while_idle(self, step: float, service: bytes, body: Frames, flush: bool) -> None:
        """The common case, made common: a request on an idle session (MDP-C-01)."""
        self.request(step, service, body, flush)

    @rule(step=STEPS, bad=BAD_REQUESTS)
    def request_misuse(self, step: float, bad: tuple[object, object]) -> None:
        """A request that cannot go on the wire: refused in any state, nothing changes."""
        now = self.at(step)
        service, body = bad
        self.refused(lambda: self.session.request(service, body, now))  # type: ignore[arg-type]

    @rule(step=STEPS, flush=st.booleans())
    def cancel(self, step: float, flush: bool) -> None:
        """``cancel()``: only with a request outstanding (MDP-C-08)."""
        now = self.at(step)
        if self.model.state in (S.WAITING, S.RECONNECTING):
            self.expect(self.session.cancel(now), self.model.cancel(now))
        else:
            self.refused(lambda: self.session.cancel(now))
        self.maybe_flush(flush)

    @rule(step=STEPS, flush=st.booleans(), linger=st.integers(0, 3))
    def close(self, step: float, flush: bool, linger: int) -> None:
        """``close()`` (MDP-C-08); then, unless it lingers, a new one."""
        now = self.at(step)
        self.expect(self.session.close(now), self.model.close(now))
        self.maybe_flush(flush)
        if linger < 3:  # mostly a new session at once: a closed one has little left to test
            self.start_again()

    # -- time ----------------------------------------------------------------------------------

    @rule(step=STEPS, flush=st.booleans())
    def tick(self, step: float, flush: bool) -> None:
        """Time passes."""
        now = self.at(step)
        events: list[ClientEvent] = []
        self.model.advance(now, events)
        self.expect(self.session.tick(now), events)
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state is S.WAITING)
    @rule(just_before=st.booleans(), flush=st.booleans())
    def tick_at_the_deadline(self, just_before: bool, flush: bool) -> None:
        """Exactly at the reply timeout, or the float just before it (MDP-D-19)."""
        deadline = self.model.deadline
        now = max(math.nextafter(deadline, -math.inf) if just_before else deadline, self.model.now)
        events: list[ClientEvent] = []
        self.model.advance(now, events)
        self.expect(self.session.tick(now), events)
        self.maybe_flush(flush)

    @precondition(lambda self: not math.isinf(self.model.now))
    @rule(
        back=BACKWARDS,
        call=st.sampled_from(["tick", "connected", "receive", "request", "cancel", "close"]),
    )
    def time_goes_backwards(self, back: float, call: str) -> None:
        """MDP-D-03: any call with an earlier ``now`` is refused and changes nothing."""
        now = self.model.now - back
        session = self.session
        calls: dict[str, Callable[[], object]] = {
            "tick": lambda: session.tick(now),
            "connected": lambda: session.connected(now),
            "receive": lambda: session.receive(mdp.encode(mdp.ClientFinal(b"echo", (b"x",))), now),
            "request": lambda: session.request(b"echo", (b"x",), now),
            "cancel": lambda: session.cancel(now),
            "close": lambda: session.close(now),
        }
        self.refused(calls[call])

    # -- the wire ------------------------------------------------------------------------------

    @rule()
    def flush(self) -> None:
        """The runtime sends the outbox: exactly the model's frames, and sane on the wire."""
        taken = self.session.take_outgoing()
        expected = self.model.outbox
        self.model.outbox = []
        assert taken == [frames for frames, _ in expected]
        if not taken:
            return
        assert self.model.sockets, "nothing may be sent before the first connected()"
        socket = self.model.sockets[-1]
        for frames, (_, number) in zip(taken, expected, strict=True):
            assert frames[:2] == (b"MDPC02", b"\x01"), "a client sends only REQUEST"
            if number == self.model.number:  # MDP-S-03: the application's own frames
                assert all(a is b for a, b in zip(frames[3:], self.model.body, strict=True))
            assert number not in socket.requests, "a resend goes on a new socket (MDP-C-08)"
            unanswered = [n for n in socket.requests if n not in self.model.answered]
            assert not unanswered, "a second request before the first's FINAL (MDP-C-07)"
            socket.requests.append(number)

    @invariant()
    def the_session_is_the_model(self) -> None:
        """State, time, deadline and the request outstanding agree with the model."""
        model = self.model
        assert self.session.state is model.state
        assert self.session.now == model.now
        assert self.session.next_deadline() == model.next_deadline()
        outstanding = model.state in (S.WAITING, S.RECONNECTING)
        assert self.session.service == (model.service if outstanding else None)
        assert self.session.attempt == model.attempt

    def teardown(self) -> None:
        """Whatever is left in the outbox is checked too."""
        if hasattr(self, "session"):
            self.flush()


TestClientSessionModel = ClientSessionMachine.TestCase
TestClientSessionModel.settings = settings(deadline=None)
