"""The worker's side of MDP/0.2 as a sans-IO state machine.

A ``WorkerSession`` is one worker serving one service through one broker (MDP-W-07, MDP-W-09).
It lives across sockets: each time the I/O layer opens a new DEALER it calls ``connected(now)``,
and the session queues READY (once per socket, MDP-W-10). When the session decides the socket is
finished (DISCONNECT from the broker, the broker silent for ``liveness * heartbeat_interval``, or
a broker that broke the dialog) it emits ``ReconnectRequired``: the I/O layer sends what is left
in the outbox, closes the socket and opens a new one at ``reconnect_at`` (MDP-W-17, MDP-H-06).
The delay grows exponentially up to a bound and resets once a broker answers (MDP-D-18).

The application answers each ``RequestReceived`` with ``send_partial`` (any number) and exactly
one ``send_final`` (MDP-R-01); both raise ``LocalProtocolError`` unless the session is busy.
Heartbeats go out whenever nothing else was sent for ``heartbeat_interval`` (MDP-H-03, MDP-H-04),
busy or not, so a runtime must keep calling ``tick`` while its handler works.

States and inputs are the table ``WORKER_SESSION_TRANSITIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from . import mdp
from ._session import Cell, SessionBase
from .errors import LocalProtocolError, MalformedMessage
from .events import (
    MessageDropped,
    ProtocolViolation,
    ReconnectReason,
    ReconnectRequired,
    RequestAbandoned,
    RequestReceived,
    ViolationAction,
    WorkerConnected,
    WorkerEvent,
)

__all__ = [
    "WORKER_SESSION_TRANSITIONS",
    "WorkerAction",
    "WorkerConfig",
    "WorkerSession",
    "WorkerSessionInput",
    "WorkerState",
]


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Timing of a worker session.

    ``heartbeat_interval`` and ``liveness`` must match the broker's (MDP-H-04). Reconnection
    waits ``reconnect_initial`` seconds, doubling after each failed connection up to
    ``reconnect_max`` (MDP-D-18).
    """

    heartbeat_interval: float = 2.5
    liveness: int = 3
    reconnect_initial: float = 0.25
    reconnect_max: float = 8.0

    def __post_init__(self) -> None:
        if not self.heartbeat_interval > 0:
            raise ValueError(f"heartbeat_interval must be > 0, got {self.heartbeat_interval}")
        if self.liveness < 1:
            raise ValueError(f"liveness must be >= 1, got {self.liveness}")
        if not 0 <= self.reconnect_initial <= self.reconnect_max:
            raise ValueError("need 0 <= reconnect_initial <= reconnect_max")


class WorkerState(Enum):
    """Where a worker session is."""

    DISCONNECTED = "disconnected"  # no socket; open one at ``reconnect_at``
    IDLE = "idle"  # READY sent, waiting for a request
    BUSY = "busy"  # handling one request
    CLOSED = "closed"  # the application ended the session

    __hash__ = object.__hash__


class WorkerSessionInput(Enum):
    """Everything that can happen to a worker session."""

    CONNECT = "connected()"
    REQUEST = "REQUEST"
    HEARTBEAT = "HEARTBEAT"
    DISCONNECT = "DISCONNECT"
    UNEXPECTED = "READY/PARTIAL/FINAL from the broker"
    INVALID = "malformed message"
    SEND_PARTIAL = "send_partial()"
    SEND_FINAL = "send_final()"
    CLOSE = "disconnect()"
    HEARTBEAT_DUE = "heartbeat due"
    BROKER_EXPIRED = "broker silent too long"

    __hash__ = object.__hash__


class WorkerAction(Enum):
    """The steps of a worker session transition, in order."""

    SEND_READY = "send READY"
    REFRESH = "refresh broker liveness"
    DELIVER_REQUEST = "emit RequestReceived"
    SEND_PARTIAL = "send PARTIAL"
    SEND_FINAL = "send FINAL"
    SEND_HEARTBEAT = "send HEARTBEAT"
    SEND_DISCONNECT = "send DISCONNECT"
    ABANDON = "abandon the current request"
    RECONNECT = "discard the outbox, schedule a new socket"
    DROP = "drop the message"


def _build_table() -> dict[tuple[WorkerState, WorkerSessionInput], Cell[WorkerState, WorkerAction]]:
    S, In, A = WorkerState, WorkerSessionInput, WorkerAction
    C = Cell
    table: dict[tuple[WorkerState, WorkerSessionInput], Cell[WorkerState, WorkerAction]] = {}
    remote = (In.REQUEST, In.HEARTBEAT, In.DISCONNECT, In.UNEXPECTED, In.INVALID)
    timers = (In.HEARTBEAT_DUE, In.BROKER_EXPIRED)
    not_busy = "send_partial/send_final need a request in progress"

    for state in (S.DISCONNECTED, S.CLOSED):
        for input_ in remote:  # stale messages from a socket the session has given up
            table[state, input_] = C(None, (A.DROP,), "MDP-W-17")
        for input_ in timers:
            table[state, input_] = C(None, (), "MDP-D-03")
        table[state, In.SEND_PARTIAL] = C(None, (), "MDP-R-01", error=not_busy)
        table[state, In.SEND_FINAL] = C(None, (), "MDP-R-01", error=not_busy)
    table[S.DISCONNECTED, In.CONNECT] = C(S.IDLE, (A.SEND_READY,), "MDP-W-09")
    table[S.DISCONNECTED, In.CLOSE] = C(S.CLOSED, (), "MDP-W-12")
    table[S.CLOSED, In.CONNECT] = C(None, (), "MDP-W-12", error="the session is closed")
    table[S.CLOSED, In.CLOSE] = C(None, (), "MDP-W-12")

    for state in (S.IDLE, S.BUSY):
        table[state, In.CONNECT] = C(None, (), "MDP-W-10", error="already connected")
        table[state, In.HEARTBEAT] = C(None, (A.REFRESH,), "MDP-H-02")
        table[state, In.INVALID] = C(None, (A.DROP,), "MDP-W-08", violation=True)
        table[state, In.HEARTBEAT_DUE] = C(None, (A.SEND_HEARTBEAT,), "MDP-H-04")
    # From IDLE.
    table[S.IDLE, In.REQUEST] = C(S.BUSY, (A.REFRESH, A.DELIVER_REQUEST), "MDP-R-01")
    table[S.IDLE, In.DISCONNECT] = C(S.DISCONNECTED, (A.RECONNECT,), "MDP-W-17")
    table[S.IDLE, In.UNEXPECTED] = C(
        S.DISCONNECTED, (A.RECONNECT, A.SEND_DISCONNECT), "MDP-D-17", violation=True
    )
    table[S.IDLE, In.SEND_PARTIAL] = C(None, (), "MDP-R-01", error=not_busy)
    table[S.IDLE, In.SEND_FINAL] = C(None, (), "MDP-R-01", error=not_busy)
    table[S.IDLE, In.CLOSE] = C(S.CLOSED, (A.SEND_DISCONNECT,), "MDP-W-12")
    table[S.IDLE, In.BROKER_EXPIRED] = C(S.DISCONNECTED, (A.RECONNECT,), "MDP-H-06")
    # From BUSY: losing the connection abandons the request; the broker re-dispatches it.
    drop_and_kick = (A.ABANDON, A.RECONNECT, A.SEND_DISCONNECT)
    table[S.BUSY, In.REQUEST] = C(S.DISCONNECTED, drop_and_kick, "MDP-D-17", violation=True)
    table[S.BUSY, In.UNEXPECTED] = C(S.DISCONNECTED, drop_and_kick, "MDP-D-17", violation=True)
    table[S.BUSY, In.DISCONNECT] = C(S.DISCONNECTED, (A.ABANDON, A.RECONNECT), "MDP-W-17")
    table[S.BUSY, In.SEND_PARTIAL] = C(None, (A.SEND_PARTIAL,), "MDP-R-01")
    table[S.BUSY, In.SEND_FINAL] = C(S.IDLE, (A.SEND_FINAL,), "MDP-R-01")
    table[S.BUSY, In.CLOSE] = C(S.CLOSED, (A.ABANDON, A.SEND_DISCONNECT), "MDP-D-22")
    table[S.BUSY, In.BROKER_EXPIRED] = C(S.DISCONNECTED, (A.ABANDON, A.RECONNECT), "MDP-H-06")
    return table


WORKER_SESSION_TRANSITIONS: Final[
    Mapping[tuple[WorkerState, WorkerSessionInput], Cell[WorkerState, WorkerAction]]
] = _build_table()

# The FINAL of a busy session, the usual reply: its cell, taken from the table once.
_BUSY_FINAL: Final = WORKER_SESSION_TRANSITIONS[WorkerState.BUSY, WorkerSessionInput.SEND_FINAL]
assert _BUSY_FINAL.actions == (WorkerAction.SEND_FINAL,)
assert _BUSY_FINAL.error is None

_INPUT_OF_CODE: Final = {
    mdp.W_REQUEST: WorkerSessionInput.REQUEST,
    mdp.W_HEARTBEAT: WorkerSessionInput.HEARTBEAT,
    mdp.W_DISCONNECT: WorkerSessionInput.DISCONNECT,
    mdp.W_READY: WorkerSessionInput.UNEXPECTED,
    mdp.W_PARTIAL: WorkerSessionInput.UNEXPECTED,
    mdp.W_FINAL: WorkerSessionInput.UNEXPECTED,
}

_RECONNECT_REASONS: Final[dict[WorkerSessionInput, ReconnectReason]] = {
    WorkerSessionInput.DISCONNECT: "broker-disconnect",
    WorkerSessionInput.BROKER_EXPIRED: "broker-lost",
    WorkerSessionInput.REQUEST: "protocol-violation",
    WorkerSessionInput.UNEXPECTED: "protocol-violation",
}


class WorkerSession(SessionBase[WorkerState, WorkerSessionInput, WorkerAction]):
    """One MDP/0.2 worker for ``service``, across as many sockets as it takes.

    Start: the I/O layer opens a DEALER to the broker and calls ``connected(now)``.
    """

    _table = WORKER_SESSION_TRANSITIONS

    def __init__(self, service: bytes, config: WorkerConfig | None = None) -> None:
        super().__init__(WorkerState.DISCONNECTED)
        self.service = mdp.check_service(service)
        self.config = config if config is not None else WorkerConfig()
        self._interval = self.config.heartbeat_interval
        self._span = self.config.liveness * self.config.heartbeat_interval
        self._last_heard = 0.0  # from the broker, on this socket
        self._last_sent = 0.0  # to the broker, on this socket
        self._reconnect_at = float("-inf")
        # The wait before the next reconnection: doubles after each connection that ended
        # before the broker answered, up to reconnect_max (MDP-D-18). Kept as the delay itself,
        # not as a count of failures: 2.0**count overflows after 1024 failed connections.
        self._backoff = self.config.reconnect_initial
        self._client: bytes | None = None
        self._requests = 0  # requests received over the session's life

    # -- views ---------------------------------------------------------------------------------

    @property
    def reconnect_at(self) -> float:
        """When ``connected()`` may next be called (meaningful while DISCONNECTED)."""
        return self._reconnect_at

    @property
    def current_client(self) -> bytes | None:
        """The client address of the request in progress, if busy."""
        return self._client

    @property
    def current_request(self) -> int | None:
        """The number (from 1) of the request in progress, if busy; see ``RequestReceived``."""
        return self._requests if self._client is not None else None

    @property
    def broker_expires_at(self) -> float | None:
        """When the broker will count as lost if it stays silent (None while disconnected)."""
        if self._state in (WorkerState.IDLE, WorkerState.BUSY):
            return self._last_heard + self._span
        return None

    # -- the sans-IO contract ------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When ``tick`` (or, when disconnected, ``connected``) should next be called."""
        if self._state in (WorkerState.IDLE, WorkerState.BUSY):
            return min(self._last_sent + self._interval, self._last_heard + self._span)
        if self._state is WorkerState.DISCONNECTED:
            return self._reconnect_at
        return None

    def tick(self, now: float) -> list[WorkerEvent]:
        """Send a heartbeat if one is due; notice a silent broker."""
        self._check_time(now)
        events: list[WorkerEvent] = []
        self._advance(now, events)
        return events

    def connected(self, now: float) -> list[WorkerEvent]:
        """A new socket is connected to the broker: queue READY on it (MDP-W-09)."""
        self._check_time(now)
        cell = self._cell(WorkerSessionInput.CONNECT)
        if now < self._reconnect_at:
            raise LocalProtocolError(f"reconnect backoff runs until {self._reconnect_at}")
        events: list[WorkerEvent] = []
        self._now = now
        self._apply(cell, WorkerSessionInput.CONNECT, now, events)
        return events

    def receive(self, frames: Sequence[bytes], now: float) -> list[WorkerEvent]:
        """Handle one message from the broker."""
        self._check_time(now)
        events: list[WorkerEvent] = []
        self._advance(now, events)
        reason = rule = ""
        body: mdp.Frames = ()
        client = b""
        if not frames or frames[0] != mdp.WORKER_HEADER:
            input_ = WorkerSessionInput.INVALID
            reason, rule = "not an MDP/Worker message (header is not b'MDPW02')", "MDP-W-08"
        else:
            try:
                code = mdp.validate_worker(frames)
            except MalformedMessage as error:
                input_ = WorkerSessionInput.INVALID
                reason, rule = error.reason, error.rule
            else:
                input_ = _INPUT_OF_CODE[code]
                if input_ is WorkerSessionInput.REQUEST:
                    client, body = frames[2], tuple(frames[4:])
        cell = self._table[self._state, input_]
        if cell.violation:
            if input_ is WorkerSessionInput.UNEXPECTED or input_ is WorkerSessionInput.REQUEST:
                reason = f"the broker sent {input_.value} while the worker was {self._state.value}"
            action: ViolationAction = (
                "dropped" if input_ is WorkerSessionInput.INVALID else "reconnecting"
            )
            events.append(ProtocolViolation(None, rule or cell.rule, reason, action, now))
        self._apply(cell, input_, now, events, client=client, body=body)
        return events

    def send_partial(self, body: Sequence[bytes], now: float) -> list[WorkerEvent]:
        """Queue a PARTIAL for the request in progress (MDP-R-01)."""
        return self._reply(WorkerSessionInput.SEND_PARTIAL, body, now)

    def send_final(self, body: Sequence[bytes], now: float) -> list[WorkerEvent]:
        """Queue the FINAL for the request in progress; the session is then idle (MDP-R-01).

        Raises ``LocalProtocolError`` unless busy. If the broker turns out to be lost at
        ``now``, the reply is not sent and the events say so (``RequestAbandoned``).
        """
        # The common case first: busy, the clock not going back, no timer due at ``now`` (the
        # broker not lost, no heartbeat due): what ``_reply`` would do then, without its calls.
        if (
            self._state is WorkerState.BUSY
            and self._now <= now < self._last_heard + self._span
            and now < self._last_sent + self._interval
        ):
            frames = mdp.check_body(body)
            client = self._client
            assert client is not None
            self._now = self._last_sent = now
            self._outbox.append((mdp.WORKER_HEADER, mdp.W_FINAL, client, b"", *frames))
            self._client = None
            self._state = _BUSY_FINAL.next_state  # type: ignore[assignment]
            return []
        return self._reply(WorkerSessionInput.SEND_FINAL, body, now)

    def disconnect(self, now: float) -> list[WorkerEvent]:
        """End the session: DISCONNECT to the broker if connected, then CLOSED (MDP-W-12)."""
        self._check_time(now)
        events: list[WorkerEvent] = []
        self._advance(now, events)
        cell = self._cell(WorkerSessionInput.CLOSE)
        self._apply(cell, WorkerSessionInput.CLOSE, now, events)
        return events

    # -- internals -----------------------------------------------------------------------------

    def _reply(
        self, input_: WorkerSessionInput, body: Sequence[bytes], now: float
    ) -> list[WorkerEvent]:
        self._check_time(now)
        self._cell(input_)  # refuse misuse before anything changes
        frames = mdp.check_body(body)
        events: list[WorkerEvent] = []
        self._advance(now, events)
        if self._state is WorkerState.BUSY:
            self._apply(self._table[self._state, input_], input_, now, events, body=frames)
        return events

    def _advance(self, now: float, events: list[WorkerEvent]) -> None:
        self._now = now
        if self._state is not WorkerState.IDLE and self._state is not WorkerState.BUSY:
            return
        if now >= self._last_heard + self._span:
            input_ = WorkerSessionInput.BROKER_EXPIRED
        elif now >= self._last_sent + self._interval:
            input_ = WorkerSessionInput.HEARTBEAT_DUE
        else:
            return
        self._apply(self._table[self._state, input_], input_, now, events)

    def _apply(
        self,
        cell: Cell[WorkerState, WorkerAction],
        input_: WorkerSessionInput,
        now: float,
        events: list[WorkerEvent],
        *,
        client: bytes = b"",
        body: mdp.Frames = (),
    ) -> None:
        for step in cell.actions:
            if step is WorkerAction.REFRESH:
                self._last_heard = now
                self._backoff = self.config.reconnect_initial
            elif step is WorkerAction.SEND_HEARTBEAT:
                self._send(mdp.HEARTBEAT_FRAMES, now)
            elif step is WorkerAction.DELIVER_REQUEST:
                self._client = client
                self._requests += 1
                events.append(RequestReceived(client, body, self._requests, now))
            elif step is WorkerAction.SEND_PARTIAL:
                assert self._client is not None
                self._send(mdp.worker_partial_frames(self._client, body), now)
            elif step is WorkerAction.SEND_FINAL:
                assert self._client is not None
                self._send(mdp.worker_final_frames(self._client, body), now)
                self._client = None
            elif step is WorkerAction.SEND_READY:
                self._outbox.clear()  # anything left belonged to the previous socket
                self._last_heard = now
                self._send(mdp.worker_ready_frames(self.service), now)
                events.append(WorkerConnected(self.service, now))
            elif step is WorkerAction.SEND_DISCONNECT:
                self._send(mdp.DISCONNECT_FRAMES, now)
            elif step is WorkerAction.ABANDON:
                assert self._client is not None
                if input_ is WorkerSessionInput.CLOSE:
                    events.append(RequestAbandoned(self._client, "local-disconnect", now))
                else:
                    events.append(RequestAbandoned(self._client, _RECONNECT_REASONS[input_], now))
                self._client = None
            elif step is WorkerAction.RECONNECT:
                self._outbox.clear()  # MDP-W-17: nothing more on this socket after DISCONNECT
                self._reconnect_at = now + self._backoff
                self._backoff = min(2.0 * self._backoff, self.config.reconnect_max)
                reason = _RECONNECT_REASONS[input_]
                events.append(ReconnectRequired(reason, self._reconnect_at, now))
            elif step is WorkerAction.DROP and not cell.violation:
                events.append(MessageDropped(None, f"{input_.value} with no connection", now))
        self._move(cell)

    def _send(self, frames: mdp.Frames, now: float) -> None:
        self._last_sent = now
        self._outbox.append(frames)
