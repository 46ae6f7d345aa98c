"""The events the three MDP/0.2 machines emit: small, frozen, slotted records.

Every observable thing a machine does is an event, so that a runtime can log it, a metrics layer can
count it and a trace can be rebuilt from it. Events carry the peers, the service, sizes (bytes of
body, summed over frames) and times (``at`` is the ``now`` of the input that caused the event).

``BrokerEvent``, ``WorkerEvent`` and ``ClientEvent`` are the unions for each machine, so a handler
can ``match`` them exhaustively under ``mypy --strict`` (``typing_extensions.assert_never``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal, TypeAlias, TypeVar

from typing_extensions import dataclass_transform

from .mdp import Frames

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def event(cls: type[_T]) -> type[_T]:
    """``@dataclass(frozen=True, slots=True)``, with an ``__init__`` twice as fast.

    A frozen dataclass's own ``__init__`` sets each field through ``object.__setattr__``; this
    one calls each slot's descriptor directly, which is what a broker emitting three events per
    request notices (``benchmarks/core.py``). Fields, repr, equality, hashing, pattern matching
    and immutability are the dataclass's own.
    """
    frozen = dataclass(frozen=True, slots=True)(cls)
    names = [field.name for field in fields(frozen)]  # type: ignore[arg-type]
    setters: dict[str, Any] = {f"_set_{n}": getattr(frozen, n).__set__ for n in names}
    parameters = []
    for field in fields(frozen):  # type: ignore[arg-type]
        if field.default is MISSING:
            parameters.append(field.name)
        else:  # a field added later, with a default so that older callers still work
            setters[f"_default_{field.name}"] = field.default
            parameters.append(f"{field.name}=_default_{field.name}")
    source = f"def __init__(self, {', '.join(parameters)}):\n" + "".join(
        f"    _set_{n}(self, {n})\n" for n in names
    )
    exec(source, setters)  # the same technique dataclasses itself uses to build __init__
    init: Callable[..., None] = setters["__init__"]
    init.__qualname__ = f"{frozen.__qualname__}.__init__"
    frozen.__init__ = init  # type: ignore[method-assign]
    return frozen


__all__ = [
    "BrokerEvent",
    "ClientEvent",
    "ConnectionClosed",
    "FinalReceived",
    "MessageDropped",
    "MmiReplied",
    "PartialForwarded",
    "PartialReceived",
    "ProtocolViolation",
    "ReconnectRequired",
    "RefusalReason",
    "RequestAbandoned",
    "RequestCompleted",
    "RequestDispatched",
    "RequestDropped",
    "RequestExpired",
    "RequestFailed",
    "RequestQueued",
    "RequestReceived",
    "RequestRedispatched",
    "RequestRefused",
    "RequestSent",
    "ViolationAction",
    "WorkerConnected",
    "WorkerDisconnected",
    "WorkerEvent",
    "WorkerExpired",
    "WorkerRegistered",
]

# --- shared -----------------------------------------------------------------------------------

ViolationAction: TypeAlias = Literal["dropped", "disconnected", "reconnecting"]


@event
class ProtocolViolation:
    """A remote peer broke a rule; ``action`` says what the machine did about it.

    ``peer`` is the ROUTER identity (or, for another dialect's peer, the family broker's peer
    key) for the broker, ``None`` for a session (its peer is the broker). ``rule`` is the id of
    the rule broken, in the spec of the peer's dialect: ``MDP-…`` in ``specs/mdp-0.2.md``,
    ``DCP-…`` in ``specs/dcp-v1.md``, and so on.
    """

    peer: bytes | None
    rule: str
    reason: str
    action: ViolationAction
    at: float


# --- broker -----------------------------------------------------------------------------------

DisconnectReason: TypeAlias = Literal[
    "worker-disconnect",  # the worker sent DISCONNECT
    "unexpected-command",  # a valid but unexpected command; the broker sent DISCONNECT
    "invalid-message",  # a malformed message; the worker is treated as invalid
    "unreachable",  # the I/O layer could not route to it (EHOSTUNREACH)
    "congested",  # the I/O layer found its pipe full (EAGAIN at the high-water mark)
    "pending-full",  # a message to it would take the bytes pending in ZeroMQ over (MDP-D-30)
    "broker-shutdown",  # the broker is stopping; it sent DISCONNECT
    "spent",  # a single-use registration (one credit of an eMQP worker) did its request
]

DropReason: TypeAlias = Literal[
    "redispatch-limit",  # its workers died too many times
    "lost-after-partial",  # its worker died after a PARTIAL had been forwarded
    "client-unreachable",  # the client's connection is gone
    "client-congested",  # the client does not read its replies
    "pending-full",  # its reply would take the bytes pending in ZeroMQ over (MDP-D-30)
    "broker-shutdown",  # the broker is stopping
    "final-too-large",  # the worker's FINAL is over max_message_bytes (MDP-D-25)
    "partial-too-large",  # a PARTIAL is over max_message_bytes; the worker carries on (MDP-D-25)
]

RefusalReason: TypeAlias = Literal[
    "too-large",  # the body is over max_message_bytes (MDP-D-25)
    "broker-full",  # accepting it would take the held requests over max_held_bytes (MDP-D-26)
    "client-congested",  # its client's pipe was full a moment ago: it is not reading (MDP-D-29)
    "draining",  # the broker is draining before it stops: it takes no new request (MDP-D-34)
    "client-limit",  # its client has max_client_requests outstanding already (FAM-07)
]


@event
class WorkerRegistered:
    """A worker sent READY and now serves ``service``."""

    worker: bytes
    service: bytes
    at: float


@event
class WorkerExpired:
    """A worker was silent for ``liveness * heartbeat_interval`` and is gone (MDP-H-05); or,
    ``busy``, a worker whose dialect's worker is silent while busy held its request for
    ``busy_worker_timeout`` without a word (FAM-09)."""

    worker: bytes
    service: bytes
    last_heard: float
    at: float
    busy: bool = False


@event
class WorkerDisconnected:
    """A worker is gone for ``reason``; ``disconnect_sent``: the broker sent it DISCONNECT."""

    worker: bytes
    service: bytes
    reason: DisconnectReason
    disconnect_sent: bool
    at: float


@event
class RequestQueued:
    """A client REQUEST was accepted into the queue of ``service``."""

    request_id: int
    client: bytes
    service: bytes
    size: int
    at: float


@event
class RequestDispatched:
    """A request went to ``worker``; ``attempt`` counts from 1, ``waited`` is time in the queue."""

    request_id: int
    client: bytes
    service: bytes
    worker: bytes
    attempt: int
    waited: float
    at: float


@event
class RequestRedispatched:
    """The worker of a request was lost; the request is back at the front of its queue."""

    request_id: int
    client: bytes
    service: bytes
    lost_worker: bytes
    attempts: int
    at: float


@event
class PartialForwarded:
    """A PARTIAL from ``worker`` was forwarded to ``client``."""

    request_id: int
    client: bytes
    service: bytes
    worker: bytes
    size: int
    at: float


@event
class RequestCompleted:
    """The FINAL of a request was handed to ZeroMQ for its client; the request is done.

    The broker emits it from ``flushed()``, once the I/O layer has sent the FINAL (MDP-D-24);
    ``at`` and ``elapsed`` are those of the moment the worker's FINAL was forwarded.
    """

    request_id: int
    client: bytes
    service: bytes
    worker: bytes
    partials: int
    size: int
    elapsed: float
    at: float


@event
class RequestExpired:
    """A request waited in its queue for ``request_expiry`` without a worker (MDP-C-11)."""

    request_id: int
    client: bytes
    service: bytes
    waited: float
    at: float


@event
class RequestDropped:
    """A request was given up for ``reason``; its client gets no (further) reply from this broker.

    ``rule`` is the id of the rule in ``specs/mdp-0.2.md`` that decided it (``MDP-D-08``,
    ``MDP-D-09``, ``MDP-D-15``, ``MDP-W-14``). A request whose FINAL the I/O layer could not
    send is dropped too (``client-congested`` or ``client-unreachable``, MDP-D-24).
    """

    request_id: int
    client: bytes
    service: bytes
    reason: DropReason
    worker: bytes | None
    rule: str
    at: float


@event
class RequestRefused:
    """A REQUEST was not accepted because of a memory bound: the broker holds nothing of it, and
    its client gets no reply (MDP/0.2 has no error reply for clients); it may retry later.

    ``rule`` is ``MDP-D-25`` (``too-large``), ``MDP-D-26`` (``broker-full``), ``MDP-D-29``
    (``client-congested``) or ``FAM-07`` (``client-limit``: its client has as many outstanding
    as the broker allows one client); ``size`` is the body's bytes, ``held`` the request bytes
    the broker held when it refused (bodies plus ``REQUEST_OVERHEAD`` each, MDP-D-26).
    """

    client: bytes
    service: bytes
    reason: RefusalReason
    size: int
    held: int
    rule: str
    at: float


@event
class ConnectionClosed:
    """One of the broker's connections closed (MDP-D-31); reported by a runtime, not the core.

    ZeroMQ closes a connection on which a frame over ``max_message_bytes`` arrives (MDP-D-25)
    without saying so, and tells a socket's monitor only that the connection closed, as when
    the peer closed it: ``reason`` says both, since the broker cannot tell which. ``endpoint`` is
    the broker's endpoint it came in on.
    """

    endpoint: str
    reason: str
    rule: str
    at: float


@event
class MmiReplied:
    """The broker answered an ``mmi.*`` request itself with ``status`` ("200", "404", "501")."""

    client: bytes
    service: bytes
    query: bytes
    status: bytes
    at: float


@event
class MessageDropped:
    """A message was ignored without it being a violation (a silenced peer, a late reply).

    ``peer`` is ``None`` in a session (its only peer is the broker).
    """

    peer: bytes | None
    reason: str
    at: float


BrokerEvent: TypeAlias = (
    WorkerRegistered
    | WorkerExpired
    | WorkerDisconnected
    | RequestQueued
    | RequestDispatched
    | RequestRedispatched
    | PartialForwarded
    | RequestCompleted
    | RequestExpired
    | RequestDropped
    | RequestRefused
    | MmiReplied
    | MessageDropped
    | ProtocolViolation
    | ConnectionClosed
)


# --- sessions (worker and client) -------------------------------------------------------------

ReconnectReason: TypeAlias = Literal[
    "broker-disconnect",  # the broker sent DISCONNECT (MDP-W-17)
    "broker-lost",  # no heartbeat from the broker within liveness * interval (MDP-H-06)
    "protocol-violation",  # the broker broke the dialog; we sent DISCONNECT (MDP-D-17)
    "timeout",  # a client request got no reply in time (MDP-C-08)
    "request-failed",  # a client request failed; its socket may hold stale replies
]


@event
class ReconnectRequired:
    """Close the socket now; open a new one at ``reconnect_at`` and call ``connected()``."""

    reason: ReconnectReason
    reconnect_at: float
    at: float


@event
class WorkerConnected:
    """The worker session has a new socket and queued READY for ``service``."""

    service: bytes
    at: float


@event
class RequestReceived:
    """The broker handed the worker a request from ``client``; reply with PARTIAL* and FINAL.

    ``number`` counts the session's requests from 1; ``WorkerSession.current_request`` tells a
    runtime whether the request it is answering is still the one in progress.
    """

    client: bytes
    body: Frames
    number: int
    at: float


@event
class RequestAbandoned:
    """The worker's current request from ``client`` will not be answered on this connection."""

    client: bytes
    reason: ReconnectReason | Literal["local-disconnect"]
    at: float


WorkerEvent: TypeAlias = (
    WorkerConnected
    | RequestReceived
    | RequestAbandoned
    | ReconnectRequired
    | ProtocolViolation
    | MessageDropped
)


@event
class RequestSent:
    """The client session queued REQUEST for ``service`` (attempt 1, or a retry)."""

    service: bytes
    attempt: int
    at: float


@event
class PartialReceived:
    """A PARTIAL reply arrived for the outstanding request."""

    service: bytes
    body: Frames
    attempt: int
    at: float


@event
class FinalReceived:
    """The FINAL reply arrived; the client session is free for the next request."""

    service: bytes
    body: Frames
    attempt: int
    elapsed: float
    at: float


FailureReason: TypeAlias = Literal[
    "retries-exhausted",  # every attempt timed out
    "timeout-after-partial",  # a timeout after PARTIALs arrived: a resend could repeat them
    "cancelled",  # the application cancelled the request
]


@event
class RequestFailed:
    """The outstanding request failed for ``reason`` after ``attempts`` attempts."""

    service: bytes
    attempts: int
    reason: FailureReason
    at: float


ClientEvent: TypeAlias = (
    RequestSent
    | PartialReceived
    | FinalReceived
    | RequestFailed
    | ReconnectRequired
    | ProtocolViolation
    | MessageDropped
)
