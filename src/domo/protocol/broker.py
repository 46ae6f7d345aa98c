"""The family's routing core, and MDP/0.2's broker, as a sans-IO state machine.

Theory of operation
-------------------
The broker is driven entirely by calls; it never reads a clock, opens a socket or draws a random
number. Inputs are ``receive(peer, frames, now)`` (one MDP/0.2 message from the ROUTER, identity
frame removed: the core's own fast path), ``command(peer, CoreCommand, now)`` and ``invalid``
(a message of any dialect, as its codec decoded it: FAM-10), ``tick(now)``, and the I/O layer's
feedback ``peer_unreachable`` / ``peer_congested``. Outputs are the events each call returns,
the outbox drained by ``take_outgoing()`` (MDP/0.2 frames; ``take_outbox`` when some peers are
neutral and are sent ``CoreCommand``s) and ``next_deadline()``, the time by which ``tick``
should next be called.

Delivery (MDP-D-24): a message taken by ``take_outgoing`` is *in flight* until the runtime has
tried to send it. A send that fails is reported with ``peer_congested`` / ``peer_unreachable``,
naming the index of the first message of that outbox the peer did not get; once the runtime has
tried everything it took, it calls ``flushed()``, which returns ``RequestCompleted`` for every
FINAL that was handed to ZeroMQ. A FINAL that was not ends its own request as dropped, so every
accepted request ends in exactly one of ``RequestCompleted``, ``RequestExpired`` and
``RequestDropped``, and a newer request of the same client is not blamed for it.

Every input first brings the clock to ``now``: all timers due at or before ``now`` fire before the
input itself is handled (MDP-D-03), so the result never depends on how often the I/O layer ticks.

Each ROUTER peer has a *worker state* (``PeerState``): UNKNOWN, IDLE, BUSY or SILENCED. What a
worker-side input does in each state is the table ``WORKER_TRANSITIONS`` below: data, checked
exhaustively by the tests and rendered into ``specs/mdp-0.2.md``. A peer's client side is
independent of its worker side: it has at most one outstanding request (MDP-S-02).

SILENCED is how the broker keeps "then no further commands" (MDP-W-13, MDP-W-15, MDP-H-07): a
worker that was sent DISCONNECT, sent DISCONNECT, expired, spoke garbage or became unreachable is
remembered, nothing is sent to it and its messages are dropped, until it stays quiet for
``liveness * heartbeat_interval`` or opens a new conversation with READY (MDP-D-06).

Queues, pools and least-recently-used dispatch live in ``dispatch.py``, apart from this MDP
framing; timers are one lazy heap (``timers.py``) with one entry per worker, per silenced peer and
per queued request, so the work of a call is proportional to what is due, not to the number of
peers (MDP-S-04).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from . import mdp
from .commands import HEARTBEAT, LEAVE, Command, CoreCommand, Role
from .dispatch import (
    REQUEST_OVERHEAD,
    Dispatcher,
    RequestRecord,
    RequestState,
    ServiceRecord,
    WorkerRecord,
)
from .errors import LocalProtocolError, MalformedMessage
from .events import (
    BrokerEvent,
    DisconnectReason,
    DropReason,
    MessageDropped,
    MmiReplied,
    PartialForwarded,
    ProtocolViolation,
    RefusalReason,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    RequestRedispatched,
    RequestRefused,
    ViolationAction,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from .mdp import (
    _PRINTABLE_ASCII,
    C_FINAL,
    C_PARTIAL,
    CLIENT_HEADER,
    MAX_NAME_LENGTH,
    W_REQUEST,
    WORKER_HEADER,
    BodyFrame,
    Relayed,
)
from .timers import DeadlineHeap

__all__ = [
    "PENDING_FROM",
    "PIPE_MIN_MESSAGES",
    "REQUEST_OVERHEAD",
    "WORKER_TRANSITIONS",
    "Action",
    "Broker",
    "BrokerConfig",
    "Outbound",
    "PeerState",
    "PeerTraits",
    "RequestView",
    "ServiceView",
    "Transition",
    "WorkerInput",
    "WorkerView",
    "worker_transitions_for",
]

MIB: Final = 1024 * 1024
# The fewest messages of the largest size a peer's pipe must hold (MDP-D-32): with fewer, a pipe
# holding a few HEARTBEATs and a reply can refuse the next REQUEST to a live worker.
PIPE_MIN_MESSAGES: Final = 4
# Messages of this many bytes or more count against max_pending_bytes (MDP-D-30): the size from
# which the runtimes hand a frame to ZeroMQ without a copy (pyzmq's COPY_THRESHOLD).
PENDING_FROM: Final = 64 * 1024
MMI_PREFIX: Final = b"mmi."
MMI_SERVICE: Final = b"mmi.service"

# The rule that decides each way a request can be dropped (RequestDropped.rule).
_DROP_RULES: Final[dict[DropReason, str]] = {
    "redispatch-limit": "MDP-D-08",
    "lost-after-partial": "MDP-D-09",
    "client-unreachable": "MDP-D-15",
    "client-congested": "MDP-D-15",
    "broker-shutdown": "MDP-W-14",
    "final-too-large": "MDP-D-25",
    "partial-too-large": "MDP-D-25",
}

# One message in the outbox: MDP/0.2 frames, or a neutral command for a dialect peer (FAM-10).
Outbound: TypeAlias = Relayed | CoreCommand

# What a client reply other than a FINAL carries, for the report of its delivery: a PARTIAL (its
# request) or an mmi.* reply.
_Cargo: TypeAlias = RequestRecord | MmiReplied


# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """What a broker is told at start; every field has a production default.

    - ``heartbeat_interval``: seconds between heartbeats, both ways (MDP-H-04). Workers must be
      configured with the same value.
    - ``liveness``: a worker silent for ``liveness * heartbeat_interval`` is dead (MDP-H-05).
    - ``request_expiry``: seconds a request may wait in a queue for a worker (MDP-C-11, MDP-D-11).
    - ``max_redispatches``: how many times a request may go back to its queue because its worker
      was lost, before it is dropped (MDP-D-08).
    - ``max_message_bytes``: the largest body one request or reply may carry (MDP-D-25).
    - ``max_held_bytes``: the bytes of the requests the broker holds at once, all clients
      together: each counts its body plus ``REQUEST_OVERHEAD`` for what the broker keeps of it
      (MDP-D-26). At least ``max_message_bytes + REQUEST_OVERHEAD``, so that one request of
      the largest size fits.
    - ``max_peer_bytes``: the bytes one peer's pipe may hold each way; a runtime makes its
      high-water mark ``pipe_messages`` messages (MDP-D-27), at least ``PIPE_MIN_MESSAGES``
      (MDP-D-32).
    - ``max_pending_bytes``: the bytes of large messages (``PENDING_FROM`` bytes or more) handed
      to ZeroMQ and not yet written to the network, all peers together (MDP-D-30); a runtime
      convention, like ``max_peer_bytes``: the core does not use it.
    - ``max_client_requests``: the requests one client may have outstanding at once in a
      dialect that allows several (MDP/0.1, DCP, eMQP); one more is refused (FAM-07). A
      family convention, like the dialects: ``FamilyBroker`` counts them.
    - ``busy_worker_timeout``: seconds a busy worker whose dialect's worker is silent while it
      works (``PeerTraits.busy_heartbeats`` false: majortomo's, RFC 7's) may go without a word
      before it is taken for dead (FAM-09); majortomo's broker's default. Never less than
      ``liveness * heartbeat_interval``.
    """

    heartbeat_interval: float = 2.5
    liveness: int = 3
    request_expiry: float = 60.0
    max_redispatches: int = 2
    max_message_bytes: int = 4 * MIB
    max_held_bytes: int = 256 * MIB
    max_peer_bytes: int = 64 * MIB
    max_pending_bytes: int = 128 * MIB
    max_client_requests: int = 1000
    busy_worker_timeout: float = 900.0

    def __post_init__(self) -> None:
        if not self.heartbeat_interval > 0:
            raise ValueError(f"heartbeat_interval must be > 0, got {self.heartbeat_interval}")
        if self.liveness < 1:
            raise ValueError(f"liveness must be >= 1, got {self.liveness}")
        if not self.request_expiry > 0:
            raise ValueError(f"request_expiry must be > 0, got {self.request_expiry}")
        if self.max_redispatches < 0:
            raise ValueError(f"max_redispatches must be >= 0, got {self.max_redispatches}")
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes}")
        if self.max_held_bytes < self.max_message_bytes + REQUEST_OVERHEAD:
            raise ValueError(
                f"max_held_bytes ({self.max_held_bytes}) must be >= max_message_bytes "
                f"({self.max_message_bytes}) + REQUEST_OVERHEAD ({REQUEST_OVERHEAD}), that is "
                f"{self.max_message_bytes + REQUEST_OVERHEAD}: else no request of the largest "
                f"size fits"
            )
        least = PIPE_MIN_MESSAGES * self.max_message_bytes
        if self.max_peer_bytes < least:
            raise ValueError(
                f"max_peer_bytes ({self.max_peer_bytes}) must be at least {PIPE_MIN_MESSAGES} x "
                f"max_message_bytes ({self.max_message_bytes}), that is {least}: a pipe of fewer "
                f"messages of the largest size can be full of heartbeats when a request comes "
                f"(MDP-D-32)"
            )
        if not self.busy_worker_timeout > 0:
            raise ValueError(f"busy_worker_timeout must be > 0, got {self.busy_worker_timeout}")
        if self.max_client_requests < 1:
            raise ValueError(f"max_client_requests must be >= 1, got {self.max_client_requests}")
        if self.max_pending_bytes < self.max_message_bytes:
            raise ValueError(
                f"max_pending_bytes ({self.max_pending_bytes}) must be >= max_message_bytes "
                f"({self.max_message_bytes}): else no message of the largest size can be sent"
            )

    @property
    def expiry_span(self) -> float:
        """Silence after which a peer is dead: ``liveness * heartbeat_interval``."""
        return self.liveness * self.heartbeat_interval

    @property
    def busy_span(self) -> float:
        """Silence after which a busy worker that does not heartbeat while busy is dead
        (FAM-09): ``busy_worker_timeout``, at least ``expiry_span``."""
        return max(self.busy_worker_timeout, self.expiry_span)

    @property
    def pipe_messages(self) -> int:
        """The high-water mark a runtime gives each peer's pipe, both ways (MDP-D-27): as many
        messages of the largest size as ``max_peer_bytes`` holds."""
        return self.max_peer_bytes // self.max_message_bytes


@dataclass(frozen=True, slots=True)
class PeerTraits:
    """What the core may expect of one peer and send it, where it differs from MDP/0.2.

    A peer has MDP/0.2's traits (every field True) unless ``Broker.set_traits`` gave it others;
    ``FamilyBroker`` gives each peer its dialect's (``dialects.Capabilities``,
    ``specs/family.md``).

    - ``heartbeats_expected``: the peer heartbeats as a worker, so a silent one expires
      (MDP-H-05); otherwise it is never expired for silence (FAM-02).
    - ``heartbeats_sent``: the broker sends it HEARTBEAT (MDP-H-04); otherwise never (FAM-01).
    - ``disconnect``: the broker may send it DISCONNECT; otherwise it is dropped without one,
      and the events say no DISCONNECT was sent (FAM-03).
    - ``mmi``: its ``mmi.*`` requests are answered by the broker (MDP-M-01); otherwise such a
      name is a service like any other (FAM-04).
    - ``busy_heartbeats``: the peer heartbeats while busy too (MDP-H-04); otherwise a busy
      one is dead only after ``busy_worker_timeout`` of silence (FAM-09).
    - ``neutral``: what the core sends the peer goes in the outbox as a neutral ``CoreCommand``
      for its dialect's codec to encode (FAM-10), not as MDP/0.2 frames; ``FamilyBroker``
      gives it to every peer it knows by a key.
    """

    heartbeats_expected: bool = True
    heartbeats_sent: bool = True
    disconnect: bool = True
    mmi: bool = True
    busy_heartbeats: bool = True
    neutral: bool = False


# --- the worker-side transition table ---------------------------------------------------------


class PeerState(Enum):
    """The worker side of one ROUTER peer, as the broker sees it."""

    # Members are singletons: hash by identity, in C, for the per-message table lookup.
    __hash__ = object.__hash__

    UNKNOWN = "unknown"  # never spoke the worker protocol, or forgotten
    IDLE = "idle"  # registered, waiting for a request
    BUSY = "busy"  # registered, handling one request
    SILENCED = "silenced"  # nothing is sent to it; its messages are dropped


class WorkerInput(Enum):
    """Everything that can happen to a peer's worker side."""

    # Members are singletons: hash by identity, in C, for the per-message table lookup.
    __hash__ = object.__hash__

    READY = "READY"  # READY for an ordinary service
    READY_RESERVED = "READY mmi.*"  # READY for a service name the broker reserves
    HEARTBEAT = "HEARTBEAT"
    PARTIAL = "PARTIAL"  # PARTIAL (for the current request, when busy)
    FINAL = "FINAL"  # FINAL (for the current request, when busy)
    FOREIGN_REPLY = "PARTIAL/FINAL for another client"  # address is not the current request's
    REQUEST = "REQUEST"  # a broker-to-worker command sent by a worker
    DISCONNECT = "DISCONNECT"
    INVALID = "malformed message"
    EXPIRED = "liveness expired"  # timer
    HEARTBEAT_DUE = "heartbeat due"  # timer
    SILENCE_OVER = "silence over"  # timer
    UNREACHABLE = "peer unreachable"  # I/O feedback (EHOSTUNREACH)
    CONGESTED = "peer congested"  # I/O feedback (EAGAIN at the high-water mark)


class Action(Enum):
    """The steps a transition takes, in order."""

    REGISTER = "register the worker (idle), then dispatch"
    REFRESH = "refresh liveness"
    FORWARD_PARTIAL = "forward PARTIAL to the client"
    FORWARD_FINAL = "forward FINAL to the client, worker idle, dispatch"
    SEND_DISCONNECT = "send DISCONNECT"
    UNREGISTER = "unregister; re-dispatch its request"
    SILENCE = "silence the peer"
    KEEP_SILENT = "drop the message, extend the silence"
    SEND_HEARTBEAT = "send HEARTBEAT"
    FORGET = "forget the peer"


@dataclass(frozen=True, slots=True)
class Transition:
    """One cell of the table: the state after, the actions, and the rule that decides it.

    ``amended_by``: in a dialect's table (``worker_transitions_for``), the rules that changed
    the cell from MDP/0.2's (``FAM-01``...), or None where it is MDP/0.2's.
    """

    next_state: PeerState
    actions: tuple[Action, ...]
    rule: str
    violation: bool = False
    amended_by: str | None = None


def _build_worker_transitions() -> dict[tuple[PeerState, WorkerInput], Transition]:
    S, In, A = PeerState, WorkerInput, Action  # short names keep the table readable
    table: dict[tuple[PeerState, WorkerInput], Transition] = {}

    def cell(
        states: Iterable[PeerState],
        inputs: Iterable[WorkerInput],
        next_state: PeerState | None,
        actions: tuple[Action, ...],
        rule: str,
        violation: bool = False,
    ) -> None:
        for state in states:
            for input_ in inputs:
                after = state if next_state is None else next_state
                table[state, input_] = Transition(after, actions, rule, violation)

    unregistered = (S.UNKNOWN, S.SILENCED)
    registered = (S.IDLE, S.BUSY)
    replies = (In.PARTIAL, In.FINAL, In.FOREIGN_REPLY)
    kick = (A.SEND_DISCONNECT, A.SILENCE)
    kick_registered = (A.SEND_DISCONNECT, A.UNREGISTER, A.SILENCE)
    drop_registered = (A.UNREGISTER, A.SILENCE)

    # A peer that is not registered: READY opens a conversation (MDP-W-09), even after a silence
    # (MDP-D-06); anything else valid is unexpected (MDP-W-15, MDP-H-01).
    cell(unregistered, [In.READY], S.IDLE, (A.REGISTER,), "MDP-W-09")
    cell(unregistered, [In.READY_RESERVED], S.SILENCED, kick, "MDP-D-14", violation=True)
    cell([S.UNKNOWN], [In.HEARTBEAT], S.SILENCED, kick, "MDP-H-01", violation=True)
    cell([S.UNKNOWN], [*replies, In.REQUEST], S.SILENCED, kick, "MDP-W-15", violation=True)
    cell([S.UNKNOWN], [In.DISCONNECT], S.SILENCED, (A.SILENCE,), "MDP-W-12")
    cell([S.UNKNOWN], [In.INVALID], S.SILENCED, (A.SILENCE,), "MDP-W-16", violation=True)
    cell([S.UNKNOWN], [In.EXPIRED, In.HEARTBEAT_DUE, In.SILENCE_OVER], None, (), "MDP-D-03")
    cell([S.UNKNOWN], [In.UNREACHABLE, In.CONGESTED], None, (), "MDP-D-15")

    # A registered worker.
    cell(registered, [In.READY, In.READY_RESERVED], S.SILENCED, kick_registered, "MDP-W-10", True)
    cell(registered, [In.HEARTBEAT], None, (A.REFRESH,), "MDP-H-02")
    cell([S.IDLE], replies, S.SILENCED, kick_registered, "MDP-W-15", violation=True)
    cell([S.BUSY], [In.PARTIAL], S.BUSY, (A.REFRESH, A.FORWARD_PARTIAL), "MDP-R-01")
    cell([S.BUSY], [In.FINAL], S.IDLE, (A.REFRESH, A.FORWARD_FINAL), "MDP-R-01")
    cell([S.BUSY], [In.FOREIGN_REPLY], S.SILENCED, kick_registered, "MDP-D-13", violation=True)
    cell(registered, [In.REQUEST], S.SILENCED, kick_registered, "MDP-W-15", violation=True)
    cell(registered, [In.DISCONNECT], S.SILENCED, drop_registered, "MDP-W-13")
    cell(registered, [In.INVALID], S.SILENCED, drop_registered, "MDP-W-16", violation=True)
    cell(registered, [In.EXPIRED], S.SILENCED, drop_registered, "MDP-H-05")
    cell(registered, [In.HEARTBEAT_DUE], None, (A.SEND_HEARTBEAT,), "MDP-H-04")
    cell(registered, [In.SILENCE_OVER], None, (), "MDP-D-03")
    cell(registered, [In.UNREACHABLE, In.CONGESTED], S.SILENCED, drop_registered, "MDP-D-15")

    # A silenced peer: nothing goes to it, whatever it says, until READY or the silence ends.
    spoken = [In.HEARTBEAT, *replies, In.REQUEST, In.DISCONNECT, In.INVALID]
    cell([S.SILENCED], spoken, S.SILENCED, (A.KEEP_SILENT,), "MDP-D-06")
    cell([S.SILENCED], [In.EXPIRED, In.HEARTBEAT_DUE], None, (), "MDP-D-03")
    cell([S.SILENCED], [In.UNREACHABLE, In.CONGESTED], None, (), "MDP-D-15")
    cell([S.SILENCED], [In.SILENCE_OVER], S.UNKNOWN, (A.FORGET,), "MDP-D-06")
    return table


WORKER_TRANSITIONS: Final[Mapping[tuple[PeerState, WorkerInput], Transition]] = (
    _build_worker_transitions()
)


def worker_transitions_for(
    traits: PeerTraits,
) -> Mapping[tuple[PeerState, WorkerInput], Transition]:
    """``WORKER_TRANSITIONS`` as it holds for a peer with ``traits`` (``specs/family.md``).

    Without DISCONNECT, a cell that sends it only unregisters and silences (FAM-03); without
    broker heartbeats, ``heartbeat due`` sends nothing (FAM-01); without worker heartbeats, a
    registered worker's ``liveness expired`` changes nothing (FAM-02; its timer never says so).
    Each changed cell names the rules in ``amended_by``. Pure: the same traits, the same table.
    """
    if traits == PeerTraits():
        return WORKER_TRANSITIONS
    table = dict(WORKER_TRANSITIONS)
    for (state, input_), cell in WORKER_TRANSITIONS.items():
        after, actions, amended = cell.next_state, cell.actions, []
        if not traits.disconnect and Action.SEND_DISCONNECT in actions:
            actions = tuple(a for a in actions if a is not Action.SEND_DISCONNECT)
            amended.append("FAM-03")
        if not traits.heartbeats_sent and Action.SEND_HEARTBEAT in actions:
            actions = tuple(a for a in actions if a is not Action.SEND_HEARTBEAT)
            amended.append("FAM-01")
        if not traits.heartbeats_expected and input_ is WorkerInput.EXPIRED and actions:
            after, actions = state, ()
            amended.append("FAM-02")
        if amended:
            amendment = ", ".join(amended)
            table[state, input_] = Transition(after, actions, cell.rule, cell.violation, amendment)
    return MappingProxyType(table)


# The members the request cycle names, as globals: on Python 3.11 ``Enum.MEMBER`` goes through
# ``EnumType.__getattr__`` (about 90 ns, which the interpreter cannot cache) and a cycle names a
# dozen of them; a global costs a tenth of that.
_IDLE, _BUSY = PeerState.IDLE, PeerState.BUSY
_SILENCED, _UNKNOWN = PeerState.SILENCED, PeerState.UNKNOWN
_IN_PARTIAL, _IN_FINAL, _IN_READY = WorkerInput.PARTIAL, WorkerInput.FINAL, WorkerInput.READY
_REFRESH, _FORWARD_PARTIAL = Action.REFRESH, Action.FORWARD_PARTIAL
_FORWARD_FINAL, _REGISTER = Action.FORWARD_FINAL, Action.REGISTER
_QUEUED = RequestState.QUEUED

# Why a registered worker leaves, by the input that removed it.
_DISCONNECT_REASONS: Final[dict[WorkerInput, DisconnectReason]] = {
    WorkerInput.READY: "unexpected-command",
    WorkerInput.READY_RESERVED: "unexpected-command",
    WorkerInput.PARTIAL: "unexpected-command",
    WorkerInput.FINAL: "unexpected-command",
    WorkerInput.FOREIGN_REPLY: "unexpected-command",
    WorkerInput.REQUEST: "unexpected-command",
    WorkerInput.DISCONNECT: "worker-disconnect",
    WorkerInput.INVALID: "invalid-message",
    WorkerInput.UNREACHABLE: "unreachable",
    WorkerInput.CONGESTED: "congested",
}

_VIOLATION_REASONS: Final[dict[WorkerInput, str]] = {
    WorkerInput.READY: "READY from a registered worker",
    WorkerInput.READY_RESERVED: "READY for a service name reserved by the broker (mmi.*)",
    WorkerInput.HEARTBEAT: "HEARTBEAT before READY",
    WorkerInput.PARTIAL: "PARTIAL from a worker with no request",
    WorkerInput.FINAL: "FINAL from a worker with no request",
    WorkerInput.FOREIGN_REPLY: "PARTIAL/FINAL for a client other than the current request's",
    WorkerInput.REQUEST: "REQUEST is a broker-to-worker command",
}

# What a worker's other neutral commands are to the worker table (``Broker.command``).
_NEUTRAL_WORKER_INPUT: Final = {
    Command.HEARTBEAT: WorkerInput.HEARTBEAT,
    Command.LEAVE: WorkerInput.DISCONNECT,
}
# A client's commands, and the rule for one without a body (MDP-C-01..03).
_CLIENT_COMMANDS: Final = {
    Command.REQUEST: "MDP-C-01",
    Command.PARTIAL: "MDP-C-02",
    Command.FINAL: "MDP-C-03",
}
# A worker's commands that name a client and carry a body, and the rule for one without a body.
_ADDRESSED: Final = {
    Command.REQUEST: "MDP-W-02",
    Command.PARTIAL: "MDP-W-03",
    Command.FINAL: "MDP-W-04",
}

_WORKER_INPUT_OF_CODE: Final = {
    mdp.W_READY: WorkerInput.READY,
    mdp.W_REQUEST: WorkerInput.REQUEST,
    mdp.W_PARTIAL: WorkerInput.PARTIAL,
    mdp.W_FINAL: WorkerInput.FINAL,
    mdp.W_HEARTBEAT: WorkerInput.HEARTBEAT,
    mdp.W_DISCONNECT: WorkerInput.DISCONNECT,
}


# --- read-only views --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A registered worker as seen from outside the broker."""

    peer: bytes
    service: bytes
    state: PeerState
    request_id: int | None
    client: bytes | None
    registered_at: float
    last_heard: float
    last_sent: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class RequestView:
    """An outstanding request (queued or dispatched)."""

    request_id: int
    client: bytes
    service: bytes
    state: RequestState
    worker: bytes | None
    attempts: int
    partials: int
    size: int
    received_at: float
    expires_at: float | None  # queue expiry; None while dispatched
    abandoned: bool


@dataclass(frozen=True, slots=True)
class ServiceView:
    """A service with workers or waiting requests."""

    name: bytes
    workers: int
    idle: int
    queued: int


class _Silence:
    """A silenced peer: nothing is sent to it until ``until`` passes with no word from it."""

    __slots__ = ("peer", "timer_at", "until")

    def __init__(self, peer: bytes, until: float) -> None:
        self.peer = peer
        self.until = until
        self.timer_at = until


_MDP02_TRAITS: Final = PeerTraits()
_TO_WORKER, _TO_CLIENT = Role.WORKER, Role.CLIENT
# A neutral command made as its own ``__new__`` makes it, without that Python-level call: one
# per reply to a dialect client, and per REQUEST to a dialect worker.
_new_tuple = tuple.__new__
_REQUEST, _PARTIAL, _FINAL = Command.REQUEST, Command.PARTIAL, Command.FINAL
_EMPTY_BODY: Final = (b"",)  # FAM-10: what an empty body is to an MDP/0.2 peer

_WORKER_TIMER: Final = 0
_SILENCE_TIMER: Final = 1
_QUEUE_TIMER: Final = 2
_COMPACT_SLACK: Final = 1024  # stale heap entries tolerated beyond the live ones


# --- the broker -------------------------------------------------------------------------------


class Broker:
    """An MDP/0.2 broker: clients and workers on one ROUTER, as a sans-IO state machine.

    >>> broker = Broker(BrokerConfig(heartbeat_interval=1.0))
    >>> _ = broker.receive(b"W", [b"MDPW02", b"\\x01", b"echo"], now=0.0)
    >>> _ = broker.receive(b"C", [b"MDPC02", b"\\x01", b"echo", b"hi"], now=0.1)
    >>> broker.take_outgoing()
    [(b'W', (b'MDPW02', b'\\x02', b'C', b'', b'hi'))]
    """

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.config = config if config is not None else BrokerConfig()
        self._interval = self.config.heartbeat_interval
        self._span = self.config.expiry_span
        self._busy_span = self.config.busy_span
        self._max_message = self.config.max_message_bytes
        self._max_held = self.config.max_held_bytes
        self._draining = False  # MDP-D-34
        self._dispatcher = Dispatcher()
        self._workers: dict[bytes, WorkerRecord] = {}
        self._silenced: dict[bytes, _Silence] = {}
        self._clients: dict[bytes, RequestRecord] = {}  # peer -> its outstanding request
        self._traits: dict[bytes, PeerTraits] = {}  # peers whose traits are not MDP/0.2's
        self._neutral: dict[bytes, None] = {}  # peers sent neutral commands (FAM-10)
        self._tables: dict[PeerTraits, Mapping[tuple[PeerState, WorkerInput], Transition]] = {}
        self._traits_set_last: PeerTraits | None = None  # what set_traits last gave a peer
        # The body bytes of the requests in ``_clients`` (MDP-D-26): added on acceptance,
        # taken off wherever a request leaves ``_clients``.
        self._held_bytes = 0
        # Clients whose pipe was full, and until when their requests are refused (MDP-D-29).
        self._congested: dict[bytes, float] = {}
        self._timers: DeadlineHeap[tuple[int, Any]] = DeadlineHeap()
        self._compact_at = _COMPACT_SLACK  # heap size that triggers _compact_timers
        self._congested_at = _COMPACT_SLACK  # table size that triggers forgetting
        self._outbox: list[tuple[bytes, Outbound]] = []
        # Client replies not yet confirmed by ``flushed`` (MDP-D-24), by *sequence number*: the
        # messages ever taken are numbered from 0 in order (``_taken`` so far; the outbox last
        # taken starts at ``_base``). FINALs as the RequestCompleted each will be, with their
        # numbers beside them; PARTIALs and mmi.* replies as (number, client, what it carries).
        self._taken = 0
        self._base = 0
        self._finals: list[RequestCompleted] = []
        self._final_seq: list[int] = []
        self._cargo: list[tuple[int, bytes, _Cargo]] = []
        self._now = float("-inf")
        self._last_request_id = 0
        self._unarmed: list[RequestRecord] = []  # queued by this call, expiry timer not armed
        # Requests whose worker expired while timers fire; re-queued once every timer has fired.
        self._lost_in_advance: list[tuple[RequestRecord, bytes]] | None = None
        # Workers whose registration ends with their next FINAL (``single_use``).
        self._single_use: set[bytes] = set()

    # -- the sans-IO contract ------------------------------------------------------------------

    def receive(self, peer: bytes, frames: Sequence[BodyFrame], now: float) -> list[BrokerEvent]:
        """Handle one message from ``peer`` (the ROUTER identity frame already removed).

        ``frames`` is a sequence of ``bytes``, except that body frames may be ``memoryview``s
        (views of received frames, so that bodies are relayed without a copy, MDP-S-03): the
        broker reads nothing of a body frame but its length. Anything a remote peer can send is
        handled by the protocol (an event), never by an exception; a frame before the body that
        is not ``bytes`` makes the message malformed (MDP-W-08).
        """
        events = self._advance(now)
        header = frames[0] if frames else None
        if header == WORKER_HEADER:
            self._on_worker_message(peer, frames, now, events)
        elif header == CLIENT_HEADER:
            self._on_client_message(peer, frames, now, events)
        elif peer in self._workers or peer in self._silenced:
            reason = "message without a known protocol header"
            self._worker_input(peer, WorkerInput.INVALID, now, events, reason=reason)
        else:
            events.append(
                ProtocolViolation(peer, "MDP-W-08", "unknown protocol header", "dropped", now)
            )
        return events

    def command(self, peer: bytes, message: CoreCommand, now: float) -> list[BrokerEvent]:
        """Handle one neutral command from ``peer`` (``design.md`` section 7): what a message
        of any dialect means, with no frames to parse. ``receive`` is MDP/0.2's frames decoded
        into the same steps, so the two agree on every valid message
        (``tests/protocol/test_broker_command.py``).

        What a message's frames would have had checked is checked here: a service name
        (MDP-D-01), a reply's client address (MDP-D-02); a command the sender's side has no
        business sending is MDP/0.2's violation for it (MDP-W-15, MDP-D-16, MDP-C-01). A body
        may have any number of frames, none included (FAM-10): whether its dialect can say
        that is its codec's business; an empty body reaches an MDP/0.2 peer as one empty frame.
        """
        events = self._advance(now)
        command = message.command
        if message.role is _TO_WORKER:  # (a module's name: an enum's member is a slow lookup)
            if command is Command.REGISTER:
                service = message.service
                if not mdp.is_valid_service(service):
                    reason = "service name is not 1-255 printable ASCII bytes"
                    self._worker_input(
                        peer, WorkerInput.INVALID, now, events, reason=reason, rule="MDP-D-01"
                    )
                elif service.startswith(MMI_PREFIX):
                    self._worker_input(
                        peer, WorkerInput.READY_RESERVED, now, events, service=service
                    )
                else:
                    self._worker_input(peer, _IN_READY, now, events, service=service)
            elif command in _ADDRESSED:  # PARTIAL, FINAL, and a REQUEST a worker should not send
                if not mdp.is_valid_address(message.address):
                    reason = "client address must be 1-255 bytes"
                    self._worker_input(
                        peer, WorkerInput.INVALID, now, events, reason=reason, rule="MDP-D-02"
                    )
                elif command is Command.REQUEST:
                    self._worker_input(peer, WorkerInput.REQUEST, now, events)
                else:
                    input_ = _IN_FINAL if command is Command.FINAL else _IN_PARTIAL
                    self._worker_reply(peer, input_, message.address, message.body, now, events)
            else:
                self._worker_input(peer, _NEUTRAL_WORKER_INPUT[command], now, events)
        elif (  # a REQUEST to a valid service (``mdp.is_valid_service``, inline): the usual
            command is _REQUEST
            and (service := message.service).__class__ is bytes
            and 0 < len(service) <= MAX_NAME_LENGTH
            and not service.translate(None, _PRINTABLE_ASCII)
        ):
            self._client_request(peer, service, tuple(message.body), now, events)
        elif command not in _CLIENT_COMMANDS:
            reason = f"{command.value} is not a client command"
            events.append(ProtocolViolation(peer, "MDP-C-01", reason, "dropped", now))
        elif not mdp.is_valid_service(message.service):
            reason = "service name is not 1-255 printable ASCII bytes"
            events.append(ProtocolViolation(peer, "MDP-D-01", reason, "dropped", now))
        elif command is not Command.REQUEST:
            reason = "PARTIAL/FINAL are broker-to-client commands"
            events.append(ProtocolViolation(peer, "MDP-D-16", reason, "dropped", now))
        else:
            self._client_request(peer, message.service, tuple(message.body), now, events)
        return events

    def invalid(self, peer: bytes, rule: str, reason: str, now: float) -> list[BrokerEvent]:
        """``peer`` sent a message its dialect's codec could not read (``rule``, ``reason``):
        what ``receive`` does with frames that are not MDP/0.2, for a peer of another dialect.
        A registered or silenced worker is invalid (MDP-W-16: unregistered and silenced), any
        other peer's message is dropped with a ``ProtocolViolation``."""
        events = self._advance(now)
        if peer in self._workers or peer in self._silenced:
            self._worker_input(peer, WorkerInput.INVALID, now, events, reason=reason, rule=rule)
        else:
            events.append(ProtocolViolation(peer, rule, reason, "dropped", now))
        return events

    def tick(self, now: float) -> list[BrokerEvent]:
        """Fire every timer due at or before ``now``: heartbeats, expiries."""
        return self._advance(now)

    def next_deadline(self) -> float | None:
        """When ``tick`` should next be called (it may be early; never late), or None."""
        return self._timers.earliest()

    def take_outbox(self) -> list[tuple[bytes, Outbound]]:
        """Drain the outbox: ``(peer, message)`` pairs to send, in order (``take_outgoing``).

        A message is MDP/0.2 frames, to send on the ROUTER behind the peer's identity, unless
        the peer was given neutral traits (``PeerTraits.neutral``): then it is the neutral
        ``CoreCommand`` its dialect's codec encodes (FAM-10; ``FamilyBroker`` takes its core's
        outbox so). A broker that gave no peer neutral traits holds frames only, and
        ``take_outgoing`` is the same call typed so. Body frames are the very objects
        ``receive`` was given (MDP-S-03). Taking an outbox says that the one taken before was
        tried in full (MDP-D-24): send it in order, report each peer that could not take a
        message with ``peer_congested`` or ``peer_unreachable`` (``unsent``: that message's
        index in this list) before taking the next one, and call ``flushed`` when done.
        """
        outbox = self._outbox
        self._outbox = []
        # Numbers matter only while a reply awaits its flush: an outbox taken with none pending
        # is not counted (the numbers stay consistent among the replies that are).
        if self._finals or self._cargo:
            self._base = taken = self._taken
            self._taken = taken + len(outbox)
        return outbox

    if TYPE_CHECKING:

        def take_outgoing(self) -> list[tuple[bytes, Relayed]]:
            """Drain the outbox of a broker with no neutral peers: ``(peer, frames)`` pairs
            to send on the ROUTER, in order; see ``take_outbox``."""
            ...

    else:
        take_outgoing = take_outbox  # the same call: no cost on the request cycle

    def flushed(self) -> list[RequestCompleted]:
        """The runtime tried every message it took: ``RequestCompleted`` for the FINALs sent.

        A FINAL counts as delivered once it was handed to ZeroMQ without a failure reported
        for it (MDP-D-24); call this after each flush, or no request is ever reported completed.
        """
        finals = self._finals
        if self._cargo:
            self._cargo = [entry for entry in self._cargo if entry[0] >= self._taken]
        if not finals:
            return []
        if self._final_seq[-1] < self._taken:  # all of them were taken: the usual case
            self._finals = []
            self._final_seq = []
            return finals
        sent = bisect_left(self._final_seq, self._taken)  # the numbers ascend
        self._finals = finals[sent:]
        self._final_seq = self._final_seq[sent:]
        return finals[:sent]

    def peer_unreachable(
        self, peer: bytes, now: float, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        """The I/O layer could not route a message to ``peer``: it is gone (MDP-D-15).

        ``unsent`` is the index, in the outbox last taken, of the message that failed: it and
        every later message to ``peer`` in that outbox were not sent; ``None`` if unknown (then
        nothing of that outbox to ``peer`` counts as sent). See ``take_outgoing``.
        """
        return self._peer_failed(peer, now, WorkerInput.UNREACHABLE, "client-unreachable", unsent)

    def peer_congested(
        self, peer: bytes, now: float, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        """``peer``'s pipe is full and a message to it was not sent (MDP-D-15).

        ``unsent`` as for ``peer_unreachable``.
        """
        return self._peer_failed(peer, now, WorkerInput.CONGESTED, "client-congested", unsent)

    def set_traits(self, peer: bytes, traits: PeerTraits | None) -> None:
        """Give ``peer`` its dialect's traits (None: MDP/0.2's); see ``PeerTraits``.

        Set before the peer's first message, and kept while the broker holds anything of it.
        """
        # The record given last (a dialect's, to its every new key) is known not MDP/0.2's.
        last = self._traits_set_last
        if traits is None or (traits is not last and traits == _MDP02_TRAITS):
            self._traits.pop(peer, None)
            self._neutral.pop(peer, None)
        else:
            self._traits[peer] = traits
            if traits.neutral:
                self._neutral[peer] = None
            else:
                self._neutral.pop(peer, None)
            if traits is not last:
                if traits not in self._tables:
                    self._tables[traits] = worker_transitions_for(traits)
                self._traits_set_last = traits  # frozen: its table stays the one made

    def stop_taking_requests(self) -> None:
        """Refuse every new request from now on (``RequestRefused``, ``draining``, MDP-D-34);
        the requests already taken carry on: a drain before ``shutdown``."""
        self._draining = True

    @property
    def draining(self) -> bool:
        """Whether ``stop_taking_requests`` was called."""
        return self._draining

    def shutdown(self, now: float) -> list[BrokerEvent]:
        """Give up every request and send DISCONNECT to every registered worker (MDP-W-14).

        For a graceful stop. Afterwards the broker holds no requests and no workers; the workers
        it disconnected are silenced like any other (MDP-W-15).
        """
        events = self._advance(now)
        for request in list(self._clients.values()):
            if request.state is RequestState.QUEUED:
                self._dispatcher.unqueue(request)
            else:
                request.abandoned = True
            self._end_request(request, "broker-shutdown", None, now, events)
        for worker in list(self._workers.values()):
            sent = self._disconnects(worker.peer)
            if sent:  # FAM-03
                self._send_leave(worker.peer)
            self._remove_worker(worker, now, events, disconnect_sent=sent, reason="broker-shutdown")
            self._silence(worker.peer, now)
        return events

    # -- views ---------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The latest time given to the broker."""
        return self._now

    def worker_state(self, peer: bytes) -> PeerState:
        """The worker-side state of ``peer``."""
        worker = self._workers.get(peer)
        if worker is not None:
            return _IDLE if worker.request is None else _BUSY
        return _SILENCED if peer in self._silenced else _UNKNOWN

    def holds(self, peer: bytes) -> bool:
        """Whether ``peer`` has an outstanding request here, or a reply in flight (MDP-D-24)."""
        if peer in self._clients:
            return True
        if not self._finals and not self._cargo:
            return False
        return any(f.client == peer for f in self._finals) or any(
            client == peer for _, client, _ in self._cargo
        )

    def retains(self, peer: bytes) -> bool:
        """Whether ``peer`` is a registered worker or ``holds`` something here: what a
        dialect broker must keep its route for."""
        if peer in self._workers or peer in self._clients:
            return True
        return bool(self._finals or self._cargo) and self.holds(peer)

    def held_bytes(self) -> int:
        """The bytes the outstanding requests count against ``max_held_bytes``: their bodies
        plus ``REQUEST_OVERHEAD`` each (MDP-D-26)."""
        return self._held_bytes

    def workers(self) -> dict[bytes, WorkerView]:
        """Every registered worker, in order of registration."""
        return {peer: self._worker_view(w) for peer, w in self._workers.items()}

    def silenced(self) -> dict[bytes, float]:
        """Silenced peers and the time their silence ends if they stay quiet."""
        return {peer: s.until for peer, s in self._silenced.items()}

    def requests(self) -> list[RequestView]:
        """Every outstanding request, in order of acceptance."""
        return [self._request_view(r) for r in self._clients.values()]

    def request_body(self, client: bytes) -> Relayed | None:
        """The body of ``client``'s outstanding request, or None if it has none."""
        request = self._clients.get(client)
        return None if request is None else request.body

    # -- hooks for dialects the core serves through a bridge (domo.protocol.emqp_bridge) -------

    def withdraw(
        self, peers: Sequence[bytes], now: float, *, unsent: bool = False, expired: bool = False
    ) -> list[BrokerEvent]:
        """Unregister the registered workers among ``peers`` at once, as if each had sent
        DISCONNECT (MDP-W-13): their requests go back to the front of their queues together, in
        order of acceptance (MDP-D-08, MDP-A-03), so none is handed to another of them. For a
        worker made of several registrations (an eMQP worker's slots). ``unsent``: their
        requests were handed to them in this very call and will not be sent, so going back
        does not count as one of their re-dispatches. ``expired``: the dialect's own liveness
        clock found the worker silent too long (its registrations are not timed here, FAM-02):
        each is ``WorkerExpired`` and silenced, as by MDP-H-05."""
        events = self._advance(now)
        lost: list[tuple[RequestRecord, bytes]] = []
        self._lost_in_advance = lost
        try:
            for peer in peers:
                worker = self._workers.get(peer)
                if worker is None:
                    continue
                if unsent and worker.request is not None:
                    worker.request.attempts -= 1
                if expired:  # MDP-H-05's cell, whatever the peer's traits say of its timer
                    events.append(WorkerExpired(peer, worker.service, worker.last_heard, now))
                    self._remove_worker(worker, now, events, disconnect_sent=False, reason=None)
                    self._silence(peer, now)
                else:
                    self._worker_input(peer, WorkerInput.DISCONNECT, now, events)
        finally:
            self._lost_in_advance = None
        if lost:
            self._requeue_lost(lost, now, events)
        return events

    def single_use(self, peer: bytes) -> None:
        """End registered worker ``peer``'s registration with its next FINAL: it is then
        unregistered (``WorkerDisconnected``, nothing sent to it) instead of waiting for another
        request. A credit-based worker's slot is one such registration per credit (eMQP READY,
        specs/emqp-1.0.md); its next credit registers afresh."""
        if peer in self._workers:
            self._single_use.add(peer)

    def services(self) -> dict[bytes, ServiceView]:
        """Every service with workers or waiting requests."""
        return {
            s.name: ServiceView(s.name, s.worker_count, len(s.idle), len(s.queue))
            for s in self._dispatcher.services()
        }

    def queued(self, service: bytes) -> int:
        """How many requests wait in the queue of ``service``."""
        record = self._dispatcher.service(service)
        return 0 if record is None else len(record.queue)

    def _worker_view(self, w: WorkerRecord) -> WorkerView:
        request = w.request
        return WorkerView(
            peer=w.peer,
            service=w.service,
            state=PeerState.IDLE if request is None else PeerState.BUSY,
            request_id=None if request is None else request.request_id,
            client=None if request is None else request.client,
            registered_at=w.registered_at,
            last_heard=w.last_heard,
            last_sent=w.last_sent,
            expires_at=self._expires_at(w),
        )

    def _expires_at(self, worker: WorkerRecord) -> float:
        traits = self._traits.get(worker.peer) if self._traits else None
        if traits is None:
            return worker.last_heard + self._span
        if not traits.heartbeats_expected:
            return float("inf")  # FAM-02
        return worker.last_heard + self._liveness_span(worker, traits)

    def _request_view(self, r: RequestRecord) -> RequestView:
        return RequestView(
            request_id=r.request_id,
            client=r.client,
            service=r.service,
            state=r.state,
            worker=None if r.worker is None else r.worker.peer,
            attempts=r.attempts,
            partials=r.partials,
            size=r.size,
            received_at=r.received_at,
            expires_at=r.expires_at if r.state is RequestState.QUEUED else None,
            abandoned=r.abandoned,
        )

    # -- time ----------------------------------------------------------------------------------

    def _advance(self, now: float) -> list[BrokerEvent]:
        if now < self._now:
            raise LocalProtocolError(f"time went backwards: {now} after {self._now}")
        self._now = now
        events: list[BrokerEvent] = []
        timers = self._timers
        if not timers.due(now):
            return events  # the common case, on every message: nothing to fire
        lost: list[tuple[RequestRecord, bytes]] = []
        self._lost_in_advance = lost
        try:
            for deadline, (kind, record) in timers.pop_due(now):
                if kind == _WORKER_TIMER:
                    self._worker_timer(record, deadline, now, events)
                elif kind == _SILENCE_TIMER:
                    self._silence_timer(record, deadline, now, events)
                else:
                    self._queue_timer(record, deadline, now, events)
        finally:
            self._lost_in_advance = None
        if lost:
            self._requeue_lost(lost, now, events)
        return events

    def _requeue_lost(
        self, lost: list[tuple[RequestRecord, bytes]], now: float, events: list[BrokerEvent]
    ) -> None:
        """Re-dispatch the requests of workers that expired in one advance (MDP-D-08).

        Only now is every worker that is dead at ``now`` unregistered, so none of them can be
        handed a request (MDP-H-07). Requests lost together go back to the front in the order
        they were accepted (MDP-A-03), whatever the order their workers' timers fired in.
        """
        lost.sort(key=lambda pair: pair[0].request_id)
        records: dict[bytes, ServiceRecord] = {}
        for request, _ in reversed(lost):
            records[request.service] = self._queue(request, now, front=True)
        for request, lost_worker in lost:
            events.append(
                RequestRedispatched(
                    request.request_id,
                    request.client,
                    request.service,
                    lost_worker,
                    request.attempts,
                    now,
                )
            )
        for record in records.values():
            self._dispatch(record, now, events)

    def _worker_timer(
        self, worker: WorkerRecord, deadline: float, now: float, events: list[BrokerEvent]
    ) -> None:
        if self._workers.get(worker.peer) is not worker or worker.timer_at != deadline:
            return  # the worker is gone, or this entry was replaced
        traits = self._traits.get(worker.peer) if self._traits else None
        if traits is not None:
            self._dialect_worker_timer(worker, traits, now, events)
            return
        if now >= worker.last_heard + self._span:
            self._worker_input(worker.peer, WorkerInput.EXPIRED, now, events)
            return
        if now >= worker.last_sent + self._interval:
            self._worker_input(worker.peer, WorkerInput.HEARTBEAT_DUE, now, events)
        self._arm_worker_timer(worker)

    def _arm_worker_timer(self, worker: WorkerRecord) -> None:
        at = min(worker.last_sent + self._interval, worker.last_heard + self._span)
        traits = self._traits.get(worker.peer) if self._traits else None
        if traits is not None:
            at = float("inf")
            if traits.heartbeats_sent:
                at = worker.last_sent + self._interval
            if traits.heartbeats_expected:
                at = min(at, worker.last_heard + self._liveness_span(worker, traits))
            if at == float("inf"):  # nothing to time: a dialect with no heartbeats at all
                worker.timer_at = at
                return
        worker.timer_at = at
        self._timers.push(at, (_WORKER_TIMER, worker))

    def _dialect_worker_timer(
        self, worker: WorkerRecord, traits: PeerTraits, now: float, events: list[BrokerEvent]
    ) -> None:
        """``_worker_timer`` for a worker whose dialect may not heartbeat (FAM-01, FAM-02),
        or not while busy (FAM-09)."""
        if traits.heartbeats_expected and now >= worker.last_heard + self._liveness_span(
            worker, traits
        ):
            self._worker_input(worker.peer, WorkerInput.EXPIRED, now, events)
            return
        if now >= worker.last_sent + self._interval:  # its table says whether to send (FAM-01)
            self._worker_input(worker.peer, WorkerInput.HEARTBEAT_DUE, now, events)
        self._arm_worker_timer(worker)

    def _liveness_span(self, worker: WorkerRecord, traits: PeerTraits) -> float:
        """How long ``worker`` may be silent: the busy span while it holds a request and its
        dialect's worker does not heartbeat then (FAM-09), else the liveness span."""
        if not traits.busy_heartbeats and worker.request is not None:
            return self._busy_span
        return self._span

    def _silence_timer(
        self, silence: _Silence, deadline: float, now: float, events: list[BrokerEvent]
    ) -> None:
        if self._silenced.get(silence.peer) is not silence or silence.timer_at != deadline:
            return
        if now >= silence.until:
            self._worker_input(silence.peer, WorkerInput.SILENCE_OVER, now, events)
        else:
            silence.timer_at = silence.until
            self._timers.push(silence.until, (_SILENCE_TIMER, silence))

    def _queued_request(self, key: tuple[bytes, int]) -> RequestRecord | None:
        """The request a queue timer names, if it is still in its queue."""
        record = self._dispatcher.service(key[0])
        return None if record is None else record.queue.get(key[1])

    def _compact_timers(self) -> None:
        """Drop the heap's stale entries once they are as many as the live ones (queue timers of
        requests dispatched early, mostly): the heap stays within twice what it must hold."""

        def live(deadline: float, entry: tuple[int, Any]) -> bool:
            kind, record = entry
            if kind == _QUEUE_TIMER:
                request = self._queued_request(record)
                return request is not None and request.expires_at == deadline
            if kind == _WORKER_TIMER:
                current: WorkerRecord | _Silence | None = self._workers.get(record.peer)
            else:
                current = self._silenced.get(record.peer)
            return current is not None and current is record and current.timer_at == deadline

        self._timers.compact(live)
        self._compact_at = 2 * len(self._timers) + _COMPACT_SLACK

    def _queue_timer(
        self, key: tuple[bytes, int], deadline: float, now: float, events: list[BrokerEvent]
    ) -> None:
        request = self._queued_request(key)
        if request is None or request.expires_at != deadline:
            return  # dispatched, done, or re-queued since (with a timer of its own)
        self._dispatcher.unqueue(request)
        del self._clients[request.client]
        self._held_bytes -= request.held
        events.append(
            RequestExpired(
                request.request_id, request.client, request.service, now - request.queued_at, now
            )
        )

    # -- the worker side -----------------------------------------------------------------------

    def _on_worker_message(
        self, peer: bytes, frames: Sequence[BodyFrame], now: float, events: list[BrokerEvent]
    ) -> None:
        try:
            code = mdp.validate_worker(frames)
        except MalformedMessage as error:
            self._worker_input(
                peer, WorkerInput.INVALID, now, events, reason=error.reason, rule=error.rule
            )
            return
        input_ = _WORKER_INPUT_OF_CODE[code]
        if input_ is _IN_PARTIAL or input_ is _IN_FINAL:
            self._worker_reply(peer, input_, frames[2], tuple(frames[4:]), now, events)
        elif input_ is _IN_READY:
            service = frames[2]
            assert isinstance(service, bytes)  # validate_worker checked it
            if service.startswith(MMI_PREFIX):
                input_ = WorkerInput.READY_RESERVED
            self._worker_input(peer, input_, now, events, service=service)
        else:
            self._worker_input(peer, input_, now, events)

    def _worker_reply(
        self,
        peer: bytes,
        input_: WorkerInput,
        address: BodyFrame,
        body: Relayed,
        now: float,
        events: list[BrokerEvent],
    ) -> None:
        """A worker's PARTIAL or FINAL for the client at ``address`` (MDP-R-01, MDP-D-13)."""
        worker = self._workers.get(peer)
        request = None if worker is None else worker.request
        if request is not None and request.client != address:
            input_ = WorkerInput.FOREIGN_REPLY
        self._worker_input(peer, input_, now, events, body=body)

    def _worker_input(
        self,
        peer: bytes,
        input_: WorkerInput,
        now: float,
        events: list[BrokerEvent],
        *,
        service: bytes = b"",
        body: Relayed = (),
        reason: str | None = None,
        rule: str | None = None,
    ) -> None:
        """Apply ``WORKER_TRANSITIONS`` for one input to ``peer``'s worker side."""
        worker = self._workers.get(peer)
        if worker is not None:
            state = _IDLE if worker.request is None else _BUSY
        else:
            state = _SILENCED if peer in self._silenced else _UNKNOWN
        if self._traits and peer in self._traits:  # a dialect's own table (FAM-01..03)
            transition = self._tables[self._traits[peer]][state, input_]
        else:
            transition = WORKER_TRANSITIONS[state, input_]
        if transition.violation:
            why = reason if reason is not None else _VIOLATION_REASONS[input_]
            kicked = Action.SEND_DISCONNECT in transition.actions
            action: ViolationAction = "disconnected" if kicked else "dropped"
            events.append(ProtocolViolation(peer, rule or transition.rule, why, action, now))
        for step in transition.actions:
            if step is _REFRESH:
                assert worker is not None
                worker.last_heard = now
            elif step is _FORWARD_PARTIAL:
                assert worker is not None
                self._forward_partial(worker, body, now, events)
            elif step is _FORWARD_FINAL:
                assert worker is not None
                self._forward_final(worker, body, now, events)
            elif step is _REGISTER:
                self._register(peer, service, now, events)
            elif step is Action.SEND_HEARTBEAT:
                assert worker is not None
                worker.last_sent = self._now
                neutral = self._neutral and peer in self._neutral
                self._outbox.append((peer, HEARTBEAT if neutral else mdp.HEARTBEAT_FRAMES))
            elif step is Action.SEND_DISCONNECT:
                self._send_leave(peer)
            elif step is Action.UNREGISTER:
                assert worker is not None
                if input_ is WorkerInput.EXPIRED:
                    busy = worker.request is not None and not self._busy_heartbeats(peer)
                    events.append(WorkerExpired(peer, worker.service, worker.last_heard, now, busy))
                    self._remove_worker(worker, now, events, disconnect_sent=False, reason=None)
                else:
                    self._remove_worker(
                        worker,
                        now,
                        events,
                        disconnect_sent=Action.SEND_DISCONNECT in transition.actions,
                        reason=_DISCONNECT_REASONS[input_],
                    )
            elif step is Action.SILENCE:
                self._silence(peer, now)
            elif step is Action.KEEP_SILENT:
                self._keep_silent(peer, input_, now, events)
            elif step is Action.FORGET:
                del self._silenced[peer]

    def _busy_heartbeats(self, peer: bytes) -> bool:
        """Whether ``peer`` heartbeats while busy (FAM-09)."""
        traits = self._traits.get(peer) if self._traits else None
        return traits is None or traits.busy_heartbeats

    def _disconnects(self, peer: bytes) -> bool:
        """Whether DISCONNECT is sent to ``peer`` (FAM-03)."""
        traits = self._traits.get(peer) if self._traits else None
        return traits is None or traits.disconnect

    def _send_leave(self, peer: bytes) -> None:
        neutral = self._neutral and peer in self._neutral
        self._outbox.append((peer, LEAVE if neutral else mdp.DISCONNECT_FRAMES))

    def _send_request(self, worker: WorkerRecord, request: RequestRecord) -> None:
        """A REQUEST to a worker: MDP/0.2 frames, or a neutral command for its codec."""
        worker.last_sent = self._now
        peer = worker.peer
        body = request.body
        if self._neutral and peer in self._neutral:
            command = _new_tuple(
                CoreCommand, (_TO_WORKER, _REQUEST, request.service, request.client, body)
            )
            self._outbox.append((peer, command))
        else:  # FAM-10: MDP/0.2 has no zero-frame body: one empty frame stands for none
            frames = (WORKER_HEADER, W_REQUEST, request.client, b"", *(body or _EMPTY_BODY))
            self._outbox.append((peer, frames))

    def _send_client(self, peer: bytes, command: Command, service: bytes, body: Relayed) -> None:
        """A reply to a client; if that peer is a worker too, it was sent something (MDP-D-05)."""
        worker = self._workers.get(peer)
        if worker is not None:
            worker.last_sent = self._now
        if self._neutral and peer in self._neutral:
            reply = _new_tuple(CoreCommand, (_TO_CLIENT, command, service, b"", body))
            self._outbox.append((peer, reply))
        else:  # FAM-10: an empty body goes to an MDP/0.2 client as one empty frame
            code = C_FINAL if command is _FINAL else C_PARTIAL
            self._outbox.append((peer, (CLIENT_HEADER, code, service, *(body or _EMPTY_BODY))))

    def _register(self, peer: bytes, service: bytes, now: float, events: list[BrokerEvent]) -> None:
        self._silenced.pop(peer, None)
        worker = WorkerRecord(peer, service, now)
        self._workers[peer] = worker
        record = self._dispatcher.add_worker(worker)
        self._arm_worker_timer(worker)
        events.append(WorkerRegistered(peer, service, now))
        self._dispatch(record, now, events)

    def _remove_worker(
        self,
        worker: WorkerRecord,
        now: float,
        events: list[BrokerEvent],
        *,
        disconnect_sent: bool,
        reason: DisconnectReason | None,
    ) -> None:
        """Unregister a worker; re-dispatch, drop or forget its request (MDP-D-08, MDP-D-09)."""
        del self._workers[worker.peer]
        if self._single_use:
            self._single_use.discard(worker.peer)
        if reason is not None:
            events.append(
                WorkerDisconnected(worker.peer, worker.service, reason, disconnect_sent, now)
            )
        request = self._dispatcher.remove_worker(worker)
        if request is None:
            return
        if request.abandoned:
            request.state = RequestState.DONE  # its client is gone: nothing more to do
        elif request.partials:
            self._end_request(request, "lost-after-partial", worker.peer, now, events)
        elif request.attempts > self.config.max_redispatches:
            self._end_request(request, "redispatch-limit", worker.peer, now, events)
        elif self._lost_in_advance is not None:
            self._lost_in_advance.append((request, worker.peer))  # see _requeue_lost
        else:
            events.append(
                RequestRedispatched(
                    request.request_id,
                    request.client,
                    request.service,
                    worker.peer,
                    request.attempts,
                    now,
                )
            )
            self._dispatch(self._queue(request, now, front=True), now, events)

    def _silence(self, peer: bytes, now: float) -> None:
        silence = _Silence(peer, now + self._span)
        self._silenced[peer] = silence
        self._timers.push(silence.until, (_SILENCE_TIMER, silence))

    def _keep_silent(
        self, peer: bytes, input_: WorkerInput, now: float, events: list[BrokerEvent]
    ) -> None:
        self._silenced[peer].until = now + self._span
        events.append(MessageDropped(peer, f"{input_.value} from a silenced peer", now))

    def _forward_partial(
        self, worker: WorkerRecord, body: Relayed, now: float, events: list[BrokerEvent]
    ) -> None:
        request = worker.request
        assert request is not None
        if request.abandoned:
            events.append(MessageDropped(worker.peer, "PARTIAL for a client that is gone", now))
            return
        size = sum(map(len, body))
        if size > self._max_message:  # MDP-D-25: the worker finishes, nothing more is relayed
            request.abandoned = True
            self._end_request(request, "partial-too-large", worker.peer, now, events)
            return
        request.partials += 1
        self._send_client(request.client, _PARTIAL, request.service, body)
        self._cargo.append((self._taken + len(self._outbox) - 1, request.client, request))
        events.append(
            PartialForwarded(
                request.request_id,
                request.client,
                request.service,
                worker.peer,
                size,
                now,
            )
        )

    def _forward_final(
        self, worker: WorkerRecord, body: Relayed, now: float, events: list[BrokerEvent]
    ) -> None:
        request = self._dispatcher.release(worker)
        if request.abandoned:
            events.append(MessageDropped(worker.peer, "FINAL for a client that is gone", now))
        elif (size := sum(map(len, body))) > self._max_message:  # MDP-D-25: not relayed
            self._end_request(request, "final-too-large", worker.peer, now, events)
        else:
            del self._clients[request.client]
            self._held_bytes -= request.held
            self._send_client(request.client, _FINAL, request.service, body)
            # Completed once the runtime has sent it (flushed), dropped if it could not.
            completed = RequestCompleted(
                request.request_id,
                request.client,
                request.service,
                worker.peer,
                request.partials,
                size,
                now - request.received_at,
                now,
            )
            self._finals.append(completed)
            self._final_seq.append(self._taken + len(self._outbox) - 1)
        if self._single_use and worker.peer in self._single_use:
            # Its one request is done: it leaves before it could be handed another.
            self._remove_worker(worker, now, events, disconnect_sent=False, reason="spent")
            return
        if self._traits and worker.timer_at > now + self._span:
            self._arm_worker_timer(worker)  # its timer was for a busy span (FAM-09)
        record = self._dispatcher.service(worker.service)
        assert record is not None
        if record.queue:  # the worker is idle again: a waiting request goes to it
            self._dispatch(record, now, events)

    # -- the client side -----------------------------------------------------------------------

    def _on_client_message(
        self, peer: bytes, frames: Sequence[BodyFrame], now: float, events: list[BrokerEvent]
    ) -> None:
        try:
            code = mdp.validate_client(frames)
        except MalformedMessage as error:
            events.append(ProtocolViolation(peer, error.rule, error.reason, "dropped", now))
            return
        if code != mdp.C_REQUEST:
            reason = "PARTIAL/FINAL are broker-to-client commands"
            events.append(ProtocolViolation(peer, "MDP-D-16", reason, "dropped", now))
            return
        service = frames[2]
        assert isinstance(service, bytes)  # validate_client checked it
        body = tuple(frames[3:])
        self._client_request(peer, service, body, now, events)

    def _client_request(
        self, peer: bytes, service: bytes, body: Relayed, now: float, events: list[BrokerEvent]
    ) -> None:
        """A client's valid REQUEST: MMI, or queued and dispatched (MDP-S-02, MDP-A-03)."""
        if peer in self._clients:
            reason = "REQUEST while this client has one outstanding; the first stands"
            events.append(ProtocolViolation(peer, "MDP-S-02", reason, "dropped", now))
            return
        if service.startswith(MMI_PREFIX) and (peer not in self._traits or self._traits[peer].mmi):
            self._mmi(peer, service, body, now, events)  # FAM-04: only where the dialect has it
            return
        if self._congested and self._refused_as_congested(peer, service, body, now, events):
            return
        if self._draining:  # MDP-D-34: a draining broker takes no new request
            size, held = sum(map(len, body)), self._held_bytes
            events.append(RequestRefused(peer, service, "draining", size, held, "MDP-D-34", now))
            return
        request = RequestRecord(self._last_request_id + 1, peer, service, body, now)
        held = self._held_bytes + request.held
        if request.size > self._max_message or held > self._max_held:
            self._refuse(request, now, events)
            return
        self._last_request_id += 1
        self._held_bytes = held
        self._clients[peer] = request
        events.append(RequestQueued(request.request_id, peer, service, request.size, now))
        self._dispatch(self._queue(request, now, front=False), now, events)

    def _refused_as_congested(
        self, peer: bytes, service: bytes, body: Relayed, now: float, events: list[BrokerEvent]
    ) -> bool:
        """Refuse a REQUEST from a client whose pipe was full within the last
        ``liveness * heartbeat_interval`` (MDP-D-29): its reply would be dropped again, after a
        worker did the work."""
        until = self._congested.get(peer)
        if until is None:
            return False
        if now >= until:
            del self._congested[peer]
            return False
        size = sum(map(len, body))
        reason: RefusalReason = "client-congested"
        events.append(
            RequestRefused(peer, service, reason, size, self._held_bytes, "MDP-D-29", now)
        )
        return True

    def _note_congested(self, peer: bytes, now: float) -> None:
        """Remember a client whose pipe was full (MDP-D-29); forget the ones whose time is up
        once there are many, so the table stays within twice its live entries."""
        congested = self._congested
        congested[peer] = now + self._span
        if len(congested) > self._congested_at:
            self._congested = {p: until for p, until in congested.items() if until > now}
            self._congested_at = 2 * len(self._congested) + _COMPACT_SLACK

    def _refuse(self, request: RequestRecord, now: float, events: list[BrokerEvent]) -> None:
        """Refuse a REQUEST over a memory bound: hold nothing of it (MDP-D-25, MDP-D-26)."""
        if request.size > self._max_message:
            reason: RefusalReason = "too-large"
            rule = "MDP-D-25"
        else:
            reason, rule = "broker-full", "MDP-D-26"
        refused = RequestRefused(
            request.client, request.service, reason, request.size, self._held_bytes, rule, now
        )
        events.append(refused)

    def _mmi(
        self, peer: bytes, service: bytes, body: Relayed, now: float, events: list[BrokerEvent]
    ) -> None:
        # The same object if it is bytes; a (long) view is copied; no body asks about "".
        query = bytes(body[0]) if body else b""
        if service == MMI_SERVICE:
            record = self._dispatcher.service(query)
            status = b"200" if record is not None and record.worker_count else b"404"
        else:
            status = b"501"
        self._send_client(peer, _FINAL, service, (status,))
        replied = MmiReplied(peer, service, query, status, now)
        self._cargo.append((self._taken + len(self._outbox) - 1, peer, replied))
        events.append(replied)

    def _peer_failed(
        self, peer: bytes, now: float, input_: WorkerInput, drop: DropReason, unsent: int | None
    ) -> list[BrokerEvent]:
        events = self._advance(now)
        self._worker_input(peer, input_, now, events)
        # Its outstanding request is dropped if a message of its own was not sent, or if the
        # runtime did not say which message failed; a reply to an older request that was not
        # sent ends that request, not this one (MDP-D-24).
        own_lost = unsent is None
        if self._finals or self._cargo:
            own_lost = self._undelivered(peer, unsent, drop, now, events) or own_lost
        if input_ is WorkerInput.CONGESTED:
            self._note_congested(peer, now)
        request = self._clients.get(peer)
        if request is not None and own_lost:
            if request.state is RequestState.QUEUED:
                self._dispatcher.unqueue(request)
                self._end_request(request, drop, None, now, events)
            else:
                # Its worker carries on; whatever it sends for this request is dropped.
                request.abandoned = True
                peer_of_worker = None if request.worker is None else request.worker.peer
                self._end_request(request, drop, peer_of_worker, now, events)
        return events

    def _undelivered(
        self,
        peer: bytes,
        unsent: int | None,
        drop: DropReason,
        now: float,
        events: list[BrokerEvent],
    ) -> bool:
        """End what the replies to ``peer`` that were not sent carried (MDP-D-24).

        Not sent: message ``unsent`` of the outbox last taken and the later ones to ``peer`` in
        it; every reply to ``peer`` taken and not yet confirmed if ``unsent`` is None. Returns
        whether one of them was a PARTIAL of the peer's outstanding request.
        """
        first = 0 if unsent is None else self._base + unsent
        taken = self._taken

        def lost(seq: int, client: bytes) -> bool:
            return client == peer and first <= seq < taken

        if any(lost(seq, f.client) for seq, f in zip(self._final_seq, self._finals, strict=True)):
            finals: list[RequestCompleted] = []
            final_seq: list[int] = []
            for seq, final in zip(self._final_seq, self._finals, strict=True):
                if not lost(seq, final.client):
                    finals.append(final)
                    final_seq.append(seq)
                    continue
                events.append(
                    RequestDropped(
                        final.request_id,
                        final.client,
                        final.service,
                        drop,
                        final.worker,
                        "MDP-D-15",
                        now,
                    )
                )
            self._finals, self._final_seq = finals, final_seq
        outstanding = self._clients.get(peer, None)
        own_lost = False
        kept: list[tuple[int, bytes, _Cargo]] = []
        for entry in self._cargo:
            seq, client, cargo = entry
            if not lost(seq, client):
                kept.append(entry)
            elif isinstance(cargo, RequestRecord):
                own_lost = own_lost or cargo is outstanding
            else:
                reason = f"{cargo.service.decode('ascii', 'replace')} reply not sent: {drop}"
                events.append(MessageDropped(peer, reason, now))
        self._cargo = kept
        return own_lost

    # -- requests ------------------------------------------------------------------------------

    def _queue(self, request: RequestRecord, now: float, *, front: bool) -> ServiceRecord:
        """Put a request in its queue; ``_dispatch`` must follow (it arms the expiry timer)."""
        request.queued_at = now
        request.expires_at = now + self.config.request_expiry
        self._unarmed.append(request)
        return self._dispatcher.enqueue(request, front=front)

    def _end_request(
        self,
        request: RequestRecord,
        reason: DropReason,
        worker: bytes | None,
        now: float,
        events: list[BrokerEvent],
    ) -> None:
        if not request.abandoned:
            request.state = RequestState.DONE
        del self._clients[request.client]
        self._held_bytes -= request.held
        events.append(
            RequestDropped(
                request.request_id,
                request.client,
                request.service,
                reason,
                worker,
                _DROP_RULES[reason],
                now,
            )
        )

    def _dispatch(self, record: ServiceRecord, now: float, events: list[BrokerEvent]) -> None:
        """Hand waiting requests of one service to its idle workers (work conservation)."""
        while (pair := self._dispatcher.next_assignment(record)) is not None:
            request, worker = pair
            self._send_request(worker, request)
            events.append(
                RequestDispatched(
                    request.request_id,
                    request.client,
                    request.service,
                    worker.peer,
                    request.attempts,
                    now - request.queued_at,
                    now,
                )
            )
        # Most requests are dispatched in the call that queued them: an expiry timer for those
        # would only keep them (and their bodies) alive in the heap for request_expiry seconds.
        if self._unarmed:
            for request in self._unarmed:
                if request.state is _QUEUED:
                    # By key, not the record: a request dispatched before its expiry leaves an
                    # entry that must not keep its body alive (MDP-D-26).
                    key = (request.service, request.request_id)
                    self._timers.push(request.expires_at, (_QUEUE_TIMER, key))
                    if len(self._timers) > self._compact_at:
                        self._compact_timers()
            self._unarmed.clear()
