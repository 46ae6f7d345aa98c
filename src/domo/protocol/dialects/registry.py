"""The dialects a domo broker speaks, as one registry, and detection over it.

``REGISTRY`` (a ``Registry`` of ``DETECTION_ORDER``) is what ``FamilyBroker`` consults by
default; a broker may be given a registry of its own (a dialect of one's own, a test's).
``CODECS`` maps each ``Dialect`` to its ``DialectCodec``. ``detect`` asks the codecs, in
``DETECTION_ORDER``, which one claims a message; ``withheld`` says which of the core's commands
a dialect's peer never gets (PARTIALs to a client whose dialect has none). ``decode`` and
``encode`` apply a dialect's codec from and to MDP/0.2's frames, for tools that speak MDP/0.2.
A new dialect is a module with its ``DialectCodec`` and one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import cast

from ..errors import MalformedMessage
from ..mdp import BodyFrame, Relayed
from .base import Command, CoreCommand, Dialect, DialectCodec, Invalid, Role
from .dcp import DCP
from .emqp import EMQP
from .envelope import delimiter_at
from .majortomo import MAJORTOMO
from .mdp01 import MDP01
from .mdp02 import MDP02, MDP02_REQ, from_frames, to_frames

__all__ = [
    "CODECS",
    "DETECTION_ORDER",
    "REGISTRY",
    "Registry",
    "codec_for",
    "decode",
    "detect",
    "encode",
    "withheld",
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
        # What ``find`` found for (hops, header, command), header and command short bytes:
        # ``claims`` is a pure function of the two, so its answer is remembered, up to
        # ``_CLAIMS_KEPT`` of them, all forgotten when full.
        self._found: dict[tuple[int, bytes, bytes], tuple[DialectCodec, int, Role] | None] = {}

    def detect(self, frames: Sequence[BodyFrame]) -> tuple[DialectCodec, int] | None:
        """The codec of ``frames`` and the length of its envelope, or None (not a family
        message); see ``detect``."""
        found = self.find(frames)
        return None if found is None else (found[0], found[1])

    def find(self, frames: Sequence[BodyFrame]) -> tuple[DialectCodec, int, Role] | None:
        """``detect``, with the role its codec claims the message for."""
        count = len(frames)
        if not count:
            return None
        first = frames[0]
        if not first:  # the delimiter first: no envelope, the usual
            if count > 2 and frames[1].__class__ is bytes and frames[2].__class__ is bytes:
                found = self._found.get((0, frames[1], frames[2]), _UNASKED)
                if found is not _UNASKED:  # asked before: the answer remembered
                    return found
            if count < 2:
                return None
            at = 0
            header = frames[1]
            command = frames[2] if count > 2 else b""
        else:  # an undelimited dialect's, or an envelope
            for codec in self._undelimited:
                role = codec.claims(first, _command(frames, 1))
                if role is not None:
                    return codec, 0, role
            hops = delimiter_at(frames)
            if hops is None or count < hops + 2:
                return None
            at = hops
            header = frames[at + 1]
            command = frames[at + 2] if count > at + 2 else b""
        if (
            header.__class__ is bytes
            and command.__class__ is bytes
            and len(header) + len(command) <= _CLAIM_BYTES
        ):
            asked = (at, header, command)
            found = self._found.get(asked, _UNASKED)
            if found is _UNASKED:
                found = self._claim(header, command, at)
                if len(self._found) >= _CLAIMS_KEPT:
                    self._found.clear()
                self._found[asked] = found
            return found
        return self._claim(header, command, at)  # a view (a large frame): asked afresh

    def _claim(
        self, header: BodyFrame, command: BodyFrame, at: int
    ) -> tuple[DialectCodec, int, Role] | None:
        """The first delimited codec that claims ``header``, ``command`` behind ``at`` hops,
        the hops, and the role it claims them for."""
        for codec in self._delimited:
            role = codec.claims(header, command)
            if role is None:
                continue
            if at and (role is Role.WORKER or not codec.capabilities.client_hops):
                continue  # MDP01-02, MAJ-01: workers are never behind hops
            return codec, at, role
        return None


_CLAIMS_KEPT = 1024  # (hops, header, command) whose codec ``Registry.find`` remembers
_UNASKED = (MDP02, 0, Role.WORKER)  # a placeholder, never remembered
_CLAIM_BYTES = 512  # ... if they are this short together (a command frame may be a service)

# Majortomo's client (``MDPC02``, 0x02, no hops) is claimed before an RFC 18 client behind REQ
# (``MDPC02``, anything).
# DCP's header (``DGBX`` and a version) and eMQP's (``eMQP/1.0``) are no other dialect's.
DETECTION_ORDER: tuple[DialectCodec, ...] = (MDP02, MDP01, MAJORTOMO, EMQP, MDP02_REQ, DCP)
REGISTRY = Registry(DETECTION_ORDER)  # the dialects domo's broker speaks
CODECS = cast(Mapping[Dialect, DialectCodec], REGISTRY.by_dialect)


def codec_for(dialect: Dialect) -> DialectCodec:
    """The codec of ``dialect``."""
    return CODECS[dialect]


def withheld(codec: DialectCodec, command: CoreCommand) -> bool:
    """Whether the core's ``command`` never goes to a peer of ``codec``'s dialect: a PARTIAL
    to a client whose dialect has none (MDP01-05, REQREP-05, DCP-25, EMQP-21)."""
    return (
        command.command is Command.PARTIAL
        and command.role is Role.CLIENT
        and not codec.capabilities.partial_replies
    )


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
    """``message`` (the frames after the envelope's delimiter) as the MDP/0.2 frames of the
    command it is (``mdp02.to_frames``), or ``MalformedMessage`` if the dialect's codec cannot
    read it. For tools that speak MDP/0.2 (``domo fuzz``); the broker takes the neutral
    command itself."""
    decoded = CODECS[dialect].decode(message)
    if isinstance(decoded, Invalid):
        raise MalformedMessage(decoded.reason, decoded.rule)
    return list(to_frames(decoded))


class _Route:
    """A route with only an envelope, for ``encode``."""

    __slots__ = ("envelope",)
    routing_id = b""
    dialect: Enum = Dialect.MDP02
    request_key: bytes | None = None
    context: tuple[bytes, ...] = ()
    service: bytes | None = None

    def __init__(self, envelope: Relayed) -> None:
        self.envelope = envelope


def encode(dialect: Dialect, envelope: Relayed, frames: Relayed) -> Relayed | None:
    """``frames`` (MDP/0.2's form of a message the core sends) in ``dialect``'s framing, behind
    ``envelope``, or None if the dialect's peer is not sent it (or it is no such message)."""
    command = from_frames(frames)
    codec = CODECS[dialect]
    if isinstance(command, Invalid) or withheld(codec, command):
        return None
    return codec.encode(_Route(envelope), command, _nobody)


def _nobody(key: bytes) -> None:
    return None
