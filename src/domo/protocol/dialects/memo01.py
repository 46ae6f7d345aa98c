"""memo01 (MemoDB's broker protocol, ``specs/memo01.md``): its messages, parsed and built.

A memo01 message is one NNG message: a CBOR header (an array) followed by an optional payload of
raw bytes (MEMO-01). The header is ``["memo01", type, id, ...]`` with one layout per type
(MEMO-02..MEMO-06). ``parse`` turns the bytes of a message into a ``Memo01Message`` or raises
``MalformedMessage`` naming the rule the message breaks; ``encode`` builds the bytes of a message
the broker sends, its header in deterministic CBOR (MEMO-07).

Pure functions over bytes: no state, no I/O, no clock. CBOR is ``cbor2``'s, which is the optional
``nng`` extra (``pip install 'domo[nng]'``), so importing this module needs it; nothing in
``domo.protocol`` imports it unless memo01 is in use.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from enum import IntEnum
from itertools import pairwise
from typing import Final

import cbor2

from ..errors import MalformedMessage
from ..mdp import is_valid_service

__all__ = [
    "MAX_SERVICES",
    "MAX_TIMEOUT_MS",
    "PROTOCOL",
    "Memo01Message",
    "MessageType",
    "claimed_sender",
    "encode",
    "parse",
    "service_order",
]

PROTOCOL: Final = "memo01"
MAX_TIMEOUT_MS: Final = 2**31 - 1  # MEMO-04: about 24.8 days; a longer one is refused
MAX_SERVICES: Final = 256  # MEMO-03: services one worker may offer
MAX_HEADER: Final = 64 * 1024  # a header longer than this is garbage, whatever it holds


class MessageType(IntEnum):
    """memo01's message types (the second item of the header)."""

    READY = 0x01
    JOB = 0x02
    RESULT = 0x03
    HEARTBEAT = 0x04
    DISCONNECT = 0x05


@dataclass(frozen=True, slots=True)
class Memo01Message:
    """One parsed memo01 message.

    ``services`` is a READY's service set (in the order MEMO-03 requires); ``service`` and
    ``timeout_ms`` a JOB's; ``leaving`` a RESULT's optional flag (False when absent);
    ``payload`` the bytes after the header.
    """

    type: MessageType
    id: bytes
    payload: bytes = b""
    services: tuple[str, ...] = ()
    service: str = ""
    timeout_ms: int = 0
    leaving: bool = False


def service_order(name: str) -> tuple[int, bytes]:
    """The sort key of MEMO-03: shorter UTF-8 names first, then bytewise."""
    raw = name.encode("utf-8")
    return (len(raw), raw)


def _is_service(name: object) -> bool:
    # MEMO-03: services are shared with MDP workers, so their names follow MDP-D-01.
    return isinstance(name, str) and name.isascii() and is_valid_service(name.encode("ascii"))


def _decode_header(data: bytes) -> tuple[object, int]:
    stream = io.BytesIO(data)
    try:
        header = cbor2.CBORDecoder(stream).decode()
    except Exception as error:  # any garbage: cbor2 raises several kinds, all mean "not CBOR"
        raise MalformedMessage(f"header is not CBOR: {error}", "MEMO-01") from None
    return header, stream.tell()


def claimed_sender(data: bytes) -> tuple[MessageType | None, bytes]:
    """The type and id a message that ``parse`` refused claims, as far as they can be read
    (None and ``b""`` for garbage): who is to be told what (MEMO-18)."""
    try:
        header, _ = _decode_header(data[:MAX_HEADER])
    except MalformedMessage:
        return None, b""
    if not isinstance(header, list) or len(header) < 3 or header[0] != PROTOCOL:
        return None, b""
    kind, ident = header[1], header[2]
    if type(kind) is not int or kind not in MessageType._value2member_map_:
        return None, b""
    return MessageType(kind), ident if isinstance(ident, bytes) else b""


def parse(data: bytes, *, from_broker: bool = False) -> Memo01Message:
    """The memo01 message in ``data``; ``MalformedMessage`` (with a MEMO rule) if it is none.

    As the broker reads it, or (``from_broker``) as a client or worker reads the broker's: then
    a JOB names the worker and a RESULT (to a client) may have an empty id.
    """
    header, end = _decode_header(data[:MAX_HEADER] if len(data) > MAX_HEADER else data)
    if not isinstance(header, list) or len(header) < 3:
        raise MalformedMessage("header is not an array of at least 3 items", "MEMO-01")
    version, kind, ident = header[0], header[1], header[2]
    if version != PROTOCOL:
        raise MalformedMessage("protocol field is not 'memo01'", "MEMO-01")
    if type(kind) is not int or kind not in MessageType._value2member_map_:
        raise MalformedMessage("unknown message type", "MEMO-01")
    if not isinstance(ident, bytes):
        raise MalformedMessage("the id is not a byte string", "MEMO-01")
    payload = data[end:]
    kind = MessageType(kind)
    if kind is MessageType.READY:
        return _ready(header, ident, payload)
    if kind is MessageType.JOB:
        return _job(header, ident, payload, from_broker)
    if kind is MessageType.RESULT:
        if len(header) not in (3, 4):
            raise MalformedMessage("RESULT header has 3 or 4 items", "MEMO-05")
        leaving = header[3] if len(header) == 4 else False
        if type(leaving) is not bool:
            raise MalformedMessage("RESULT's 4th item is not a bool", "MEMO-05")
        if not ident and not from_broker:
            raise MalformedMessage("RESULT without a worker id", "MEMO-05")
        return Memo01Message(kind, ident, payload, leaving=leaving)
    # HEARTBEAT and DISCONNECT: the id and nothing else.
    if len(header) != 3 or payload:
        raise MalformedMessage(f"{kind.name} is a 3-item header and no payload", "MEMO-02")
    if not ident and not from_broker:  # the broker's DISCONNECT to a bad READY has none
        raise MalformedMessage(f"{kind.name} without a worker id", "MEMO-02")
    return Memo01Message(kind, ident)


def _ready(header: list[object], ident: bytes, payload: bytes) -> Memo01Message:
    if len(header) != 4 or payload:
        raise MalformedMessage("READY is a 4-item header and no payload", "MEMO-03")
    if ident:
        raise MalformedMessage("READY carries an empty id", "MEMO-03")
    services = header[3]
    if not isinstance(services, list) or not 0 < len(services) <= MAX_SERVICES:
        raise MalformedMessage(f"READY's services: a list of 1 to {MAX_SERVICES}", "MEMO-03")
    names: list[str] = []
    for name in services:
        if not _is_service(name):
            raise MalformedMessage("a service name is not 1-255 printable ASCII", "MEMO-03")
        names.append(name)
    keys = [service_order(name) for name in names]
    if any(a >= b for a, b in pairwise(keys)):
        raise MalformedMessage("services not sorted length-first without duplicates", "MEMO-03")
    return Memo01Message(MessageType.READY, ident, services=tuple(names))


def _job(header: list[object], ident: bytes, payload: bytes, from_broker: bool) -> Memo01Message:
    if len(header) != 5:
        raise MalformedMessage("JOB header has 5 items", "MEMO-04")
    if bool(ident) != from_broker:
        raise MalformedMessage(
            "a JOB's id is empty from a client, the worker's from the broker", "MEMO-04"
        )
    service, timeout = header[3], header[4]
    if not isinstance(service, str) or not _is_service(service):
        raise MalformedMessage("JOB's service is not 1-255 printable ASCII", "MEMO-04")
    if type(timeout) is not int or not 0 < timeout <= MAX_TIMEOUT_MS:
        raise MalformedMessage(f"JOB's timeout is not an int in 1..{MAX_TIMEOUT_MS}", "MEMO-04")
    return Memo01Message(MessageType.JOB, ident, payload, service=service, timeout_ms=timeout)


def encode(
    kind: MessageType,
    ident: bytes = b"",
    payload: bytes = b"",
    *,
    services: tuple[str, ...] = (),
    service: str = "",
    timeout_ms: int = 0,
    leaving: bool | None = None,
) -> bytes:
    """The bytes of one memo01 message: its header in deterministic CBOR (MEMO-07), then
    ``payload``. Used by the broker, and by domo's memo01 peers."""
    header: list[object] = [PROTOCOL, int(kind), ident]
    if kind is MessageType.READY:
        header.append(sorted(services, key=service_order))
    elif kind is MessageType.JOB:
        header += [service, timeout_ms]
    elif kind is MessageType.RESULT and leaving is not None:
        header.append(leaving)
    return cbor2.dumps(header, canonical=True) + payload
