"""MDP/0.1 (RFC 7, ``specs/mdp-0.1.md``): clients on REQ sockets and workers on DEALER sockets.

A client's request is ``envelope, "", "MDPC01", service, body`` (MDP01-01); a worker's commands
are ``"", "MDPW01", command, ...`` with RFC 7's codes (MDP01-02). RFC 7 has one REPLY and no
PARTIAL: a worker's REPLY is the request's FINAL (MDP01-04), and a client gets the FINAL alone
(MDP01-05).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..mdp import BodyFrame, Relayed
from .base import (
    MDPC01,
    MDPW01,
    NUMBERED,
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
    Translation,
)
from .mdp02 import command_of, decode_client, decode_worker

__all__ = ["MDP01", "TABLE"]

# MDP/0.1's worker commands (RFC 7), each way.
_FROM_WORKER = {
    b"\x01": Command.REGISTER,  # READY
    b"\x03": Command.FINAL,  # REPLY (MDP01-04)
    b"\x04": Command.HEARTBEAT,
    b"\x05": Command.LEAVE,  # DISCONNECT
}
_TO_WORKER = {Command.REQUEST: b"\x02", Command.HEARTBEAT: b"\x04", Command.LEAVE: b"\x05"}
_REQUEST_TO_WORKER = (b"", MDPW01, b"\x02")
_REQUEST = Command.REQUEST
_new_tuple = tuple.__new__  # bound once: ``tuple.__new__`` is a slow lookup each time


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    if header == MDPC01:
        return Role.CLIENT  # MDP01-01: a REQ client, directly or behind hops
    if header == MDPW01:
        return Role.WORKER  # MDP01-02: a DEALER worker
    return None


def _read(message: Sequence[BodyFrame]) -> Reading:
    """The message read once (``DialectCodec.read``): the neutral command and, for a client's
    request, ``NUMBERED``: it names no key, the broker numbers them (MDP01-09, FAM-08), so a
    DEALER client may have several outstanding; a worker's message names none."""
    if message[0] == MDPC01:
        # MDP01-03: [MDPC01, service, body...] is a REQUEST; the service is its frame 1.
        if len(message) > 2 and message[1].__class__ is bytes:  # as decode_client, inline
            # Records made as their own ``__new__`` makes them, without that call.
            request = _new_tuple(CoreCommand, (_C, _REQUEST, message[1], b"", tuple(message[2:])))
            return _new_tuple(Reading, (request, NUMBERED, ()))
        return Reading(decode_client(message, Command.REQUEST, 1), NUMBERED)
    code = message[1] if len(message) > 1 else b""
    return Reading(decode_worker(message, command_of(_FROM_WORKER, code)))  # MDP01-02, MDP01-06


def _decode(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    return _read(message).command


def _request_key(message: Sequence[BodyFrame]) -> tuple[bytes, Sequence[BodyFrame]] | None:
    key = _read(message).request_key
    return None if key is None else (key, message)


def _encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed:
    if command.role is _C:  # its FINAL (the broker withholds PARTIALs, MDP01-05)
        # MDP01-03: [MDPC01, service, body], one empty frame for an empty body (FAM-10).
        return (*route.envelope, b"", MDPC01, command.service, *(command.body or (b"",)))
    what = command.command
    if what is _REQUEST:  # MDP01-02
        return (*_REQUEST_TO_WORKER, command.address, b"", *(command.body or (b"",)))
    return (b"", MDPW01, _TO_WORKER[what])  # HEARTBEAT, DISCONNECT (MDP01-07, MDP01-08)


_W, _C = Role.WORKER, Role.CLIENT
TABLE = (  # the codec as data (specs/mdp-0.1.md); a worker code without a row is MDP01-06
    Translation(_W, True, Command.REGISTER, (b"", MDPW01, b"\x01"), "MDP01-02"),
    Translation(_W, True, Command.FINAL, (b"", MDPW01, b"\x03"), "MDP01-04"),
    Translation(_W, True, Command.HEARTBEAT, (b"", MDPW01, b"\x04"), "MDP01-07"),
    Translation(_W, True, Command.LEAVE, (b"", MDPW01, b"\x05"), "MDP01-08"),
    Translation(_C, True, Command.REQUEST, (b"", MDPC01), "MDP01-03"),
    Translation(_W, False, Command.REQUEST, (b"", MDPW01, b"\x02"), "MDP01-02"),
    Translation(_W, False, Command.HEARTBEAT, (b"", MDPW01, b"\x04"), "MDP01-07"),
    Translation(_W, False, Command.LEAVE, (b"", MDPW01, b"\x05"), "MDP01-08"),
    Translation(_C, False, Command.PARTIAL, None, "MDP01-05"),
    Translation(_C, False, Command.FINAL, (b"", MDPC01), "MDP01-03"),
)

MDP01 = DialectCodec(
    dialect=Dialect.MDP01,
    capabilities=Capabilities(
        clients=True,
        workers=True,
        partial_replies=False,  # MDP01-05
        worker_heartbeats=True,  # MDP01-07
        broker_heartbeats=True,
        disconnect=True,  # MDP01-08
        mmi=True,  # MDP01-10
        outstanding_per_client=None,  # MDP01-09: a DEALER client's, up to the broker's cap
        client_hops=True,  # MDP01-01
        busy_heartbeats=False,  # MDP01-12: the Guide's worker heartbeats only in its recv
    ),
    claims=_claims,
    decode=_decode,
    encode=_encode,
    request_key=_request_key,
    read=_read,
    table=TABLE,
)
