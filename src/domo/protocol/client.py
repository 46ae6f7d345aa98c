"""The client's side of MDP/0.2 as a sans-IO state machine.

A ``ClientSession`` sends one request at a time (MDP/Client is strictly synchronous, MDP-C-07) and
takes zero or more PARTIALs then one FINAL back (MDP-C-05). Each reply must name the service that
was asked for; anything else is dropped (MDP-D-20).

It follows the spec's recommended recovery (MDP-C-08): if no reply arrives within ``timeout``
(measured from the REQUEST or from the latest PARTIAL), the session emits ``ReconnectRequired``;
the I/O layer closes the socket, opens a new one and calls ``connected(now)``, and the session
resends the request there. After ``retries`` resends, or on a timeout after PARTIALs have arrived
(a resend could repeat them, MDP-D-19), it gives up with ``RequestFailed``: the failure is
explicit, never a silent hang.

Like the worker session it lives across sockets; states and inputs are the table
``CLIENT_SESSION_TRANSITIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from . import mdp
from ._session import Cell, SessionBase
from .errors import MalformedMessage
from .events import (
    ClientEvent,
    FailureReason,
    FinalReceived,
    MessageDropped,
    PartialReceived,
    ProtocolViolation,
    ReconnectReason,
    ReconnectRequired,
    RequestFailed,
    RequestSent,
)

__all__ = [
    "CLIENT_SESSION_TRANSITIONS",
    "ClientAction",
    "ClientConfig",
    "ClientSession",
    "ClientSessionInput",
    "ClientState",
]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """``timeout``: seconds without a reply before a retry; ``retries``: resends before failing."""

    timeout: float = 2.5
    retries: int = 3

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")


class ClientState(Enum):
    """Where a client session is."""

    DISCONNECTED = "disconnected"  # no socket
    RECONNECTING = "reconnecting"  # no socket; a request waits to be resent on the next one
    IDLE = "idle"  # connected, no request outstanding
    WAITING = "waiting"  # a request is outstanding
    CLOSED = "closed"

    __hash__ = object.__hash__


class ClientSessionInput(Enum):
    """Everything that can happen to a client session."""

    CONNECT = "connected()"
    REQUEST = "request()"
    PARTIAL = "PARTIAL"
    FINAL = "FINAL"
    FOREIGN_REPLY = "PARTIAL/FINAL for another service"
    UNEXPECTED = "REQUEST from the broker"
    INVALID = "malformed message"
    TIMEOUT_RETRY = "timeout, retries left"
    TIMEOUT_FAIL = "timeout, no retry possible"
    CANCEL = "cancel()"
    CLOSE = "close()"

    __hash__ = object.__hash__


class ClientAction(Enum):
    """The steps of a client session transition, in order."""

    SEND_REQUEST = "send REQUEST (first attempt or resend)"
    REFRESH = "restart the reply timeout"
    DELIVER_PARTIAL = "emit PartialReceived"
    DELIVER_FINAL = "emit FinalReceived"
    FAIL = "emit RequestFailed, forget the request"
    DROP_SOCKET = "discard the outbox, ask for a new socket"
    DISCARD = "discard the outbox"
    DROP = "drop the message"


def _build_table() -> dict[tuple[ClientState, ClientSessionInput], Cell[ClientState, ClientAction]]:
    S, In, A = ClientState, ClientSessionInput, ClientAction
    C = Cell
    table: dict[tuple[ClientState, ClientSessionInput], Cell[ClientState, ClientAction]] = {}
    remote = (In.PARTIAL, In.FINAL, In.FOREIGN_REPLY, In.UNEXPECTED, In.INVALID)
    timeouts = (In.TIMEOUT_RETRY, In.TIMEOUT_FAIL)
    busy = "one request at a time: MDP/Client is synchronous"

    for state in S:
        for input_ in timeouts:
            table[state, input_] = C(None, (), "MDP-D-03")  # only WAITING has a timer
        table[state, In.CLOSE] = C(S.CLOSED, (), "MDP-C-08")
    for state in (S.DISCONNECTED, S.RECONNECTING, S.CLOSED):
        for input_ in remote:  # stale messages from a socket the session has given up
            table[state, input_] = C(None, (A.DROP,), "MDP-C-08")
    for state in (S.IDLE, S.WAITING):
        table[state, In.CONNECT] = C(None, (), "MDP-C-04", error="already connected")
        for input_ in remote:  # replies with no request, for another service, or garbage
            table[state, input_] = C(None, (A.DROP,), "MDP-D-20", violation=True)

    table[S.DISCONNECTED, In.CONNECT] = C(S.IDLE, (), "MDP-C-04")
    table[S.DISCONNECTED, In.REQUEST] = C(None, (), "MDP-C-04", error="not connected")
    table[S.DISCONNECTED, In.CANCEL] = C(None, (), "MDP-C-07", error="no request to cancel")

    table[S.RECONNECTING, In.CONNECT] = C(S.WAITING, (A.SEND_REQUEST,), "MDP-C-08")
    table[S.RECONNECTING, In.REQUEST] = C(None, (), "MDP-C-07", error=busy)
    table[S.RECONNECTING, In.CANCEL] = C(S.DISCONNECTED, (A.FAIL,), "MDP-C-08")
    table[S.RECONNECTING, In.CLOSE] = C(S.CLOSED, (A.FAIL,), "MDP-C-08")

    table[S.IDLE, In.REQUEST] = C(S.WAITING, (A.SEND_REQUEST,), "MDP-C-01")
    table[S.IDLE, In.CANCEL] = C(None, (), "MDP-C-07", error="no request to cancel")

    table[S.WAITING, In.REQUEST] = C(None, (), "MDP-C-07", error=busy)
    table[S.WAITING, In.PARTIAL] = C(None, (A.REFRESH, A.DELIVER_PARTIAL), "MDP-C-05")
    table[S.WAITING, In.FINAL] = C(S.IDLE, (A.DELIVER_FINAL,), "MDP-C-06")
    table[S.WAITING, In.TIMEOUT_RETRY] = C(S.RECONNECTING, (A.DROP_SOCKET,), "MDP-C-08")
    table[S.WAITING, In.TIMEOUT_FAIL] = C(S.DISCONNECTED, (A.FAIL, A.DROP_SOCKET), "MDP-D-19")
    table[S.WAITING, In.CANCEL] = C(S.DISCONNECTED, (A.FAIL, A.DROP_SOCKET), "MDP-C-08")
    # A REQUEST not yet sent must not go out: nobody would read its reply.
    table[S.WAITING, In.CLOSE] = C(S.CLOSED, (A.FAIL, A.DISCARD), "MDP-C-08")

    closed = "the session is closed"
    for input_ in (In.CONNECT, In.REQUEST, In.CANCEL):
        table[S.CLOSED, input_] = C(None, (), "MDP-C-08", error=closed)
    table[S.CLOSED, In.CLOSE] = C(None, (), "MDP-C-08")
    return table


CLIENT_SESSION_TRANSITIONS: Final[
    Mapping[tuple[ClientState, ClientSessionInput], Cell[ClientState, ClientAction]]
] = _build_table()


class ClientSession(SessionBase[ClientState, ClientSessionInput, ClientAction]):
    """One MDP/0.2 client conversation, across as many sockets as its retries take.

    Start: the I/O layer opens a DEALER to the broker and calls ``connected(now)``.
    """

    _table = CLIENT_SESSION_TRANSITIONS

    def __init__(self, config: ClientConfig | None = None) -> None:
        super().__init__(ClientState.DISCONNECTED)
        self.config = config if config is not None else ClientConfig()
        self._service = b""
        self._checked: bytes | None = None  # the service name last checked (MDP-D-01)
        self._body: mdp.Frames = ()
        self._attempt = 0
        self._partials = 0  # PARTIALs received for the outstanding request
        self._first_sent_at = 0.0
        self._deadline = float("inf")

    # -- views ---------------------------------------------------------------------------------

    @property
    def service(self) -> bytes | None:
        """The service of the outstanding request, if any."""
        if self._state in (ClientState.WAITING, ClientState.RECONNECTING):
            return self._service
        return None

    @property
    def attempt(self) -> int:
        """Which attempt of the outstanding request is on the wire (from 1)."""
        return self._attempt

    # -- the sans-IO contract ------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When ``tick`` should next be called: the reply timeout, while waiting."""
        return self._deadline if self._state is ClientState.WAITING else None

    def tick(self, now: float) -> list[ClientEvent]:
        """Notice a reply timeout: retry, or fail (MDP-C-08)."""
        self._check_time(now)
        events: list[ClientEvent] = []
        self._advance(now, events)
        return events

    def connected(self, now: float) -> list[ClientEvent]:
        """A new socket is connected to the broker; resend the outstanding request, if any."""
        return self._local(ClientSessionInput.CONNECT, now)

    def request(self, service: bytes, body: Sequence[bytes], now: float) -> list[ClientEvent]:
        """Send REQUEST for ``service`` with ``body`` (one or more frames)."""
        if now < self._now:  # ``_check_time``, called only to refuse
            self._check_time(now)
        state = self._state
        if (
            state is ClientState.IDLE
        ):  # the one state that takes a request: its cell, looked up once
            cell = _IDLE_REQUEST
        else:
            cell = self._cell(ClientSessionInput.REQUEST)  # refuse misuse before anything changes
        if service is not self._checked:  # the name of the last request was checked already
            service = mdp.check_service(service)
        frames = mdp.check_body(body)
        events: list[ClientEvent] = []
        self._advance(now, events)
        if self._state is not state:  # a timeout due at ``now`` moved the session
            cell = self._cell(ClientSessionInput.REQUEST)
        self._service, self._body, self._attempt = service, frames, 0
        self._checked = service
        self._first_sent_at = now
        self._apply(cell, ClientSessionInput.REQUEST, now, events)
        return events

    def cancel(self, now: float) -> list[ClientEvent]:
        """Give up the outstanding request; the socket must then be replaced.

        If the request's last timeout is due at ``now``, it has already failed: the events say
        so (``RequestFailed``) and there is nothing left to cancel.
        """
        return self._local(ClientSessionInput.CANCEL, now)

    def close(self, now: float) -> list[ClientEvent]:
        """End the session; an outstanding request fails as cancelled."""
        return self._local(ClientSessionInput.CLOSE, now)

    def receive(self, frames: Sequence[bytes], now: float) -> list[ClientEvent]:
        """Handle one message from the broker."""
        if now < self._now:  # ``_check_time``, called only to refuse
            self._check_time(now)
        # The common case first: a PARTIAL or FINAL for the outstanding request, before its
        # deadline. Its header, command and service are exactly what ``validate_client`` and
        # ``_classify`` would accept (the service is the request's, checked when it was sent);
        # anything else takes the full path below.
        if (
            self._state is ClientState.WAITING
            and now < self._deadline
            and len(frames) > 3
            and type(frames[1]) is bytes
            and type(frames[2]) is bytes
            and frames[2] == self._service
            and frames[0] == mdp.CLIENT_HEADER
            and type(frames[0]) is bytes
        ):
            found = _FAST.get(frames[1])
            if found is not None:
                self._now = now
                replies: list[ClientEvent] = []
                self._apply(found[1], found[0], now, replies, body=tuple(frames[3:]))
                return replies
        events: list[ClientEvent] = []
        self._advance(now, events)
        reason, rule = "", ""
        if not frames or frames[0] != mdp.CLIENT_HEADER:
            input_ = ClientSessionInput.INVALID
            reason, rule = "not an MDP/Client message (header is not b'MDPC02')", "MDP-W-08"
        else:
            try:
                code = mdp.validate_client(frames)
            except MalformedMessage as error:
                input_ = ClientSessionInput.INVALID
                reason, rule = error.reason, error.rule
            else:
                input_ = self._classify(code, frames[2])
        cell = self._table[self._state, input_]
        if cell.violation:
            if input_ is not ClientSessionInput.INVALID:
                reason = self._violation_reason(input_, frames[2])
            events.append(ProtocolViolation(None, rule or cell.rule, reason, "dropped", now))
        body = tuple(frames[3:]) if input_ in _REPLIES else ()
        self._apply(cell, input_, now, events, body=body)
        return events

    # -- internals -----------------------------------------------------------------------------

    def _classify(self, code: bytes, service: bytes) -> ClientSessionInput:
        if code == mdp.C_REQUEST:
            return ClientSessionInput.UNEXPECTED
        if self._state is ClientState.WAITING and service != self._service:
            return ClientSessionInput.FOREIGN_REPLY
        return ClientSessionInput.FINAL if code == mdp.C_FINAL else ClientSessionInput.PARTIAL

    def _violation_reason(self, input_: ClientSessionInput, service: bytes) -> str:
        if input_ is ClientSessionInput.UNEXPECTED:
            return "REQUEST is a client-to-broker command"
        if input_ is ClientSessionInput.FOREIGN_REPLY:
            return f"reply for service {service!r}, but the request was for {self._service!r}"
        return f"{input_.value} with no request outstanding"

    def _local(self, input_: ClientSessionInput, now: float) -> list[ClientEvent]:
        self._check_time(now)
        self._cell(input_)  # refuse misuse before anything changes
        events: list[ClientEvent] = []
        self._advance(now, events)
        cell = self._table[self._state, input_]
        if cell.error is None:  # else a timeout due at ``now`` already ended the request
            self._apply(cell, input_, now, events)
        return events

    def _advance(self, now: float, events: list[ClientEvent]) -> None:
        self._now = now
        if self._state is not ClientState.WAITING or now < self._deadline:
            return
        may_retry = self._attempt <= self.config.retries and not self._partials
        input_ = ClientSessionInput.TIMEOUT_RETRY if may_retry else ClientSessionInput.TIMEOUT_FAIL
        self._apply(self._table[self._state, input_], input_, now, events)

    def _apply(
        self,
        cell: Cell[ClientState, ClientAction],
        input_: ClientSessionInput,
        now: float,
        events: list[ClientEvent],
        *,
        body: mdp.Frames = (),
    ) -> None:
        for step in cell.actions:
            if step is ClientAction.SEND_REQUEST:
                self._attempt += 1
                self._partials = 0
                self._deadline = now + self.config.timeout
                self._outbox.append(mdp.client_request_frames(self._service, self._body))
                events.append(RequestSent(self._service, self._attempt, now))
            elif step is ClientAction.REFRESH:
                self._deadline = now + self.config.timeout
            elif step is ClientAction.DELIVER_PARTIAL:
                self._partials += 1
                events.append(PartialReceived(self._service, body, self._attempt, now))
            elif step is ClientAction.DELIVER_FINAL:
                elapsed = now - self._first_sent_at
                events.append(FinalReceived(self._service, body, self._attempt, elapsed, now))
            elif step is ClientAction.FAIL:
                reason: FailureReason = "cancelled"
                if input_ is ClientSessionInput.TIMEOUT_FAIL:
                    reason = "timeout-after-partial" if self._partials else "retries-exhausted"
                events.append(RequestFailed(self._service, self._attempt, reason, now))
            elif step is ClientAction.DROP_SOCKET:
                self._outbox.clear()
                retrying = input_ is ClientSessionInput.TIMEOUT_RETRY
                why: ReconnectReason = "timeout" if retrying else "request-failed"
                events.append(ReconnectRequired(why, now, now))
            elif step is ClientAction.DISCARD:
                self._outbox.clear()
            elif step is ClientAction.DROP and not cell.violation:
                events.append(MessageDropped(None, f"{input_.value} with no connection", now))
        if cell.next_state is not None:  # ``_move``, inline: every request passes here twice
            self._state = cell.next_state


_REPLIES: Final = (ClientSessionInput.PARTIAL, ClientSessionInput.FINAL)
# The cells of the quick paths, from the table (a lookup keyed by two enums costs two Python-level
# hashes and a tuple).
_FAST: Final = {
    code: (input_, CLIENT_SESSION_TRANSITIONS[ClientState.WAITING, input_])
    for code, input_ in (
        (mdp.C_PARTIAL, ClientSessionInput.PARTIAL),
        (mdp.C_FINAL, ClientSessionInput.FINAL),
    )
}
_IDLE_REQUEST: Final = CLIENT_SESSION_TRANSITIONS[ClientState.IDLE, ClientSessionInput.REQUEST]
