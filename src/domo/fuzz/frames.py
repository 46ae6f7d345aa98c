"""MDP/0.2's frames as the fuzzer writes and reads them, from ``specs/mdp-0.2.md`` section 2.

The fuzzer's oracle is a model of the spec, not of the code under test, so it does not use
``domo.protocol``'s codec: a mistake there (a frame count accepted that the spec refuses, say)
would otherwise be shared by the broker and the check that judges it. Everything here follows
the spec's text: the header frame, one command byte, then per command the frames it lists
(MDP-C-01..03, MDP-W-01..06), a service name of 1 to 255 printable ASCII bytes (MDP-D-01), a
client address of 1 to 255 bytes followed by one empty frame (MDP-R-02, MDP-D-02), and a body of
one frame or more. A message that breaks any of it is a :class:`FrameError` naming the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CLIENT_HEADER",
    "C_FINAL",
    "C_PARTIAL",
    "C_REQUEST",
    "WORKER_HEADER",
    "W_DISCONNECT",
    "W_FINAL",
    "W_HEARTBEAT",
    "W_PARTIAL",
    "W_READY",
    "W_REQUEST",
    "ClientMessage",
    "FrameError",
    "WorkerMessage",
    "client_request",
    "parse_client",
    "parse_worker",
    "valid_client",
    "valid_worker",
    "worker_ready",
    "worker_reply",
]

CLIENT_HEADER: Final = b"MDPC02"
WORKER_HEADER: Final = b"MDPW02"
C_REQUEST, C_PARTIAL, C_FINAL = b"\x01", b"\x02", b"\x03"
W_READY, W_REQUEST, W_PARTIAL, W_FINAL, W_HEARTBEAT, W_DISCONNECT = (
    bytes([code]) for code in range(1, 7)
)
CLIENT_NAMES: Final = {C_REQUEST: "REQUEST", C_PARTIAL: "PARTIAL", C_FINAL: "FINAL"}
WORKER_NAMES: Final = {
    W_READY: "READY",
    W_REQUEST: "REQUEST",
    W_PARTIAL: "PARTIAL",
    W_FINAL: "FINAL",
    W_HEARTBEAT: "HEARTBEAT",
    W_DISCONNECT: "DISCONNECT",
}
_CLIENT_RULES: Final = {C_REQUEST: "MDP-C-01", C_PARTIAL: "MDP-C-02", C_FINAL: "MDP-C-03"}
_WORKER_RULES: Final = {
    W_READY: "MDP-W-01",
    W_REQUEST: "MDP-W-02",
    W_PARTIAL: "MDP-W-03",
    W_FINAL: "MDP-W-04",
    W_HEARTBEAT: "MDP-W-05",
    W_DISCONNECT: "MDP-W-06",
}


class FrameError(Exception):
    """A message that is not MDP/0.2 as the spec frames it; ``rule`` names the frame rule."""

    def __init__(self, reason: str, rule: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rule = rule


@dataclass(frozen=True, slots=True)
class WorkerMessage:
    """A worker-protocol command: ``name`` (READY, REQUEST, ...), and what it carries."""

    name: str
    service: bytes = b""  # READY
    client: bytes = b""  # REQUEST, PARTIAL, FINAL
    body: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class ClientMessage:
    """A client-protocol command: ``name`` (REQUEST, PARTIAL, FINAL), service and body."""

    name: str
    service: bytes
    body: tuple[bytes, ...]


def _service_ok(name: bytes) -> bool:
    return 1 <= len(name) <= 255 and all(0x20 <= b <= 0x7E for b in name)


def parse_worker(frames: Sequence[bytes]) -> WorkerMessage:
    """One worker-protocol message (either way); ``FrameError`` if it breaks a frame rule."""
    frames = [bytes(f) for f in frames]
    if not frames:
        raise FrameError("an empty message", "MDP-W-08")
    if frames[0] != WORKER_HEADER:
        raise FrameError(f"header {frames[0][:12]!r}, not {WORKER_HEADER!r}", "MDP-W-08")
    if len(frames) < 2:
        raise FrameError("a header and no command frame", "MDP-W-08")
    code, rest = frames[1], frames[2:]
    if code not in WORKER_NAMES:
        raise FrameError(f"unknown worker command {code[:4]!r}", "MDP-W-08")
    name, rule = WORKER_NAMES[code], _WORKER_RULES[code]
    if code in (W_HEARTBEAT, W_DISCONNECT):
        if rest:
            raise FrameError(f"{name} with {len(rest)} frame(s) after the command", rule)
        return WorkerMessage(name)
    if code == W_READY:
        if len(rest) != 1:
            raise FrameError(f"READY with {len(rest)} frames after the command, not 1", rule)
        if not _service_ok(rest[0]):
            raise FrameError(f"READY for service {rest[0][:20]!r}", "MDP-D-01")
        return WorkerMessage(name, service=rest[0])
    if len(rest) < 3:
        raise FrameError(f"{name} with {len(rest)} frames after the command, not 3 or more", rule)
    if not 1 <= len(rest[0]) <= 255:
        raise FrameError(f"{name} with a client address of {len(rest[0])} bytes", "MDP-D-02")
    if rest[1] != b"":
        raise FrameError(f"{name} whose frame after the address is not empty", "MDP-R-02")
    return WorkerMessage(name, client=rest[0], body=tuple(rest[2:]))


def parse_client(frames: Sequence[bytes]) -> ClientMessage:
    """One client-protocol message (either way); ``FrameError`` if it breaks a frame rule."""
    frames = [bytes(f) for f in frames]
    if not frames:
        raise FrameError("an empty message", "MDP-W-08")
    if frames[0] != CLIENT_HEADER:
        raise FrameError(f"header {frames[0][:12]!r}, not {CLIENT_HEADER!r}", "MDP-W-08")
    if len(frames) < 2 or frames[1] not in CLIENT_NAMES:
        code = frames[1][:4] if len(frames) > 1 else None
        raise FrameError(f"unknown client command {code!r}", "MDP-C-01")
    name, rule = CLIENT_NAMES[frames[1]], _CLIENT_RULES[frames[1]]
    if len(frames) < 4:
        raise FrameError(f"client {name} with {len(frames)} frames, not 4 or more", rule)
    if not _service_ok(frames[2]):
        raise FrameError(f"client {name} naming service {frames[2][:20]!r}", "MDP-D-01")
    return ClientMessage(name, frames[2], tuple(frames[3:]))


def valid_worker(frames: Sequence[bytes]) -> bool:
    try:
        parse_worker(frames)
    except FrameError:
        return False
    return True


def valid_client(frames: Sequence[bytes]) -> bool:
    try:
        parse_client(frames)
    except FrameError:
        return False
    return True


def worker_ready(service: bytes) -> list[bytes]:
    return [WORKER_HEADER, W_READY, service]


def worker_reply(code: bytes, client: bytes, body: Sequence[bytes]) -> list[bytes]:
    """A worker's PARTIAL or FINAL (or the broker's REQUEST) for ``client``."""
    return [WORKER_HEADER, code, client, b"", *body]


def client_request(service: bytes, body: Sequence[bytes]) -> list[bytes]:
    return [CLIENT_HEADER, C_REQUEST, service, *body]
