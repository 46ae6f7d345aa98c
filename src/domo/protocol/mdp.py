"""MDP/0.2 on the wire: one frozen dataclass per command, ``parse`` and ``encode``.

This module knows the frame tables of ZeroMQ RFC 18 (``specs/mdp-0.2.md`` §2) and nothing else:
no peers, no state, no time. A ZeroMQ multipart message is one command, so the unit here is a
sequence of frames (the ROUTER identity frame already removed by the caller).

- ``parse(frames)`` returns one of the command classes below or raises ``MalformedMessage`` with a
  reason a person can read; it never raises anything else, whatever the input.
- ``encode(command)`` returns the frames to send, checking what the local application supplied
  and raising ``LocalProtocolError`` for a command that would be invalid on the wire.
- Body frames pass through both ways as the very same objects: no copies (MDP-S-03).

The ``*_frames`` helpers build frames from parts already known to be valid; the broker uses them on
its hot path, where the parts come from messages this module has just parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias, TypeVar

from .errors import LocalProtocolError, MalformedMessage

__all__ = [
    "CLIENT_HEADER",
    "C_FINAL",
    "C_PARTIAL",
    "C_REQUEST",
    "DISCONNECT_FRAMES",
    "HEARTBEAT_FRAMES",
    "WORKER_HEADER",
    "W_DISCONNECT",
    "W_FINAL",
    "W_HEARTBEAT",
    "W_PARTIAL",
    "W_READY",
    "W_REQUEST",
    "BodyFrame",
    "ClientCommand",
    "ClientFinal",
    "ClientPartial",
    "ClientRequest",
    "Command",
    "Frames",
    "Relayed",
    "WorkerCommand",
    "WorkerDisconnect",
    "WorkerFinal",
    "WorkerHeartbeat",
    "WorkerPartial",
    "WorkerReady",
    "WorkerRequest",
    "check_body",
    "check_service",
    "client_final_frames",
    "client_partial_frames",
    "client_request_frames",
    "encode",
    "is_valid_address",
    "is_valid_service",
    "parse",
    "parse_client",
    "parse_worker",
    "validate_client",
    "validate_worker",
    "worker_final_frames",
    "worker_partial_frames",
    "worker_ready_frames",
    "worker_request_frames",
]

Frames: TypeAlias = tuple[bytes, ...]
# A frame of a body that a broker relays: ``bytes``, or a ``memoryview`` of a frame its I/O layer
# received without a copy (``domo.trio`` does so from 64 KiB up). A broker reads nothing of a
# body frame but its length (MDP-S-03).
BodyFrame: TypeAlias = bytes | memoryview
Relayed: TypeAlias = tuple[BodyFrame, ...]  # a message as a broker receives or relays it
F = TypeVar("F", bound=BodyFrame)

CLIENT_HEADER: Final = b"MDPC02"
WORKER_HEADER: Final = b"MDPW02"

# Command codes, one byte each (RFC 18). Client and worker codes overlap: the header says which.
C_REQUEST: Final = b"\x01"
C_PARTIAL: Final = b"\x02"
C_FINAL: Final = b"\x03"
W_READY: Final = b"\x01"
W_REQUEST: Final = b"\x02"
W_PARTIAL: Final = b"\x03"
W_FINAL: Final = b"\x04"
W_HEARTBEAT: Final = b"\x05"
W_DISCONNECT: Final = b"\x06"

MAX_NAME_LENGTH: Final = 255
_PRINTABLE_ASCII: Final = bytes(range(0x20, 0x7F))


# --- client sub-protocol (MDP/Client) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """Client to broker: ask ``service`` to handle ``body`` (MDP-C-01)."""

    service: bytes
    body: Frames


@dataclass(frozen=True, slots=True)
class ClientPartial:
    """Broker to client: one partial reply from ``service`` (MDP-C-02)."""

    service: bytes
    body: Frames


@dataclass(frozen=True, slots=True)
class ClientFinal:
    """Broker to client: the final reply from ``service`` (MDP-C-03)."""

    service: bytes
    body: Frames


# --- worker sub-protocol (MDP/Worker) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """Worker to broker: register as a worker for ``service`` (MDP-W-01)."""

    service: bytes


@dataclass(frozen=True, slots=True)
class WorkerRequest:
    """Broker to worker: handle ``body`` on behalf of the client at ``client`` (MDP-W-02)."""

    client: bytes
    body: Frames


@dataclass(frozen=True, slots=True)
class WorkerPartial:
    """Worker to broker: a partial reply for the client at ``client`` (MDP-W-03)."""

    client: bytes
    body: Frames


@dataclass(frozen=True, slots=True)
class WorkerFinal:
    """Worker to broker: the final reply for the client at ``client`` (MDP-W-04)."""

    client: bytes
    body: Frames


@dataclass(frozen=True, slots=True)
class WorkerHeartbeat:
    """Either way between worker and broker: I am alive (MDP-W-05)."""


@dataclass(frozen=True, slots=True)
class WorkerDisconnect:
    """Either way between worker and broker: this conversation is over (MDP-W-06)."""


ClientCommand: TypeAlias = ClientRequest | ClientPartial | ClientFinal
WorkerCommand: TypeAlias = (
    WorkerReady | WorkerRequest | WorkerPartial | WorkerFinal | WorkerHeartbeat | WorkerDisconnect
)
Command: TypeAlias = ClientCommand | WorkerCommand

_HEARTBEAT: Final = WorkerHeartbeat()
_DISCONNECT: Final = WorkerDisconnect()


# --- validation of names ----------------------------------------------------------------------


def is_valid_service(service: bytes) -> bool:
    """True if ``service`` is a service name domo accepts: 1 to 255 printable ASCII bytes.

    RFC 18 says only "printable string"; ``specs/mdp-0.2.md`` MDP-D-01 says why this reading.
    """
    return (
        isinstance(service, bytes)
        and 0 < len(service) <= MAX_NAME_LENGTH
        and not service.translate(None, _PRINTABLE_ASCII)
    )


def is_valid_address(address: bytes) -> bool:
    """True if ``address`` can be a client address frame: a ZeroMQ routing id of 1 to 255 bytes."""
    return isinstance(address, bytes) and 0 < len(address) <= MAX_NAME_LENGTH


# --- parsing ----------------------------------------------------------------------------------

_CLIENT_NAMES: Final = {C_REQUEST: "REQUEST", C_PARTIAL: "PARTIAL", C_FINAL: "FINAL"}
_CLIENT_RULES: Final = {C_REQUEST: "MDP-C-01", C_PARTIAL: "MDP-C-02", C_FINAL: "MDP-C-03"}
_CLIENT_CLASSES: Final[dict[bytes, type[ClientRequest | ClientPartial | ClientFinal]]] = {
    C_REQUEST: ClientRequest,
    C_PARTIAL: ClientPartial,
    C_FINAL: ClientFinal,
}
_WORKER_REPLY_CLASSES: Final[dict[bytes, type[WorkerRequest | WorkerPartial | WorkerFinal]]] = {
    W_REQUEST: WorkerRequest,
    W_PARTIAL: WorkerPartial,
    W_FINAL: WorkerFinal,
}
_WORKER_NAMES: Final = {
    W_READY: "READY",
    W_REQUEST: "REQUEST",
    W_PARTIAL: "PARTIAL",
    W_FINAL: "FINAL",
    W_HEARTBEAT: "HEARTBEAT",
    W_DISCONNECT: "DISCONNECT",
}
_WORKER_RULES: Final = {
    W_READY: "MDP-W-01",
    W_REQUEST: "MDP-W-02",
    W_PARTIAL: "MDP-W-03",
    W_FINAL: "MDP-W-04",
    W_HEARTBEAT: "MDP-W-05",
    W_DISCONNECT: "MDP-W-06",
}


def _describe(frame: object) -> str:
    if isinstance(frame, bytes):
        return repr(frame[:16]) + ("..." if len(frame) > 16 else "")
    return f"a {type(frame).__name__}, not bytes"


def _check_frames(frames: object) -> Sequence[bytes]:
    if not isinstance(frames, Sequence) or isinstance(frames, bytes | str):
        raise MalformedMessage(
            f"a message is a sequence of frames, got {type(frames).__name__}", "MDP-W-08"
        )
    if not isinstance(frames, list | tuple):
        frames = tuple(frames)  # some sequences (a deque) cannot be sliced; parsing slices
    for index, frame in enumerate(frames):
        if not isinstance(frame, bytes):
            raise MalformedMessage(f"frame {index} is {_describe(frame)}", "MDP-W-08")
    return frames


def parse(frames: Sequence[bytes]) -> Command:
    """Parse one MDP/0.2 message of either sub-protocol, chosen by its header frame."""
    frames = _check_frames(frames)
    if not frames:
        raise MalformedMessage("empty message: no header frame", "MDP-W-08")
    header = frames[0]
    if header == CLIENT_HEADER:
        return _parse_client(frames)
    if header == WORKER_HEADER:
        return _parse_worker(frames)
    raise MalformedMessage(
        f"unknown protocol header {_describe(header)} (expected b'MDPC02' or b'MDPW02')",
        "MDP-W-08",
    )


def parse_client(frames: Sequence[bytes]) -> ClientCommand:
    """Parse one MDP/Client message; a worker message here is malformed too."""
    frames = _check_frames(frames)
    if not frames or frames[0] != CLIENT_HEADER:
        first = _describe(frames[0]) if frames else "nothing"
        raise MalformedMessage(f"expected header b'MDPC02', got {first}", "MDP-W-08")
    return _parse_client(frames)


def parse_worker(frames: Sequence[bytes]) -> WorkerCommand:
    """Parse one MDP/Worker message; a client message here is malformed too."""
    frames = _check_frames(frames)
    if not frames or frames[0] != WORKER_HEADER:
        first = _describe(frames[0]) if frames else "nothing"
        raise MalformedMessage(f"expected header b'MDPW02', got {first}", "MDP-W-08")
    return _parse_worker(frames)


def _parse_client(frames: Sequence[bytes]) -> ClientCommand:
    code = validate_client(frames)
    return _CLIENT_CLASSES[code](frames[2], tuple(frames[3:]))


def _parse_worker(frames: Sequence[bytes]) -> WorkerCommand:
    code = validate_worker(frames)
    reply_cls = _WORKER_REPLY_CLASSES.get(code)
    if reply_cls is not None:
        return reply_cls(frames[2], tuple(frames[4:]))
    if code == W_READY:
        return WorkerReady(frames[2])
    return _HEARTBEAT if code == W_HEARTBEAT else _DISCONNECT


def validate_client(frames: Sequence[BodyFrame]) -> bytes:
    """Check an MDP/Client message whose frame 0 is ``b"MDPC02"``; return its command code.

    Body frames may be any ``BodyFrame``; the others must be ``bytes`` (``parse`` checks that
    all frames are; the broker's input contract lets body frames be views). After it returns,
    the layout of that command is known to be valid, frames 0 to 2 being ``bytes``.
    """
    if len(frames) < 2:
        raise MalformedMessage("client message has a header but no command frame", "MDP-C-01")
    code = frames[1]
    if not isinstance(frames[0], bytes) or not isinstance(code, bytes):
        raise _not_bytes(frames, 2)
    rule = _CLIENT_RULES.get(code)
    if rule is None:
        raise MalformedMessage(
            f"unknown client command {_describe(code)} (expected 0x01, 0x02 or 0x03)", "MDP-C-01"
        )
    if len(frames) < 4:
        raise MalformedMessage(
            f"client {_CLIENT_NAMES[code]} needs at least 4 frames (header, command, service, "
            f"body), got {len(frames)}",
            rule,
        )
    service = frames[2]
    if not isinstance(service, bytes):
        raise _not_bytes(frames, 3)
    if not 0 < len(service) <= MAX_NAME_LENGTH or service.translate(None, _PRINTABLE_ASCII):
        raise MalformedMessage(
            f"service name {_describe(service)} is not 1-255 printable ASCII bytes", "MDP-D-01"
        )
    return code


def validate_worker(frames: Sequence[BodyFrame]) -> bytes:
    """Check an MDP/Worker message whose frame 0 is ``b"MDPW02"``; return its command code.

    Same contract as ``validate_client``: every frame before the body is ``bytes`` after it
    returns.
    """
    count = len(frames)
    if count < 2:
        raise MalformedMessage("worker message has a header but no command frame", "MDP-W-08")
    code = frames[1]
    if not isinstance(frames[0], bytes) or not isinstance(code, bytes):
        raise _not_bytes(frames, 2)
    if code in _WORKER_REPLY_CLASSES:
        if count < 5:
            raise MalformedMessage(
                f"worker {_WORKER_NAMES[code]} needs at least 5 frames (header, command, client "
                f"address, empty delimiter, body), got {count}",
                _WORKER_RULES[code],
            )
        address, delimiter = frames[2], frames[3]
        if not isinstance(address, bytes) or not isinstance(delimiter, bytes):
            raise _not_bytes(frames, 4)
        if not 0 < len(address) <= MAX_NAME_LENGTH:
            raise MalformedMessage(
                f"worker {_WORKER_NAMES[code]} client address must be 1-255 bytes, "
                f"got {len(address)}",
                "MDP-D-02",
            )
        if delimiter:
            raise MalformedMessage(
                f"worker {_WORKER_NAMES[code]} frame 3 must be the empty delimiter, "
                f"got {_describe(delimiter)}",
                "MDP-R-02",
            )
        return code
    if code in (W_HEARTBEAT, W_DISCONNECT):
        if count != 2:
            raise MalformedMessage(
                f"worker {_WORKER_NAMES[code]} has exactly 2 frames, got {count}",
                _WORKER_RULES[code],
            )
        return code
    if code == W_READY:
        if count != 3:
            raise MalformedMessage(f"worker READY has exactly 3 frames, got {count}", "MDP-W-01")
        service = frames[2]
        if not isinstance(service, bytes):
            raise _not_bytes(frames, 3)
        if not 0 < len(service) <= MAX_NAME_LENGTH or service.translate(None, _PRINTABLE_ASCII):
            raise MalformedMessage(
                f"service name {_describe(service)} is not 1-255 printable ASCII bytes",
                "MDP-D-01",
            )
        return code
    raise MalformedMessage(
        f"unknown worker command {_describe(code)} (expected 0x01 to 0x06)", "MDP-W-08"
    )


def _not_bytes(frames: Sequence[BodyFrame], before: int) -> MalformedMessage:
    """The error for a message whose frames before ``before`` are not all ``bytes``: only a
    body frame may be anything else."""
    index = next(i for i in range(before) if not isinstance(frames[i], bytes))
    return MalformedMessage(f"frame {index} is {_describe(frames[index])}", "MDP-W-08")


# --- encoding ---------------------------------------------------------------------------------


def client_request_frames(service: bytes, body: Sequence[bytes]) -> Frames:
    """Frames of a client REQUEST from parts known to be valid."""
    return (CLIENT_HEADER, C_REQUEST, service, *body)


def client_partial_frames(service: bytes, body: Sequence[F]) -> tuple[bytes | F, ...]:
    """Frames of a client PARTIAL from parts known to be valid."""
    return (CLIENT_HEADER, C_PARTIAL, service, *body)


def client_final_frames(service: bytes, body: Sequence[F]) -> tuple[bytes | F, ...]:
    """Frames of a client FINAL from parts known to be valid."""
    return (CLIENT_HEADER, C_FINAL, service, *body)


def worker_ready_frames(service: bytes) -> Frames:
    """Frames of a worker READY from a service name known to be valid."""
    return (WORKER_HEADER, W_READY, service)


def worker_request_frames(client: bytes, body: Sequence[F]) -> tuple[bytes | F, ...]:
    """Frames of a worker REQUEST from parts known to be valid."""
    return (WORKER_HEADER, W_REQUEST, client, b"", *body)


def worker_partial_frames(client: bytes, body: Sequence[bytes]) -> Frames:
    """Frames of a worker PARTIAL from parts known to be valid."""
    return (WORKER_HEADER, W_PARTIAL, client, b"", *body)


def worker_final_frames(client: bytes, body: Sequence[bytes]) -> Frames:
    """Frames of a worker FINAL from parts known to be valid."""
    return (WORKER_HEADER, W_FINAL, client, b"", *body)


HEARTBEAT_FRAMES: Final[Frames] = (WORKER_HEADER, W_HEARTBEAT)
DISCONNECT_FRAMES: Final[Frames] = (WORKER_HEADER, W_DISCONNECT)


def check_body(body: object, what: str = "body") -> Frames:
    """Return ``body`` as a tuple, or raise ``LocalProtocolError`` if it cannot go on the wire."""
    # A tuple or list is checked without the Sequence ABC's isinstance, which is slow; every
    # request and reply passes here.
    if type(body) is tuple:
        frames: Frames = body
    elif type(body) is list:
        frames = tuple(body)
    elif isinstance(body, bytes | str) or not isinstance(body, Sequence):
        raise LocalProtocolError(f"{what} must be a sequence of bytes frames, not one value")
    else:
        frames = tuple(body)
    if not frames:
        raise LocalProtocolError(f"{what} needs at least one frame (MDP/0.2 has no empty body)")
    for frame in frames:
        if type(frame) is not bytes and not isinstance(frame, bytes):
            raise LocalProtocolError(f"{what} frames must be bytes, got {type(frame).__name__}")
    return frames


def check_service(service: bytes) -> bytes:
    """Return ``service`` or raise ``LocalProtocolError`` if it is not a valid service name."""
    if not is_valid_service(service):
        raise LocalProtocolError(
            f"service name must be 1-255 bytes of printable ASCII, got {service!r}"
        )
    return service


def _check_address(client: bytes) -> bytes:
    if not is_valid_address(client):
        raise LocalProtocolError(f"client address must be 1-255 bytes, got {client!r}")
    return client


def encode(command: Command) -> Frames:
    """The frames of ``command``; raises ``LocalProtocolError`` if it would be invalid."""
    match command:
        case ClientRequest(service, body):
            return client_request_frames(check_service(service), check_body(body))
        case ClientPartial(service, body):
            return client_partial_frames(check_service(service), check_body(body))
        case ClientFinal(service, body):
            return client_final_frames(check_service(service), check_body(body))
        case WorkerReady(service):
            return worker_ready_frames(check_service(service))
        case WorkerRequest(client, body):
            return worker_request_frames(_check_address(client), check_body(body))
        case WorkerPartial(client, body):
            return worker_partial_frames(_check_address(client), check_body(body))
        case WorkerFinal(client, body):
            return worker_final_frames(_check_address(client), check_body(body))
        case WorkerHeartbeat():
            return HEARTBEAT_FRAMES
        case WorkerDisconnect():
            return DISCONNECT_FRAMES
    raise LocalProtocolError(f"not an MDP/0.2 command: {command!r}")
