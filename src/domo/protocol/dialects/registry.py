"""The dialects a domo broker speaks, as one registry, and detection over it.

``REGISTRY`` (a ``Registry`` of ``DETECTION_ORDER``) is what ``FamilyBroker`` consults by
default; a broker may be given a registry of its own (a dialect of one's own, a test's).
``CODECS`` maps each ``Dialect`` to its ``DialectCodec``. ``detect`` asks the codecs, in
``DETECTION_ORDER``, which one claims a message; ``decode`` and ``encode`` apply a dialect's
codec, and ``encode`` withholds PARTIALs from a client whose dialect has none (its
``Capabilities.partial_replies``). A new dialect is a module with its ``DialectCodec`` and one
entry here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import cast

from ..mdp import BodyFrame, Relayed
from .base import MDPC02, Dialect, DialectCodec, Role
from .dcp import DCP
from .emqp import EMQP
from .envelope import delimiter_at
from .majortomo import MAJORTOMO
from .mdp01 import MDP01
from .mdp02 import MDP02, MDP02_REQ

__all__ = [
    "CODECS",
    "DETECTION_ORDER",
    "REGISTRY",
    "Registry",
    "codec_for",
    "decode",
    "detect",
    "encode",
    "encode_with",
]


class Registry:
    """Dialects in detection order: the first whose codec claims a message wins.

    Codecs that are not ``delimited`` (MDP/0.2) are told by a message's first frame, before
    anything else. Then the first codec that claims the frames after the envelope's delimiter
    wins, so a narrower claim comes first.
    """

    def __init__(self, codecs: Sequence[DialectCodec]) -> None:
        self.codecs = tuple(codecs)
        self.by_dialect: Mapping[Enum, DialectCodec] = MappingProxyType(
            {codec.dialect: codec for codec in self.codecs}
        )
        if len(self.by_dialect) != len(self.codecs):
            raise ValueError("a dialect is registered twice")
        self._undelimited = tuple(codec for codec in self.codecs if not codec.delimited)
        self._delimited = tuple(codec for codec in self.codecs if codec.delimited)

    def detect(self, frames: Sequence[BodyFrame]) -> tuple[DialectCodec, int] | None:
        """The codec of ``frames`` and the length of its envelope, or None (not a family
        message); see ``detect``."""
        if not frames:
            return None
        for codec in self._undelimited:
            if codec.claims(frames[0], _command(frames, 1)) is not None:
                return codec, 0
        at = delimiter_at(frames)
        if at is None:
            return None
        header, command = frames[at + 1], _command(frames, at + 2)
        for codec in self._delimited:
            role = codec.claims(header, command)
            if role is None:
                continue
            if at and (role is Role.WORKER or not codec.capabilities.client_hops):
                continue  # MDP01-02, MAJ-01: workers are never behind hops
            return codec, at
        return None


# Majortomo's client (``MDPC02``, 0x02, no hops) is claimed before an RFC 18 client behind REQ
# (``MDPC02``, anything).
# DCP's header (``DGBX`` and a version) and eMQP's (``eMQP/1.0``) are no other dialect's.
DETECTION_ORDER: tuple[DialectCodec, ...] = (MDP02, MDP01, MAJORTOMO, EMQP, MDP02_REQ, DCP)
REGISTRY = Registry(DETECTION_ORDER)  # the dialects domo's broker speaks
CODECS = cast(Mapping[Dialect, DialectCodec], REGISTRY.by_dialect)

_C_PARTIAL = b"\x02"  # the core's PARTIAL to a client (MDP-R-01)


def codec_for(dialect: Dialect) -> DialectCodec:
    """The codec of ``dialect``."""
    return CODECS[dialect]


def _command(frames: Sequence[BodyFrame], at: int) -> BodyFrame:
    return frames[at] if len(frames) > at else b""


def detect(frames: Sequence[BodyFrame]) -> tuple[Dialect, int] | None:
    """The dialect of ``frames`` and the length of its envelope, or None (not a family message).

    MDP/0.2's own messages are told first, by their first frame (MDP02). Otherwise the message
    must have an empty delimiter within ``MAX_HOPS`` frames, with a protocol header after it
    that a codec claims; a worker is never behind hops, nor a client whose dialect has none.
    """
    found = REGISTRY.detect(frames)
    return None if found is None else (cast(Dialect, found[0].dialect), found[1])


def decode(dialect: Dialect, message: Sequence[BodyFrame]) -> list[BodyFrame]:
    """``message`` (the frames after the envelope's delimiter) as MDP/0.2 frames."""
    return CODECS[dialect].decode(message)


def encode_with(
    codec: DialectCodec, envelope: Relayed, frames: Relayed, request_key: bytes | None = None
) -> Relayed | None:
    """``frames`` (MDP/0.2, from the core) in ``codec``'s framing, or None to send nothing."""
    if frames[1] == _C_PARTIAL and frames[0] == MDPC02 and not codec.capabilities.partial_replies:
        return None  # MDP01-05, REQREP-05: a REQ socket takes one reply, the FINAL
    return codec.encode(envelope, frames, request_key)


def encode(dialect: Dialect, envelope: Relayed, frames: Relayed) -> Relayed | None:
    """``frames`` (MDP/0.2, from the core) in ``dialect``'s framing, or None to send nothing."""
    return encode_with(CODECS[dialect], envelope, frames)
