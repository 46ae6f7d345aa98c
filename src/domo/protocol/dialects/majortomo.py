"""majortomo 0.2.0's variant of MDP/0.2 (``specs/majortomo.md``).

Three framing differences from RFC 18: every message starts with an empty frame (MAJ-01), the
client numbers its commands like the worker's (REQUEST 0x02, PARTIAL 0x03, FINAL 0x04; MAJ-02),
and replies carry no service frame (MAJ-03, MAJ-04). Its client reads PARTIALs (MAJ-07).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..mdp import BodyFrame, Relayed
from .base import (
    MDPC02,
    MDPW02,
    Capabilities,
    Command,
    CoreCommand,
    Dialect,
    DialectCodec,
    Invalid,
    Lookup,
    Role,
    RouteView,
    Translation,
)
from .mdp02 import WORKER_COMMANDS, command_of, decode_client, decode_worker

__all__ = ["MAJORTOMO", "TABLE"]


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    if header == MDPW02:
        return Role.WORKER  # MAJ-01: majortomo's worker
    if header == MDPC02 and command == b"\x02":
        return Role.CLIENT  # MAJ-02: majortomo's client REQUEST code
    return None


def _decode(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    code = message[1] if len(message) > 1 else b""
    if message[0] == MDPC02:  # MAJ-02: REQUEST is 0x02; its client sends nothing else
        return decode_client(message, Command.REQUEST if code == b"\x02" else None, 2)
    return decode_worker(message, command_of(WORKER_COMMANDS, code))  # MAJ-01


def _encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed:
    body = command.body or (b"",)  # FAM-10: one empty frame for an empty body
    if command.role is Role.CLIENT:
        # MAJ-03, MAJ-04: PARTIAL 0x03, FINAL 0x04, no service frame.
        code = b"\x03" if command.command is Command.PARTIAL else b"\x04"
        return (b"", MDPC02, code, *body)
    what = command.command
    if what is Command.REQUEST:
        return (b"", MDPW02, b"\x02", command.address, b"", *body)  # MAJ-01
    return (b"", MDPW02, b"\x05" if what is Command.HEARTBEAT else b"\x06")


_W, _C = Role.WORKER, Role.CLIENT


def _worker(code: bytes) -> tuple[bytes, ...]:
    return (b"", MDPW02, code)  # MAJ-01: RFC 18's worker behind an empty frame


TABLE = (  # the codec as data (specs/majortomo.md); a client code without a row is refused
    Translation(_W, True, Command.REGISTER, _worker(b"\x01"), "MAJ-01"),
    Translation(_W, True, Command.REQUEST, _worker(b"\x02"), "MDP-W-15"),
    Translation(_W, True, Command.PARTIAL, _worker(b"\x03"), "MAJ-01"),
    Translation(_W, True, Command.FINAL, _worker(b"\x04"), "MAJ-01"),
    Translation(_W, True, Command.HEARTBEAT, _worker(b"\x05"), "MAJ-06"),
    Translation(_W, True, Command.LEAVE, _worker(b"\x06"), "MAJ-01"),
    Translation(_C, True, Command.REQUEST, (b"", MDPC02, b"\x02"), "MAJ-02"),
    Translation(_W, False, Command.REQUEST, _worker(b"\x02"), "MAJ-01"),
    Translation(_W, False, Command.HEARTBEAT, _worker(b"\x05"), "MAJ-06"),
    Translation(_W, False, Command.LEAVE, _worker(b"\x06"), "MAJ-01"),
    Translation(_C, False, Command.PARTIAL, (b"", MDPC02, b"\x03"), "MAJ-03"),
    Translation(_C, False, Command.FINAL, (b"", MDPC02, b"\x04"), "MAJ-04"),
)

MAJORTOMO = DialectCodec(
    dialect=Dialect.MAJORTOMO,
    capabilities=Capabilities(
        clients=True,
        workers=True,
        partial_replies=True,  # MAJ-07
        worker_heartbeats=True,  # MAJ-06
        broker_heartbeats=True,
        disconnect=True,
        mmi=True,  # MAJ-04
        outstanding_per_client=1,
        client_hops=False,  # a DEALER client; its leading empty frame is not a delimiter
        busy_heartbeats=False,  # MAJ-08: it heartbeats only inside wait_for_request
    ),
    claims=_claims,
    decode=_decode,
    encode=_encode,
    table=TABLE,
)
