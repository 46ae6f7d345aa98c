"""DagBox Communication Protocol v1 (DCP, ``specs/dcp-v1.md``) as a dialect of the family core.

A DCP peer is one DEALER that may be a client, a worker or both. Every message is ``""``,
``DGBX\\x01``, a type frame, then the type's parts (DCP-01). The text gives the type frame one
byte; DagBox's broker reads a 4-byte little-endian integer. Both are read, and each peer is
answered in the width it used (DCP-02, DCP-03).

How DCP maps onto the family core's neutral commands:

- registration (0x01) is REGISTER, ping (0x02) is HEARTBEAT, a worker's reply (0x05) is its
  FINAL; a request (0x04) is a client REQUEST whose body is the data parts, exactly: none, one
  empty part, or many (DCP-21, FAM-10).
- A client may have several requests in flight (DCP-10). Each is a client of its own to the
  core, keyed by a digest of what the reply must carry back: the type width, the service, the
  client-address part if the client wrote one, and the metadata parts (by the width and the
  service as they are, for a short service with neither address nor metadata: no digest to
  make). The broker keeps those (``reply_context``) and puts them in the reply itself (DCP-08,
  DCP-09).
- A worker is sent, as its request's client address, the core's key of the client: an opaque
  token it copies into its reply (DCP-11, DCP-12). The metadata it is sent are the client's.
- The broker never pings (DCP-16): the core's HEARTBEAT to a DCP worker is not sent; its
  LEAVE goes out as reconnect (0x06, DCP-24). A ping gets pong from a registered worker,
  reconnect from anyone else (DCP-13, DCP-14); a registration is echoed when it registers (DCP-04).
- Malformed DCP is dropped with an event naming the rule, before the core sees it (DCP-23).

Nothing here keeps state: what the broker must remember per peer is in its ``PeerRoute``.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b
from typing import TypeGuard

from ..broker import PeerState
from ..commands import HEARTBEAT
from ..mdp import MAX_NAME_LENGTH, BodyFrame, Relayed
from .base import (
    Capabilities,
    Command,
    CoreCommand,
    Dialect,
    DialectCodec,
    Invalid,
    Lookup,
    Reading,
    Role,
    RouteView,
)

__all__ = [
    "DCP",
    "HEADER",
    "PING",
    "PONG",
    "RECONNECT",
    "REGISTER",
    "REPLY",
    "REQUEST",
    "check",
    "type_frame",
]

HEADER = b"DGBX\x01"  # DCP-01: "DGBX" and version 1
_MAGIC = b"DGBX"
REGISTER, PING, PONG, REQUEST, REPLY, RECONNECT = 1, 2, 3, 4, 5, 6
_TYPE_NAMES = {
    REGISTER: "registration",
    PING: "ping",
    PONG: "pong",
    REQUEST: "request",
    REPLY: "reply",
    RECONNECT: "reconnect",
}
NARROW, WIDE = 1, 4  # type-frame widths: the text's byte, DagBox's little-endian int (DCP-02)
_RESERVED_PREFIX = b"mmi."
# A worker key's request key: its type width, so that what it is sent uses the same (DCP-03).
_WORKER_KEY = b"W"
_CLIENT_KEY = b"R"
_PLAIN_KEY = b"P"
_PRINTABLE = bytes(range(0x20, 0x7F))
_CLIENT, _REQUEST = Role.CLIENT, Command.REQUEST
_new_tuple = tuple.__new__  # bound once: ``tuple.__new__`` is a slow lookup each time
_REGISTERED = (PeerState.IDLE, PeerState.BUSY)


def type_frame(kind: int, width: int) -> bytes:
    """The type frame of ``kind`` in ``width`` bytes (1: the text's; 4: DagBox's)."""
    return kind.to_bytes(width, "little")


def _read_type(frame: BodyFrame) -> tuple[int, int] | None:
    """(type, width) of a type frame, or None if it is neither width or names no DCP type."""
    if frame.__class__ is bytes:
        return _TYPES.get(frame)
    if len(frame) not in (NARROW, WIDE):
        return None
    kind = int.from_bytes(frame, "little")
    return (kind, len(frame)) if kind in _TYPE_NAMES else None


# Every type frame there is, as ``_read_type`` reads it: (type, width).
_TYPES = {
    type_frame(kind, width): (kind, width) for kind in _TYPE_NAMES for width in (NARROW, WIDE)
}


def _valid_name(name: BodyFrame) -> TypeGuard[bytes]:
    return (
        isinstance(name, bytes)
        and 0 < len(name) <= MAX_NAME_LENGTH
        and not name.translate(None, _PRINTABLE)
    )


class _Addressed:
    """A request's or reply's parts after the service: address, metadata and data."""

    __slots__ = ("address", "data", "metadata")

    def __init__(
        self, address: bytes | None, metadata: tuple[bytes, ...], data: tuple[BodyFrame, ...]
    ) -> None:
        self.address = address
        self.metadata = metadata
        self.data = data


def _split_addressed(parts: Sequence[BodyFrame]) -> _Addressed | str:
    """``client?, "", metadata*, "", data*`` (DCP-06), or why the parts are not that."""
    at = 0
    address: bytes | None = None
    if not parts:
        return "no client-address delimiter"
    if len(parts) > 1 and not len(parts[0]) and not len(parts[1]):
        return _Addressed(None, (), tuple(parts[2:]))  # no address, no metadata: the loop's
    if len(parts[0]):
        first = parts[0]
        if not isinstance(first, bytes):
            return "a client address too long to be one"
        if len(parts) < 2 or len(parts[1]):
            return "the client address is not followed by its empty delimiter"
        address, at = first, 2
    else:
        at = 1
    metadata: list[bytes] = []
    while at < len(parts) and len(parts[at]):
        frame = parts[at]
        metadata.append(frame if isinstance(frame, bytes) else bytes(frame))
        at += 1
    if at >= len(parts):
        return "no metadata delimiter"
    return _Addressed(address, tuple(metadata), tuple(parts[at + 1 :]))


def check(message: Sequence[BodyFrame]) -> tuple[str, str] | None:
    """Why ``message`` (the frames after the leading empty frame) is not DCP v1 as the broker
    takes it, as (rule, reason), or None if it is well formed (DCP-23)."""
    read = _read(message)
    return None if read.__class__ is Reading else read  # type: ignore[return-value]


def _read(message: Sequence[BodyFrame]) -> Reading | tuple[str, str]:
    """``message`` read once (``DialectCodec.read``): why it is not DCP v1 (DCP-23), or the
    neutral command it is, its request key and what its reply carries back."""
    header = message[0]
    if header != HEADER:
        return "DCP-01", f"unsupported protocol header {bytes(header[:8])!r}"
    count = len(message)
    if count < 2:
        return "DCP-02", "no type frame"
    frame = message[1]
    typed = _TYPES.get(frame) if frame.__class__ is bytes else _read_type(frame)  # inline
    if typed is None:
        return "DCP-02", f"type frame {bytes(message[1][:8])!r} is not a DCP type in 1 or 4 bytes"
    kind, width = typed
    if kind == REQUEST:
        if count < 3:
            return "DCP-06", "a request without a service"
        service = message[2]
        if (  # ``_valid_name``, inline
            service.__class__ is not bytes
            or not 0 < len(service) <= MAX_NAME_LENGTH
            or service.translate(None, _PRINTABLE)
        ) and not _valid_name(service):
            return "DCP-05", "a service name is 1-255 printable ASCII bytes"
        if count > 4 and not len(message[3]) and not len(message[4]):
            # No address, no metadata: the usual request, keyed without a loop.
            context: tuple[bytes, ...] = (_WIDTH_BYTES[width], b"")
            data = tuple(message[5:])
            # A short service: keyed by its width and service as they are, no digest to make.
            hashed = b"" if len(service) <= _PLAIN_SERVICE else _PLAIN_KEYED[width] + service
        else:
            split = _split_addressed(message[3:])
            if isinstance(split, str):
                return "DCP-06", split
            context = (_WIDTH_BYTES[width], split.address or b"", *split.metadata)
            data = split.data
            hashed = _keyed(context, service)
        # DCP-10: one request per service, client address and metadata; DCP-21: the data
        # parts exactly, none included (FAM-10).
        # Both records made as their own ``__new__`` makes them, without that call.
        command = _new_tuple(CoreCommand, (_CLIENT, _REQUEST, service, b"", data))
        if hashed:
            key = _CLIENT_KEY + blake2b(hashed, digest_size=16).digest()
        else:
            key = _PLAIN_KEYS[width] + service
        return _new_tuple(Reading, (command, key, context))
    worker = _WORKER_KEYS[width]  # DCP-03: a worker's messages go out in its width
    parts = message[2:]
    if kind in (PONG, RECONNECT):
        return "DCP-15", f"{_TYPE_NAMES[kind]} is sent by the broker only"
    if kind == PING:
        return _PINGS[width] if not parts else ("DCP-13", "a ping has no parts after its type")
    if kind == REGISTER:
        if len(parts) != 1:
            return "DCP-04", f"a registration has one part, the service; got {len(parts)}"
        wrong = _check_service(parts[0], registering=True)
        if wrong is not None:
            return wrong
        return Reading(CoreCommand(Role.WORKER, Command.REGISTER, bytes(parts[0])), worker)
    split = _split_addressed(parts)  # REPLY: the worker's FINAL (DCP-12)
    if isinstance(split, str):
        return "DCP-06", split
    if split.address is None:
        return "DCP-12", "a worker's reply names no client"
    if len(split.address) > MAX_NAME_LENGTH:
        return "DCP-12", "a client address longer than any the broker gives"
    return Reading(CoreCommand(Role.WORKER, Command.FINAL, b"", split.address, split.data), worker)


def _keyed(context: tuple[bytes, ...], service: bytes) -> bytes:
    """What a request's key is a digest of: its reply context, each part length-prefixed, then
    the service (DCP-10)."""
    hashed: list[bytes] = []
    for part in context:
        hashed += (len(part).to_bytes(4, "big"), part)
    hashed.append(service)
    return b"".join(hashed)


def _check_service(name: BodyFrame, *, registering: bool) -> tuple[str, str] | None:
    if not _valid_name(name):
        return "DCP-05", "a service name is 1-255 printable ASCII bytes"
    if registering and bytes(name).startswith(_RESERVED_PREFIX):
        return "DCP-05", "service names starting 'mmi.' are the broker's own"
    return None


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    if len(header) != len(HEADER) or bytes(header[:4]) != _MAGIC:
        return None  # DCP-01: any DGBX version is DCP's, to be answered by its rules
    typed = _read_type(command)
    if typed is not None and typed[0] == REQUEST:
        return Role.CLIENT  # DCP-20: a worker's request is its own, as a client
    return Role.WORKER


def _request_key(message: Sequence[BodyFrame]) -> tuple[bytes, Sequence[BodyFrame]] | None:
    """The key of a request (DCP-10), or of a worker: its type width (DCP-03); ``_read``'s."""
    read = _read(message)
    if read.__class__ is not Reading:
        return _WORKER_KEYS[NARROW], message
    return read.request_key, message  # type: ignore[return-value]


def _reply_context(message: Sequence[BodyFrame]) -> tuple[bytes, ...]:
    """What the reply to a request carries back: (width, address or b"", *metadata)."""
    read = _read(message)
    return read.context if read.__class__ is Reading else ()


def _decode(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    """A DCP message as the core's neutral command; its data parts are the body, as many as
    there are, none included (DCP-21, FAM-10); ``Invalid`` if it is malformed (DCP-23)."""
    read = _read(message)
    if read.__class__ is Reading:
        return read.command
    return Invalid(*read)


_WIDTH_BYTES = {NARROW: bytes([NARROW]), WIDE: bytes([WIDE])}
_WORKER_KEYS = {width: _WORKER_KEY + code for width, code in _WIDTH_BYTES.items()}
# ``_keyed`` of a request with no address and no metadata, but for its service.
_PLAIN_KEYED = {width: _keyed((code, b""), b"") for width, code in _WIDTH_BYTES.items()}
_PINGS = {width: Reading(HEARTBEAT, key) for width, key in _WORKER_KEYS.items()}
# A request with no address and no metadata is keyed by its width and its service as they are
# (a prefix no digest's key has, then one width byte: one key for each pair), if the service is
# this short: a key stays a client address a worker can copy (DCP-11, MDP-D-02).
_PLAIN_SERVICE = 64
_REPLIES = {code: type_frame(REPLY, width) for width, code in _WIDTH_BYTES.items()}
_PLAIN_KEYS = {width: _PLAIN_KEY + code for width, code in _WIDTH_BYTES.items()}


def _width_of(request_key: bytes | None) -> int:
    if request_key is not None and request_key[:1] == _WORKER_KEY and len(request_key) == 2:
        return request_key[1]
    return NARROW


def _encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed | None:
    """What the core sends to a DCP peer, in DCP, or None to send nothing."""
    if command.role is _CLIENT:  # its FINAL: DCP has no partial replies (DCP-25)
        context = route.context
        if len(context) == 2 and not context[1]:  # no address, no metadata: the usual reply
            return (b"", HEADER, _REPLIES[context[0]], route.routing_id, b"", b"", *command.body)
        width = context[0][0] if context else NARROW
        address = context[1] if len(context) > 1 and context[1] else route.routing_id
        return (  # DCP-08, DCP-09; the data parts exactly as they came (DCP-21)
            b"",
            HEADER,
            type_frame(REPLY, width),
            address,
            b"",
            *context[2:],
            b"",
            *command.body,
        )
    width = _width_of(route.request_key)
    what = command.command
    if what is Command.REQUEST:
        client = command.address
        client_route = lookup(client)
        metadata: tuple[bytes, ...] = ()
        if client_route is not None and client_route.dialect is Dialect.DCP:
            metadata = client_route.context[2:]  # DCP-11: the client's own metadata
        return (
            b"",
            HEADER,
            type_frame(REQUEST, width),
            command.service,
            client,
            b"",
            *metadata,
            b"",
            *command.body,
        )
    if what is Command.LEAVE:
        return (b"", HEADER, type_frame(RECONNECT, width))  # DCP-24
    return None  # DCP-16: HEARTBEAT; the broker never pings


def _answer(message: Sequence[BodyFrame], before: PeerState, after: PeerState) -> Relayed | None:
    """The broker's own answer to a DCP message, after the core had it (or None)."""
    typed = _read_type(message[1]) if len(message) > 1 else None
    if typed is None:
        return None
    kind, width = typed
    if kind == PING:
        if before in _REGISTERED and after in _REGISTERED:
            return (b"", HEADER, type_frame(PONG, width))  # DCP-13
        if before is PeerState.SILENCED:
            # DCP-14: the core drops a silenced peer's HEARTBEAT; an unknown peer's it answers
            # with DISCONNECT, which goes out as reconnect.
            return (b"", HEADER, type_frame(RECONNECT, width))
        return None
    if kind == REGISTER and after in _REGISTERED and before not in _REGISTERED:
        return (b"", HEADER, type_frame(REGISTER, width), bytes(message[2]))  # DCP-04
    return None


DCP = DialectCodec(
    dialect=Dialect.DCP,
    capabilities=Capabilities(
        clients=True,
        workers=True,
        partial_replies=False,  # DCP-25
        worker_heartbeats=True,  # DCP-13, DCP-16
        broker_heartbeats=False,  # DCP-16
        disconnect=True,  # the core's DISCONNECT goes out as reconnect (DCP-24; FAM-03)
        mmi=True,  # DCP-26
        outstanding_per_client=None,  # DCP-10
        client_hops=False,  # a DEALER; its leading empty frame is not a delimiter
    ),
    claims=_claims,
    decode=_decode,
    encode=_encode,
    request_key=_request_key,
    check=check,
    reply_context=_reply_context,
    answer=_answer,
    read=_read,
)
