"""MDP/0.2 (RFC 18, ``specs/mdp-0.2.md``) as a dialect: the core's own language, twice.

- ``MDP02``: clients and workers on DEALER sockets, ``MDPC02``/``MDPW02`` first. Their messages
  are the core's commands as they are; an MDP/0.2 peer on the broker's first socket does not even
  pass through this codec (``domo.protocol.family``'s fast path).
- ``MDP02_REQ``: an RFC 18 client behind a REQ socket and ROUTER-DEALER hops (REQREP-04): its
  request after the envelope's delimiter is an MDP/0.2 REQUEST; its FINAL goes back behind the
  envelope and delimiter, and it gets no PARTIAL, since a REQ socket takes one reply (REQREP-05).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..mdp import BodyFrame, Relayed
from .base import (
    CORE_CODES,
    MDPC02,
    MDPW02,
    Capabilities,
    Command,
    Dialect,
    DialectCodec,
    Role,
    Translation,
)

__all__ = ["MDP02", "MDP02_REQ", "REQ_TABLE", "TABLE"]


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    if header == MDPC02:
        return Role.CLIENT
    if header == MDPW02:
        return Role.WORKER
    return None


def _claims_req_client(header: BodyFrame, command: BodyFrame) -> Role | None:
    return Role.CLIENT if header == MDPC02 else None  # REQREP-04


def _as_is(message: Sequence[BodyFrame]) -> list[BodyFrame]:
    return list(message)


def _encode(envelope: Relayed, frames: Relayed, request_key: bytes | None) -> Relayed:
    return frames


def _encode_behind_envelope(
    envelope: Relayed, frames: Relayed, request_key: bytes | None
) -> Relayed:
    return (*envelope, b"", *frames)  # REQREP-01


# The codecs as data (specs/family.md, specs/reqrep.md). MDP/0.2's is the core's own form: every
# command either way, as the core has it (CORE_CODES); which of them a peer may send is the
# core's tables' business (MDP-W-15, MDP-D-16).
_HEADER = {Role.WORKER: MDPW02, Role.CLIENT: MDPC02}
_RULE = {
    (Role.WORKER, Command.REGISTER): "MDP-W-01",
    (Role.WORKER, Command.REQUEST): "MDP-W-15",
    (Role.WORKER, Command.PARTIAL): "MDP-R-01",
    (Role.WORKER, Command.FINAL): "MDP-R-01",
    (Role.WORKER, Command.HEARTBEAT): "MDP-H-02",
    (Role.WORKER, Command.LEAVE): "MDP-W-12",
    (Role.CLIENT, Command.REQUEST): "MDP-C-01",
    (Role.CLIENT, Command.PARTIAL): "MDP-D-16",
    (Role.CLIENT, Command.FINAL): "MDP-D-16",
}
_SENT = {  # what the core sends each side
    (Role.WORKER, Command.REQUEST): "MDP-W-02",
    (Role.WORKER, Command.HEARTBEAT): "MDP-H-04",
    (Role.WORKER, Command.LEAVE): "MDP-W-14",
    (Role.CLIENT, Command.PARTIAL): "MDP-R-01",
    (Role.CLIENT, Command.FINAL): "MDP-R-01",
}
TABLE = tuple(
    Translation(role, True, command, (_HEADER[role], code), _RULE[role, command])
    for (role, command), code in CORE_CODES.items()
) + tuple(
    Translation(role, False, command, (_HEADER[role], CORE_CODES[role, command]), rule)
    for (role, command), rule in _SENT.items()
)
REQ_TABLE = (  # REQREP-04, REQREP-05: an RFC 18 client behind REQ
    Translation(Role.CLIENT, True, Command.REQUEST, (b"", MDPC02, b"\x01"), "REQREP-04"),
    Translation(Role.CLIENT, True, Command.PARTIAL, (b"", MDPC02, b"\x02"), "MDP-D-16"),
    Translation(Role.CLIENT, True, Command.FINAL, (b"", MDPC02, b"\x03"), "MDP-D-16"),
    Translation(Role.CLIENT, False, Command.PARTIAL, None, "REQREP-05"),
    Translation(Role.CLIENT, False, Command.FINAL, (b"", MDPC02, b"\x03"), "REQREP-01"),
)

MDP02 = DialectCodec(
    dialect=Dialect.MDP02,
    capabilities=Capabilities(
        clients=True,
        workers=True,
        partial_replies=True,  # MDP-R-01
        worker_heartbeats=True,  # MDP-H-01..07
        broker_heartbeats=True,
        disconnect=True,
        mmi=True,
        outstanding_per_client=1,  # MDP-S-02
        client_hops=False,  # a DEALER client; behind REQ it is MDP02_REQ
    ),
    claims=_claims,
    decode=_as_is,
    encode=_encode,
    delimited=False,
    table=TABLE,
)

MDP02_REQ = DialectCodec(
    dialect=Dialect.MDP02_REQ,
    capabilities=Capabilities(
        clients=True,
        workers=False,
        partial_replies=False,  # REQREP-05
        worker_heartbeats=False,
        broker_heartbeats=False,
        disconnect=False,
        mmi=True,
        outstanding_per_client=1,  # a REQ socket sends one request at a time
        client_hops=True,
    ),
    claims=_claims_req_client,
    decode=_as_is,
    encode=_encode_behind_envelope,
    table=REQ_TABLE,
)
