"""MDP/0.2 (RFC 18, ``specs/mdp-0.2.md``) as a dialect, and the frame layout MDP's kin share.

- ``MDP02``: clients and workers on DEALER sockets, ``MDPC02``/``MDPW02`` first. On the
  broker's first socket they never reach this codec: the core reads and writes their frames
  itself (``domo.protocol.family``'s fast path). On any other socket they are decoded here into
  neutral commands and encoded back, as every dialect is.
- ``MDP02_REQ``: an RFC 18 client behind a REQ socket and ROUTER-DEALER hops (REQREP-04): its
  request after the envelope's delimiter is an MDP/0.2 REQUEST; its FINAL goes back behind the
  envelope and delimiter, and it gets no PARTIAL, since a REQ socket takes one reply (REQREP-05).

MDP/0.1 and majortomo frame their commands as RFC 18 does, with other headers and codes:
``decode_worker`` and ``decode_client`` read that layout for any of them, with MDP/0.2's rules
for a bad one (MDP-W-01..08, MDP-R-02, MDP-C-01..03); ``to_frames`` writes any command as
MDP/0.2's frames, ``from_frames`` reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from ..commands import HEARTBEAT, LEAVE
from ..mdp import BodyFrame, Relayed
from .base import (
    CORE_CODES,
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

__all__ = [
    "CLIENT_COMMANDS",
    "MDP02",
    "MDP02_REQ",
    "REQ_TABLE",
    "TABLE",
    "WORKER_COMMANDS",
    "command_of",
    "decode_client",
    "decode_worker",
    "from_frames",
    "to_frames",
]

_W, _C = Role.WORKER, Role.CLIENT
_REGISTER, _REQUEST, _PARTIAL, _FINAL = (
    Command.REGISTER,
    Command.REQUEST,
    Command.PARTIAL,
    Command.FINAL,
)
_HEADER = {_W: MDPW02, _C: MDPC02}
# MDP/0.2's codes, each way: the command of a code, by side.
WORKER_COMMANDS: Final[Mapping[bytes, Command]] = {
    code: command for (role, command), code in CORE_CODES.items() if role is _W
}
CLIENT_COMMANDS: Final[Mapping[bytes, Command]] = {
    code: command for (role, command), code in CORE_CODES.items() if role is _C
}
_ADDRESSED = (_REQUEST, _PARTIAL, _FINAL)  # a worker's command that names a client
# The rule a bad layout breaks, by command (MDP/0.2's, whatever the dialect).
_WORKER_RULES: Final = {
    Command.REGISTER: "MDP-W-01",
    Command.REQUEST: "MDP-W-02",
    Command.PARTIAL: "MDP-W-03",
    Command.FINAL: "MDP-W-04",
    Command.HEARTBEAT: "MDP-W-05",
    Command.LEAVE: "MDP-W-06",
}
_CLIENT_RULES: Final = {_REQUEST: "MDP-C-01", _PARTIAL: "MDP-C-02", _FINAL: "MDP-C-03"}
_NAMES: Final = {command: command.name for command in Command}


def command_of(codes: Mapping[bytes, Command], code: BodyFrame) -> Command | None:
    """The command of ``code`` in ``codes`` (a view is no code: None)."""
    return codes.get(code) if isinstance(code, bytes) else None


def _describe(frame: BodyFrame) -> str:
    if not isinstance(frame, bytes):
        return f"a {type(frame).__name__} of {len(frame)} bytes"
    return "0x" + frame.hex() if len(frame) == 1 else repr(frame[:16])


def decode_worker(
    message: Sequence[BodyFrame], command: Command | None, unknown_rule: str = "MDP-W-08"
) -> CoreCommand | Invalid:
    """A worker's message laid out as RFC 18's (header, code, the command's frames), its code
    read as ``command`` (None: a code the dialect does not have, ``unknown_rule``)."""
    if command is None:
        code = message[1] if len(message) > 1 else b""
        return Invalid(unknown_rule, f"unknown worker command {_describe(code)}")
    count = len(message)
    if command in _ADDRESSED:
        if count < 5:
            return Invalid(
                _WORKER_RULES[command],
                f"worker {_NAMES[command]} needs at least 5 frames (header, command, client "
                f"address, empty delimiter, body), got {count}",
            )
        address, delimiter = message[2], message[3]
        if address.__class__ is not bytes or delimiter.__class__ is not bytes:
            return Invalid("MDP-W-08", "a frame before the body is not bytes")
        if delimiter:
            return Invalid(
                "MDP-R-02",
                f"worker {_NAMES[command]} frame 3 must be the empty delimiter, "
                f"got {_describe(delimiter)}",
            )
        return CoreCommand(_W, command, b"", address, tuple(message[4:]))
    if command is _REGISTER:
        if count != 3:
            return Invalid("MDP-W-01", f"worker READY has exactly 3 frames, got {count}")
        service = message[2]
        if service.__class__ is not bytes:
            return Invalid("MDP-W-08", "the service frame is not bytes")
        return CoreCommand(_W, _REGISTER, service)
    if count != 2:
        rule = _WORKER_RULES[command]
        return Invalid(rule, f"worker {_NAMES[command]} has exactly 2 frames, got {count}")
    return HEARTBEAT if command is Command.HEARTBEAT else LEAVE


def decode_client(
    message: Sequence[BodyFrame], command: Command | None, at: int
) -> CoreCommand | Invalid:
    """A client's message: ``command`` (None: an unknown code, MDP-C-01), its service at
    frame ``at``, then a body of one frame or more (RFC 18's layout, and RFC 7's with no code
    frame)."""
    if command is None:
        code = message[1] if len(message) > 1 else b""
        return Invalid("MDP-C-01", f"unknown client command {_describe(code)}")
    if len(message) < at + 2:
        return Invalid(
            _CLIENT_RULES[command],
            f"client {_NAMES[command]} needs a service and a body of one frame or more",
        )
    service = message[at]
    if service.__class__ is not bytes:
        return Invalid("MDP-W-08", "the service frame is not bytes")
    return CoreCommand(_C, command, service, b"", tuple(message[at + 1 :]))


def from_frames(frames: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    """MDP/0.2 frames (a client's or a worker's) as the neutral command."""
    header = frames[0] if frames else b""
    code = frames[1] if len(frames) > 1 else b""
    if header == MDPW02:
        if len(frames) < 2:
            return Invalid("MDP-W-08", "worker message has a header but no command frame")
        return decode_worker(frames, command_of(WORKER_COMMANDS, code))
    if header == MDPC02:
        if len(frames) < 2:
            return Invalid("MDP-C-01", "client message has a header but no command frame")
        return decode_client(frames, command_of(CLIENT_COMMANDS, code), 2)
    return Invalid("MDP-W-08", "unknown protocol header")


def to_frames(command: CoreCommand) -> Relayed:
    """``command`` as MDP/0.2's frames (RFC 18), either way; an empty body as one empty frame,
    since RFC 18's has one frame or more (FAM-10)."""
    role, what = command.role, command.command
    head = (_HEADER[role], CORE_CODES[role, what])
    body = command.body or (b"",)
    if role is _C:
        return (*head, command.service, *body)
    if what in _ADDRESSED:
        return (*head, command.address, b"", *body)
    if what is _REGISTER:
        return (*head, command.service)
    return head


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    if header == MDPC02:
        return Role.CLIENT
    if header == MDPW02:
        return Role.WORKER
    return None


def _claims_req_client(header: BodyFrame, command: BodyFrame) -> Role | None:
    return Role.CLIENT if header == MDPC02 else None  # REQREP-04


def _decode_req_client(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    if len(message) < 2:
        return Invalid("MDP-C-01", "client message has a header but no command frame")
    return decode_client(message, command_of(CLIENT_COMMANDS, message[1]), 2)


def _encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed:
    return to_frames(command)


def _encode_behind_envelope(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed:
    return (*route.envelope, b"", *to_frames(command))  # REQREP-01


# The codecs as data (specs/family.md, specs/reqrep.md). MDP/0.2's is the core's own form: every
# command either way, as the core has it (CORE_CODES); which of them a peer may send is the
# core's tables' business (MDP-W-15, MDP-D-16).
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
        outstanding_per_client=1,  # MDP-S-02, MDP-D-33
        client_hops=False,  # a DEALER client; behind REQ it is MDP02_REQ
    ),
    claims=_claims,
    decode=from_frames,
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
    decode=_decode_req_client,
    encode=_encode_behind_envelope,
    table=REQ_TABLE,
)
