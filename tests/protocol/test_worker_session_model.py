"""A Hypothesis state machine: ``WorkerSession`` against a model written here from the spec.

The model (``WorkerModel``) restates ``specs/mdp-0.2.md`` for one worker: timers fire first at
every call (MDP-D-03), a heartbeat is due at ``last_sent + interval`` (MDP-D-05), the broker is
lost at ``last_heard + liveness * interval`` (MDP-D-04), the reconnect backoff doubles to its bound
and resets on HEARTBEAT or REQUEST (MDP-D-18), unexpected commands break the dialog (MDP-D-17),
DISCONNECT is obeyed (MDP-W-17). The rules drive the session with every broker message (valid,
unexpected, malformed near misses), every local call (misuse included, which must raise
``LocalProtocolError`` and change nothing), reconnections, and time drawn from an exact grid of
``interval / 4`` steps mixed with floats, plus jumps to exactly a deadline and to just before it.

Every call's events are compared with the model's; every drained outbox is compared frame for
frame and then checked on the wire: per socket READY first and once (MDP-W-09, MDP-W-10),
nothing after a DISCONNECT either way (MDP-W-17, MDP-W-12), no HEARTBEAT within an interval of
anything else sent (MDP-H-03). The invariants compare state, time and deadlines after each step.
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

from domo.protocol import LocalProtocolError, WorkerConfig, WorkerSession, WorkerState, mdp
from domo.protocol.events import (
    MessageDropped,
    ProtocolViolation,
    ReconnectReason,
    ReconnectRequired,
    RequestAbandoned,
    RequestReceived,
    WorkerConnected,
    WorkerEvent,
)
from domo.protocol.mdp import Frames

from .mdp_strategies import NearMiss, addresses, bodies, client_commands, near_misses

S = WorkerState
CONFIG = WorkerConfig(heartbeat_interval=1.0, liveness=3, reconnect_initial=0.25, reconnect_max=2.0)
INTERVAL = CONFIG.heartbeat_interval
SPAN = CONFIG.liveness * CONFIG.heartbeat_interval
SERVICE = b"echo"
START = 100.0

READY = (b"MDPW02", b"\x01", b"echo")
HEARTBEAT = (b"MDPW02", b"\x05")
DISCONNECT = (b"MDPW02", b"\x06")

# Time steps: the exact grid (every deadline of this config lies on it while no float was
# drawn) and floats, which almost never land on a deadline. Mostly shorter than an interval, so
# that a session lives long enough to do things; the jump rules reach the deadlines.
GRID = st.integers(0, 4).map(lambda k: k * INTERVAL / 4)
LONG_GRID = st.integers(0, 4 * CONFIG.liveness + 2).map(lambda k: k * INTERVAL / 4)
FLOATS = st.floats(min_value=0.0, max_value=INTERVAL, allow_nan=False)
STEPS = st.one_of(GRID, GRID, FLOATS, LONG_GRID)
BACKWARDS = st.one_of(
    st.integers(1, 8).map(lambda k: k * INTERVAL / 4),
    st.floats(min_value=1e-9, max_value=SPAN),
)

# What a broker may send that a worker must not accept: READY, PARTIAL and FINAL are valid
# commands but only a worker sends them (MDP-D-17).
UNEXPECTED = st.one_of(
    st.just(READY),
    st.builds(mdp.WorkerReady, st.sampled_from([b"other", b"mmi.service"])).map(mdp.encode),
    st.builds(mdp.WorkerPartial, addresses, bodies).map(mdp.encode),
    st.builds(mdp.WorkerFinal, addresses, bodies).map(mdp.encode),
)
_BROKER_COMMANDS = st.one_of(
    st.builds(mdp.WorkerRequest, addresses, bodies),
    st.just(mdp.WorkerHeartbeat()),
    st.just(mdp.WorkerDisconnect()),
    st.builds(mdp.WorkerReady, st.just(SERVICE)),
    st.builds(mdp.WorkerFinal, addresses, bodies),
)
MALFORMED = st.one_of(
    _BROKER_COMMANDS.flatmap(lambda command: st.sampled_from(near_misses(command))),
    client_commands.map(lambda command: NearMiss("client", mdp.encode(command), "MDP-W-08")),
    st.just(NearMiss("empty", (), "MDP-W-08")),
)
# Near misses of what a broker legitimately sends: accepting one would show at once.
MALFORMED_BROKER_COMMAND = st.one_of(
    st.builds(mdp.WorkerRequest, addresses, bodies),
    st.just(mdp.WorkerHeartbeat()),
    st.just(mdp.WorkerDisconnect()),
).flatmap(lambda command: st.sampled_from(near_misses(command)))
BAD_BODIES: st.SearchStrategy[object] = st.sampled_from(
    [(), [], b"one bytes value", ("text",), [b"ok", None], None]
)


def partial(client: bytes, body: Frames) -> Frames:
    """A worker PARTIAL (MDP-W-03)."""
    return (b"MDPW02", b"\x03", client, b"", *body)


def final(client: bytes, body: Frames) -> Frames:
    """A worker FINAL (MDP-W-04)."""
    return (b"MDPW02", b"\x04", client, b"", *body)


def normalized(events: list[WorkerEvent]) -> list[WorkerEvent]:
    """Events with free-text reasons blanked, after checking there is one."""
    out: list[WorkerEvent] = []
    for event in events:
        if isinstance(event, ProtocolViolation | MessageDropped):
            assert event.reason, event
            event = replace(event, reason="")
        out.append(event)
    return out


@dataclass
class Socket:
    """What went out on one socket, as the wire would see it."""

    sent: list[tuple[Frames, float]] = field(default_factory=list)
    broker_disconnected: bool = False  # DISCONNECT received on it (MDP-W-17)


@dataclass
class WorkerModel:
    """One worker session as the spec describes it."""

    state: WorkerState = S.DISCONNECTED
    now: float = -math.inf
    last_heard: float = 0.0
    last_sent: float = 0.0
    reconnect_at: float = -math.inf
    backoff: float = CONFIG.reconnect_initial
    client: bytes | None = None
    requests: int = 0
    outbox: list[tuple[Frames, float]] = field(default_factory=list)
    sockets: list[Socket] = field(default_factory=list)

    @property
    def connected(self) -> bool:
        """IDLE or BUSY: a socket with READY sent on it."""
        return self.state in (S.IDLE, S.BUSY)

    def next_deadline(self) -> float | None:
        """MDP-D-05 and MDP-D-04 while connected; the backoff while disconnected."""
        if self.connected:
            return min(self.last_sent + INTERVAL, self.last_heard + SPAN)
        return self.reconnect_at if self.state is S.DISCONNECTED else None

    def send(self, frames: Frames, now: float) -> None:
        """Queue ``frames``; anything sent delays the next heartbeat (MDP-H-03)."""
        self.outbox.append((frames, now))
        self.last_sent = now

    def advance(self, now: float, events: list[WorkerEvent]) -> None:
        """MDP-D-03: timers due at or before ``now`` fire before the input."""
        self.now = now
        if not self.connected:
            return
        if now >= self.last_heard + SPAN:  # MDP-D-04, MDP-H-05
            self.lose("broker-lost", now, events)
        elif now >= self.last_sent + INTERVAL:  # MDP-D-05, MDP-H-04 (busy or not)
            self.send(HEARTBEAT, now)

    def lose(
        self, reason: ReconnectReason, now: float, events: list[WorkerEvent], kick: bool = False
    ) -> None:
        """Give up the socket: abandon the request, discard the outbox, back off (MDP-D-18)."""
        if self.client is not None:
            events.append(RequestAbandoned(self.client, reason, now))
            self.client = None
        self.outbox.clear()
        self.reconnect_at = now + self.backoff
        self.backoff = min(2 * self.backoff, CONFIG.reconnect_max)
        events.append(ReconnectRequired(reason, self.reconnect_at, now))
        self.state = S.DISCONNECTED
        if kick:  # MDP-D-17: tell the broker, then nothing more
            self.send(DISCONNECT, now)

    def heard(self, now: float) -> None:
        """MDP-H-02, MDP-D-18: the broker answered."""
        self.last_heard = now
        self.backoff = CONFIG.reconnect_initial

    def connect(self, now: float) -> list[WorkerEvent]:
        """MDP-W-09: a new socket, READY on it (the old socket's leftovers are not sent)."""
        self.now = now
        self.outbox.clear()
        self.sockets.append(Socket())
        self.last_heard = now
        self.send(READY, now)
        self.state = S.IDLE
        return [WorkerConnected(SERVICE, now)]

    def receive(self, kind: str, now: float, **details: object) -> list[WorkerEvent]:
        """A message from the broker: request, heartbeat, disconnect, unexpected, malformed."""
        events: list[WorkerEvent] = []
        self.advance(now, events)
        if not self.connected:  # MDP-W-17: a socket given up
            events.append(MessageDropped(None, "", now))
            return events
        if kind == "malformed":  # MDP-W-08: dropped, no heartbeat
            rule = details["rule"]
            assert isinstance(rule, str)
            events.append(ProtocolViolation(None, rule, "", "dropped", now))
        elif kind == "heartbeat":
            self.heard(now)
        elif kind == "disconnect":
            self.sockets[-1].broker_disconnected = True
            self.lose("broker-disconnect", now, events)
        elif kind == "request" and self.state is S.IDLE:
            self.heard(now)
            client, body = details["client"], details["body"]
            assert isinstance(client, bytes)
            assert isinstance(body, tuple)
            self.client = client
            self.requests += 1
            events.append(RequestReceived(client, body, self.requests, now))
            self.state = S.BUSY
        else:  # READY/PARTIAL/FINAL, or REQUEST while busy: MDP-D-17
            events.append(ProtocolViolation(None, "MDP-D-17", "", "reconnecting", now))
            self.lose("protocol-violation", now, events, kick=True)
        return events

    def reply(self, final_reply: bool, body: Frames, now: float) -> list[WorkerEvent]:
        """MDP-R-01: a PARTIAL or the FINAL, if the broker is still there at ``now``."""
        events: list[WorkerEvent] = []
        self.advance(now, events)
        if self.state is S.BUSY:
            assert self.client is not None
            self.send((final if final_reply else partial)(self.client, body), now)
            if final_reply:
                self.client = None
                self.state = S.IDLE
        return events

    def close(self, now: float) -> list[WorkerEvent]:
        """MDP-W-12, MDP-D-22: DISCONNECT if connected, abandon a request, CLOSED."""
        events: list[WorkerEvent] = []
        self.advance(now, events)
        if self.client is not None:
            events.append(RequestAbandoned(self.client, "local-disconnect", now))
            self.client = None
        if self.connected:
            self.send(DISCONNECT, now)
        self.state = S.CLOSED
        return events


class WorkerSessionMachine(RuleBasedStateMachine):
    """Drives a WorkerSession and its model side by side."""

    session: WorkerSession
    model: WorkerModel

    manual_connect: bool

    @initialize(manual_connect=st.booleans())
    def start(self, manual_connect: bool = False) -> None:
        """A fresh session, no socket yet.

        Unless ``manual_connect``, the runtime opens a socket as soon as the backoff allows, as
        ``domo.trio`` does, before each input; with it only the ``connect`` rules do, which
        leaves time for stale messages and misuse while DISCONNECTED.
        """
        self.session = WorkerSession(SERVICE, CONFIG)
        self.model = WorkerModel()
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
        """The time ``step`` after the latest one.

        Unless connections are manual, a disconnected session gets its new socket first: the
        runtime waits out the backoff, so the input comes no earlier than ``reconnect_at``.
        """
        now = self.clock(step)
        model = self.model
        if not self.manual_connect and model.state is S.DISCONNECTED:
            now = max(now, model.reconnect_at)
            self.flush()  # what the old socket still had to send goes out before it closes
            self.expect(self.session.connected(now), model.connect(now))
        return now

    def expect(self, events: list[WorkerEvent], expected: list[WorkerEvent]) -> None:
        """The session's events are the model's."""
        assert normalized(events) == expected

    def refused(self, call: Callable[[], object]) -> None:
        """Misuse: LocalProtocolError; the invariants and the next flush prove nothing changed."""
        with pytest.raises(LocalProtocolError):
            call()

    def maybe_flush(self, flush: bool) -> None:
        if flush:
            self.flush()

    # -- the broker's messages -----------------------------------------------------------------

    @rule(step=STEPS, client=addresses, body=bodies, flush=st.booleans())
    def broker_request(self, step: float, client: bytes, body: Frames, flush: bool) -> None:
        """REQUEST (MDP-W-02, MDP-R-01); while busy it is unexpected (MDP-D-17)."""
        now = self.at(step)
        events = self.session.receive(mdp.encode(mdp.WorkerRequest(client, body)), now)
        expected = self.model.receive("request", now, client=client, body=body)
        self.expect(events, expected)
        for event in events:  # MDP-S-03: the body reaches the application uncopied
            if isinstance(event, RequestReceived):
                assert all(a is b for a, b in zip(event.body, body, strict=True))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state is S.IDLE)
    @rule(step=GRID, client=addresses, body=bodies, flush=st.booleans())
    def broker_request_while_idle(
        self, step: float, client: bytes, body: Frames, flush: bool
    ) -> None:
        """The common case, made common: a REQUEST for an idle worker (MDP-R-01)."""
        self.broker_request(step, client, body, flush)

    @rule(step=STEPS, flush=st.booleans())
    def broker_heartbeat(self, step: float, flush: bool) -> None:
        """HEARTBEAT (MDP-W-05, MDP-H-02)."""
        now = self.at(step)
        self.expect(self.session.receive(HEARTBEAT, now), self.model.receive("heartbeat", now))
        self.maybe_flush(flush)

    @rule(step=STEPS, frames=st.one_of(st.just(DISCONNECT), UNEXPECTED), flush=st.booleans())
    def broker_ends_the_dialog(self, step: float, frames: Frames, flush: bool) -> None:
        """DISCONNECT (MDP-W-06, MDP-W-17), or READY/PARTIAL/FINAL from the broker (MDP-D-17)."""
        now = self.at(step)
        kind = "disconnect" if frames == DISCONNECT else "unexpected"
        self.expect(self.session.receive(frames, now), self.model.receive(kind, now))
        self.maybe_flush(flush)

    @rule(step=STEPS, miss=MALFORMED, flush=st.booleans())
    def broker_malformed(self, step: float, miss: NearMiss, flush: bool) -> None:
        """A near miss of a broker command (MDP-W-08, MDP-R-02, MDP-D-01, MDP-D-02)."""
        now = self.at(step)
        events = self.session.receive(miss.frames, now)
        self.expect(events, self.model.receive("malformed", now, rule=miss.rule))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.connected)
    @rule(step=GRID, miss=MALFORMED_BROKER_COMMAND, flush=st.booleans())
    def broker_malformed_command(self, step: float, miss: NearMiss, flush: bool) -> None:
        """A near miss of REQUEST, HEARTBEAT or DISCONNECT while connected."""
        self.broker_malformed(step, miss, flush)

    # -- the local application -----------------------------------------------------------------

    @rule(step=STEPS, flush=st.booleans())
    def connect(self, step: float, flush: bool) -> None:
        """``connected()``: allowed only while disconnected and after the backoff (MDP-D-18)."""
        now = self.clock(step)
        if self.model.state is S.DISCONNECTED and now >= self.model.reconnect_at:
            self.expect(self.session.connected(now), self.model.connect(now))
        else:
            self.refused(lambda: self.session.connected(now))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state is S.DISCONNECTED)
    @rule(flush=st.booleans())
    def reconnect_as_soon_as_allowed(self, flush: bool) -> None:
        """``connected()`` at exactly ``reconnect_at`` (MDP-D-18, MDP-W-17: a new socket)."""
        now = max(self.clock(0.0), self.model.reconnect_at)
        self.expect(self.session.connected(now), self.model.connect(now))
        self.maybe_flush(flush)

    @rule(step=STEPS, body=bodies, final_reply=st.booleans(), flush=st.booleans())
    def reply(self, step: float, body: Frames, final_reply: bool, flush: bool) -> None:
        """``send_partial`` / ``send_final``: only while busy (MDP-R-01)."""
        now = self.at(step)
        call = self.session.send_final if final_reply else self.session.send_partial
        if self.model.state is not S.BUSY:
            self.refused(lambda: call(body, now))
        else:
            self.expect(call(body, now), self.model.reply(final_reply, body, now))
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.state is S.BUSY)
    @rule(step=GRID, body=bodies, flush=st.booleans())
    def partial_while_busy(self, step: float, body: Frames, flush: bool) -> None:
        """The common case, made common: a PARTIAL while busy (MDP-R-01)."""
        self.reply(step, body, False, flush)

    @precondition(lambda self: self.model.state is S.BUSY)
    @rule(step=GRID, body=bodies, flush=st.booleans())
    def final_while_busy(self, step: float, body: Frames, flush: bool) -> None:
        """The common case, made common: the FINAL while busy (MDP-R-01)."""
        self.reply(step, body, True, flush)

    @rule(step=STEPS, body=BAD_BODIES, final_reply=st.booleans())
    def reply_with_a_bad_body(self, step: float, body: object, final_reply: bool) -> None:
        """A body that cannot go on the wire: refused, busy or not, nothing changes."""
        now = self.at(step)
        call = self.session.send_final if final_reply else self.session.send_partial
        self.refused(lambda: call(body, now))  # type: ignore[arg-type]

    @rule(step=STEPS, flush=st.booleans(), linger=st.integers(0, 3))
    def close(self, step: float, flush: bool, linger: int) -> None:
        """``disconnect()`` (MDP-W-12, MDP-D-22); then, unless it lingers, a new one."""
        now = self.at(step)
        self.expect(self.session.disconnect(now), self.model.close(now))
        self.maybe_flush(flush)
        if linger < 3:  # mostly a new session at once: a closed one has little left to test
            self.start_again()

    # -- time ----------------------------------------------------------------------------------

    @rule(step=STEPS, flush=st.booleans())
    def tick(self, step: float, flush: bool) -> None:
        """Time passes."""
        now = self.at(step)
        events: list[WorkerEvent] = []
        self.model.advance(now, events)
        self.expect(self.session.tick(now), events)
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.connected)
    @rule(just_before=st.booleans(), flush=st.booleans())
    def tick_at_the_deadline(self, just_before: bool, flush: bool) -> None:
        """Exactly at the next deadline (heartbeat or broker loss), or the float just before."""
        deadline = self.model.next_deadline()
        assert deadline is not None
        now = math.nextafter(deadline, -math.inf) if just_before else deadline
        now = max(now, self.model.now)
        events: list[WorkerEvent] = []
        self.model.advance(now, events)
        self.expect(self.session.tick(now), events)
        self.maybe_flush(flush)

    @precondition(lambda self: self.model.connected)
    @rule(just_before=st.booleans(), flush=st.booleans())
    def jump_to_broker_expiry(self, just_before: bool, flush: bool) -> None:
        """Straight to ``last_heard + liveness * interval`` (MDP-D-04), past any heartbeat due."""
        expiry = self.model.last_heard + SPAN
        now = max(math.nextafter(expiry, -math.inf) if just_before else expiry, self.model.now)
        events: list[WorkerEvent] = []
        self.model.advance(now, events)
        self.expect(self.session.tick(now), events)
        self.maybe_flush(flush)

    @precondition(lambda self: not math.isinf(self.model.now))
    @rule(
        back=BACKWARDS,
        call=st.sampled_from(["tick", "connected", "receive", "partial", "final", "disconnect"]),
    )
    def time_goes_backwards(self, back: float, call: str) -> None:
        """MDP-D-03: any call with an earlier ``now`` is refused and changes nothing."""
        now = self.model.now - back
        session = self.session
        calls: dict[str, Callable[[], object]] = {
            "tick": lambda: session.tick(now),
            "connected": lambda: session.connected(now),
            "receive": lambda: session.receive(HEARTBEAT, now),
            "partial": lambda: session.send_partial((b"late",), now),
            "final": lambda: session.send_final((b"late",), now),
            "disconnect": lambda: session.disconnect(now),
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
        socket = self.model.sockets[-1]  # the runtime sends on the socket it has, then closes it
        for frames, sent_at in expected:
            assert not socket.broker_disconnected, "sent after DISCONNECT from the broker"
            if socket.sent:
                previous, previous_at = socket.sent[-1]
                assert previous != DISCONNECT, "sent after our own DISCONNECT (MDP-W-12)"
                assert frames != READY, "a second READY on one socket (MDP-W-10)"
                if frames == HEARTBEAT:  # MDP-H-03: only after an interval of silence
                    assert sent_at >= previous_at + INTERVAL
            else:  # MDP-W-09: READY first; MDP-W-12: DISCONNECT may come even before READY
                assert frames in (READY, DISCONNECT), "READY comes first on a socket"
            socket.sent.append((frames, sent_at))

    @invariant()
    def the_session_is_the_model(self) -> None:
        """State, time, deadlines and the request in progress agree with the model."""
        model = self.model
        assert self.session.state is model.state
        assert self.session.now == model.now
        assert self.session.next_deadline() == model.next_deadline()
        expires = model.last_heard + SPAN if model.connected else None
        assert self.session.broker_expires_at == expires
        assert self.session.current_client == model.client
        assert self.session.current_request == (model.requests if model.client else None)
        if model.state is S.DISCONNECTED:
            assert self.session.reconnect_at == model.reconnect_at

    def teardown(self) -> None:
        """Whatever is left in the outbox is checked too."""
        if hasattr(self, "session"):
            self.flush()


TestWorkerSessionModel = WorkerSessionMachine.TestCase
TestWorkerSessionModel.settings = settings(deadline=None)
