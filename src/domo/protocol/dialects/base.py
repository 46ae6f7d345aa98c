"""What every dialect codec is made of: the ``Dialect`` names, ``Capabilities``, ``DialectCodec``.

A dialect is data: a frozen ``DialectCodec`` record with its capabilities and three pure
functions (which messages it claims, how they decode into the core's neutral commands, how the
core's neutral commands encode back for one peer). ``domo.protocol.dialects.registry`` holds one
record per dialect and the broker consults it; nothing here keeps state, does I/O or reads a
clock.

The core's commands are neutral (``commands.CoreCommand``: who, what, service, address, body):
no dialect's frames stand between a peer and the core but its own (FAM-10). MDP/0.2's frames
are the core's own fast path, for MDP/0.2 peers on the broker's first socket only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol

from ..broker import PeerState
from ..commands import CORE_CODES, Command, CoreCommand, Role
from ..mdp import BodyFrame, Relayed

__all__ = [
    "CORE_CODES",
    "MDPC01",
    "MDPC02",
    "MDPW01",
    "MDPW02",
    "NUMBERED",
    "Capabilities",
    "Command",
    "CoreCommand",
    "Dialect",
    "DialectCodec",
    "Invalid",
    "Lookup",
    "Reading",
    "Role",
    "RouteView",
    "Translation",
]

MDPC02, MDPW02, MDPC01, MDPW01 = b"MDPC02", b"MDPW02", b"MDPC01", b"MDPW01"

# The request key a codec's ``request_key`` gives a client's request that names none (an RFC 7
# client's): the broker numbers that client's requests itself (FAM-08).
NUMBERED = b""


class Invalid(NamedTuple):
    """What a codec's ``decode`` gives for a message it cannot read: the rule it breaks and
    why. The core treats it as MDP/0.2 treats garbage (``Broker.invalid``: a registered worker
    is dropped, MDP-W-16; anyone else's message is dropped with a ``ProtocolViolation``)."""

    rule: str
    reason: str


class Reading(NamedTuple):
    """A message as one pass of its codec reads it (``DialectCodec.read``): what ``decode``,
    ``request_key`` and ``reply_context`` give of it, the message itself unchanged.

    - ``command``: the neutral command (``decode``'s), or ``Invalid``.
    - ``request_key``: the key that names its request (``request_key``'s first part), ``NUMBERED``
      for a request that names none, or None for a message that names none.
    - ``context``: what the reply carries back (``reply_context``'s), ``()`` for none.
    """

    command: CoreCommand | Invalid
    request_key: bytes | None = None
    context: tuple[bytes, ...] = ()


class Dialect(Enum):
    """Which member of the family a peer speaks."""

    MDP02 = "mdp02"
    MDP02_REQ = "mdp02-req"
    MDP01 = "mdp01"
    MAJORTOMO = "majortomo"
    DCP = "dcp"
    EMQP = "emqp"

    # Members are singletons: hash by identity, in C (they key per-message tables).
    __hash__ = object.__hash__


@dataclass(frozen=True, slots=True)
class Translation:
    """One row of a dialect's table: a message of the dialect and the core command it is.

    - ``role``: the dialect peer's side (its client or its worker).
    - ``inbound``: from the peer to the broker (decoded), or from the broker to it (encoded).
    - ``command``: the core command.
    - ``frames``: how the dialect's message starts, as the peer sees it on its socket with no
      envelope (the leading empty frame included where the dialect has one), up to and with its
      command frame; the command's arguments follow. ``None`` for an outbound command the
      dialect's peer never gets (withheld).
    - ``rule``: the rule id that decides it (the dialect's, or MDP/0.2's where it applies).

    A dialect's rows are the whole of its codec as data: ``tests/protocol/test_dialect_tables``
    runs each through the codec, and a command code without a row is refused by the core;
    ``domo.spec_tables`` renders them into the dialect's spec.
    """

    role: Role
    inbound: bool
    command: Command
    frames: tuple[bytes, ...] | None
    rule: str


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a dialect's peers can do, as the broker must know it to serve them.

    The broker acts on each (``specs/family.md``): PARTIALs are withheld from a client whose
    dialect has no ``partial_replies``; a client may sit behind 28/REQREP address frames only if
    its dialect has ``client_hops`` (a worker never does); ``worker_heartbeats``,
    ``broker_heartbeats``, ``disconnect`` and ``mmi`` become the peer's ``PeerTraits`` in the
    core (FAM-01..04); ``outstanding_per_client`` bounds what a client of the dialect may have
    in flight (1: MDP-S-02; N above 1: counted per client, FAM-05; None: any number, up to the
    broker's ``max_client_requests``, FAM-07); ``busy_heartbeats`` false: its worker is silent
    while busy, and is given ``busy_worker_timeout`` then (FAM-09).
    """

    clients: bool  # the dialect has clients
    workers: bool  # the dialect has workers
    partial_replies: bool  # its client reads PARTIALs; otherwise it gets the FINAL alone
    worker_heartbeats: bool  # its worker sends HEARTBEAT (and is expired when silent)
    broker_heartbeats: bool  # the broker sends HEARTBEAT to its worker
    disconnect: bool  # DISCONNECT exists, from the worker and from the broker
    mmi: bool  # its client may ask the broker's mmi.* services
    outstanding_per_client: int | None  # requests one client may have in flight; None: any
    client_hops: bool  # its client may be behind a REQ socket and ROUTER-DEALER hops
    # Its worker heartbeats while busy too; otherwise a busy one is dead only after the
    # broker's busy_worker_timeout (FAM-09).
    busy_heartbeats: bool = True


class RouteView(Protocol):
    """What a dialect's ``encode`` may read of a peer's route (``family.PeerRoute``)."""

    @property
    def routing_id(self) -> bytes: ...
    @property
    def envelope(self) -> Relayed: ...
    @property
    def dialect(self) -> Enum: ...
    @property
    def request_key(self) -> bytes | None: ...
    @property
    def context(self) -> tuple[bytes, ...]: ...
    @property
    def service(self) -> bytes | None: ...


# ``encode``'s third argument: the route of another peer key (a request's client, say), or None
# for a peer with no route (an MDP/0.2 peer on the broker's first socket).
Lookup = Callable[[bytes], RouteView | None]


@dataclass(frozen=True, slots=True)
class DialectCodec:
    """One dialect: its capabilities and its codec, as pure functions.

    - ``claims(header, command)``: the role of a message whose frames after the envelope start
      with ``header``, ``command`` (``b""`` if it has none), or None if it is not this dialect's.
    - ``decode(message)``: the message (the frames after the envelope's delimiter, or all of
      them for a peer with no envelope) as the core's neutral ``CoreCommand``, the ``role`` its
      sender's side, or ``Invalid`` (the rule it breaks) for a message it cannot read. The
      body is the dialect's own frames, as many as it has (none included, FAM-10); a dialect
      whose body is one frame or more checks that here.
    - ``encode(route, command, lookup)``: what the core sends a peer of this dialect (a
      neutral ``CoreCommand``, ``role`` the peer's side) in this dialect's framing: the frames
      after the routing id, behind the route's envelope where the peer has one, for the route's
      request key where the dialect keys requests; or None to send nothing. ``lookup`` gives
      another key's route (a request's client, say). PARTIALs to a client without
      ``partial_replies`` never reach ``encode`` (the broker withholds them, MDP01-05).
    - ``delimited``: its messages start with an empty frame (after the envelope, if any); only
      MDP/0.2's do not, and they are told by their first frame.
    - ``request_key``: for a dialect whose client may have several requests outstanding
      (``outstanding_per_client`` None or above 1), splits a message (after the delimiter) into
      the key that names its request and the message without it, or gives None for a message
      that names none (a worker's; DCP keys its workers too, by their type width). The broker
      holds each (client, request key) as a client of its own, so the core's
      one-request-per-client rule (MDP-S-02) holds per key, and counts a client's keys against
      ``outstanding_per_client`` (FAM-05) and ``max_client_requests`` (FAM-07). ``NUMBERED``
      (empty) as the key: the request names none of its own, and the broker numbers the
      client's requests in the order they come (FAM-08).
    - ``table``: the codec as data, one ``Translation`` per command each way (empty: none
      given; every dialect domo ships has one).
    - ``refuse(envelope, request_key)``: the dialect's answer to a request beyond
      ``outstanding_per_client`` (the frames after the routing id, behind ``envelope``), or
      None to refuse it without an answer; no ``refuse`` at all: no answer (FAM-05).

    Three optional hooks serve a dialect that needs more than a frame-for-frame codec (DCP):

    - ``check(message)``: (rule, reason) if the message is malformed in the dialect's own terms;
      the broker then drops it with a ``ProtocolViolation`` naming that rule, before the core.
    - ``reply_context(message)``: what the broker keeps, with a keyed request's route, to put in
      the reply (``PeerRoute.context``).
    - ``answer(message, before, after)``: a message the broker sends the peer itself, right
      after the core had its message (one its codec claims as a worker's), from its worker
      side's ``PeerState`` before and after (a DCP pong, reconnect or registration echo).

    ``read(message)``: every hook above that reads a peer's message, in one pass: ``check``'s
    (rule, reason) for a malformed message, else a ``Reading`` (``decode``'s command,
    ``request_key``'s key, ``reply_context``'s context). A codec that has it must give the same
    as those hooks (they may be made of it); the broker then reads each message once (a codec
    whose ``request_key`` changes the message has none).

    ``dialect`` is a ``Dialect`` for the built-in dialects; a dialect of one's own may use any
    ``Enum`` member with a ``str`` value (it names the dialect in peer keys).
    """

    dialect: Enum
    capabilities: Capabilities
    claims: Callable[[BodyFrame, BodyFrame], Role | None]
    decode: Callable[[Sequence[BodyFrame]], CoreCommand | Invalid]
    encode: Callable[[RouteView, CoreCommand, Lookup], Relayed | None]
    delimited: bool = True
    request_key: (
        Callable[[Sequence[BodyFrame]], tuple[bytes, Sequence[BodyFrame]] | None] | None
    ) = None
    check: Callable[[Sequence[BodyFrame]], tuple[str, str] | None] | None = None
    reply_context: Callable[[Sequence[BodyFrame]], tuple[bytes, ...]] | None = None
    answer: Callable[[Sequence[BodyFrame], PeerState, PeerState], Relayed | None] | None = None
    refuse: Callable[[Relayed, bytes], Relayed | None] | None = None
    read: Callable[[Sequence[BodyFrame]], Reading | tuple[str, str]] | None = None
    table: tuple[Translation, ...] = ()

    def __post_init__(self) -> None:
        outstanding = self.capabilities.outstanding_per_client
        keyed = self.request_key is not None
        if outstanding is not None and outstanding < 1:
            raise ValueError(f"{self.dialect}: outstanding_per_client must be >= 1 or None")
        if (outstanding is None or outstanding > 1) and not keyed:
            raise ValueError(f"{self.dialect}: several requests per client need a request_key")
        if outstanding == 1 and keyed:
            raise ValueError(f"{self.dialect}: one request per client needs no request_key")
