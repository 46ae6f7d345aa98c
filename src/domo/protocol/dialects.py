"""The Majordomo dialects a domo broker speaks besides MDP/0.2, as codecs over MDP/0.2 frames.

Each dialect is a codec: ``detect`` picks a peer's dialect from its message, ``decode`` turns
the message into the MDP/0.2 frames the broker core understands, and ``encode`` turns what the
core sends into the peer's own framing (or drops it where the dialect has no such message).
Nothing here keeps state or does I/O; ``domo.protocol.family`` keeps who speaks what.

- ``MDP02``: RFC 18 clients and workers, ``MDPC02``/``MDPW02`` first (specs/mdp-0.2.md).
- ``MDP02_REQ``: RFC 18 clients behind a REQ socket: envelope, ``""``, ``MDPC02``, 0x01, ...
  (specs/reqrep.md).
- ``MDP01``: RFC 7 clients (REQ: envelope, ``""``, ``MDPC01``) and workers (DEALER: ``""``,
  ``MDPW01``) (specs/mdp-0.1.md).
- ``MAJORTOMO``: majortomo 0.2.0's clients and workers: ``""``, ``MDPC02``/``MDPW02``, its
  own client codes, no service frame in replies (specs/majortomo.md).

The *envelope* is 28/REQREP's address stack: the frames before the empty delimiter, one per
ROUTER-DEALER hop between the client and the broker. It is kept as it came and put back in front
of the reply, so the hops can route it home (REQREP-01, REQREP-02).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from .mdp import BodyFrame, Relayed

__all__ = [
    "MAX_HOPS",
    "MDPC01",
    "MDPC02",
    "MDPW01",
    "MDPW02",
    "Dialect",
    "decode",
    "detect",
    "encode",
]

MDPC02, MDPW02, MDPC01, MDPW01 = b"MDPC02", b"MDPW02", b"MDPC01", b"MDPW01"
MAX_HOPS = 16  # envelope frames looked at before a message is taken for garbage (REQREP-03)

# An MDP/0.2 command a dialect message has no counterpart for: the core refuses it as it
# refuses any unknown command (MDP-W-08, MDP-D-01), so a dialect peer meets the same rules.
_UNKNOWN = b"\xff"


class Dialect(Enum):
    """Which member of the family a peer speaks."""

    MDP02 = "mdp02"
    MDP02_REQ = "mdp02-req"
    MDP01 = "mdp01"
    MAJORTOMO = "majortomo"


def _is_empty(frame: BodyFrame) -> bool:
    return len(frame) == 0


def detect(frames: Sequence[BodyFrame]) -> tuple[Dialect, int] | None:
    """The dialect of ``frames`` and the length of its envelope, or None (not a family message).

    MDP/0.2's own messages are told first, by their first frame (MDP02). Otherwise the message
    must have an empty delimiter within ``MAX_HOPS`` frames, with a protocol header after it.
    """
    if not frames:
        return None
    first = frames[0]
    if first in (MDPC02, MDPW02):
        return Dialect.MDP02, 0
    for at in range(min(len(frames) - 1, MAX_HOPS + 1)):
        if _is_empty(frames[at]):
            break
        if not isinstance(frames[at], bytes):
            return None  # an address is a short frame, never a view of a large one
    else:
        return None
    header = frames[at + 1]
    if header == MDPC01:
        return Dialect.MDP01, at  # MDP01-01: a REQ client, directly or behind hops
    if header == MDPW01 and at == 0:
        return Dialect.MDP01, 0  # MDP01-02: a DEALER worker
    if header == MDPW02 and at == 0:
        return Dialect.MAJORTOMO, 0  # MAJ-01: majortomo's worker
    if header == MDPC02:
        code = frames[at + 2] if len(frames) > at + 2 else b""
        if at == 0 and code == b"\x02":
            return Dialect.MAJORTOMO, 0  # MAJ-02: majortomo's client REQUEST code
        return Dialect.MDP02_REQ, at  # REQREP-04: an RFC 18 client behind REQ
    return None


def decode(dialect: Dialect, message: Sequence[BodyFrame]) -> list[BodyFrame]:
    """``message`` (the frames after the envelope's delimiter) as MDP/0.2 frames."""
    if dialect is Dialect.MDP02 or dialect is Dialect.MDP02_REQ:
        return list(message)
    header = message[0]
    command = message[1] if len(message) > 1 else b""
    rest = list(message[2:])
    if dialect is Dialect.MDP01:
        if header == MDPC01:
            # MDP01-03: [MDPC01, service, body...] is a REQUEST; the service is its frame 1.
            return [MDPC02, b"\x01", *message[1:]]
        return [MDPW02, _MDP01_TO_MDP02.get(bytes(command), _UNKNOWN), *rest]
    if header == MDPC02:  # majortomo's client
        return [MDPC02, b"\x01" if command == b"\x02" else _UNKNOWN, *rest]  # MAJ-02
    return list(message)  # majortomo's worker: RFC 18's worker commands (MAJ-01)


# MDP/0.1 worker commands (RFC 7) and their MDP/0.2 counterparts (RFC 18).
_MDP01_TO_MDP02 = {
    b"\x01": b"\x01",  # READY
    b"\x03": b"\x04",  # REPLY -> FINAL (MDP01-04)
    b"\x04": b"\x05",  # HEARTBEAT
    b"\x05": b"\x06",  # DISCONNECT
}
_MDP02_TO_MDP01 = {b"\x02": b"\x02", b"\x05": b"\x04", b"\x06": b"\x05"}  # REQUEST, HB, DISC


def encode(dialect: Dialect, envelope: Relayed, frames: Relayed) -> Relayed | None:
    """``frames`` (MDP/0.2, from the core) in ``dialect``'s framing, or None to send nothing."""
    header = frames[0]
    command = frames[1]
    if dialect is Dialect.MAJORTOMO:
        if header == MDPC02:
            # MAJ-03, MAJ-04: PARTIAL 0x03, FINAL 0x04, no service frame.
            code = b"\x03" if command == b"\x02" else b"\x04"
            return (b"", MDPC02, code, *frames[3:])
        return (b"", *frames)  # MAJ-01
    if header == MDPC02:
        if command == b"\x02":
            return None  # MDP01-05, REQREP-05: a REQ socket takes one reply, the FINAL
        if dialect is Dialect.MDP01:
            return (*envelope, b"", MDPC01, *frames[2:])  # MDP01-03: [MDPC01, service, body]
        return (*envelope, b"", *frames)  # REQREP-01
    # An MDP/0.1 worker (MDP01-02): the core sends it REQUEST, HEARTBEAT or DISCONNECT.
    return (b"", MDPW01, _MDP02_TO_MDP01.get(bytes(command), command), *frames[2:])
