"""A dialect of one's own, of no MDP shape, on the neutral core (FAM-10).

The test dialect, ``named``, spells its commands out: a worker sends ``"", "NW", "register",
service`` or ``"", "NW", "final", client, body...`` and so on; a client sends ``"", "NC",
"request", service, body...``. Its codec gives ``CoreCommand``s, so its messages reach the routing
core through ``Broker.command`` with no MDP/0.2 frames in between, and what the core sends it is
a ``CoreCommand`` its codec spells out the same way. It serves and is served by MDP/0.2 peers
(MDP01-11's cross-dialect routing, for a dialect of any shape), and what is none of its
commands is refused as garbage (MDP-W-08 from a stranger, MDP-W-16 from its worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from domo.protocol import BrokerConfig
from domo.protocol.dialects import (
    DETECTION_ORDER,
    MDPC02,
    MDPW02,
    Capabilities,
    Command,
    CoreCommand,
    DialectCodec,
    Invalid,
    Lookup,
    Registry,
    Role,
    RouteView,
)
from domo.protocol.events import (
    ProtocolViolation,
    RequestCompleted,
    WorkerDisconnected,
    WorkerRegistered,
)
from domo.protocol.family import FamilyBroker, peer_key
from domo.protocol.mdp import BodyFrame, Relayed

from .mdp_strategies import plain

NW, NC = b"NW", b"NC"
CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=10.0)
NAMES = {command.value.encode(): command for command in Command}
GARBAGE = Invalid("MDP-W-08", "none of its commands")


class Named(Enum):
    NAMED = "named"


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    return {NW: Role.WORKER, NC: Role.CLIENT}.get(bytes(header))


def _decode(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    role = Role.WORKER if message[0] == NW else Role.CLIENT
    command = NAMES.get(bytes(message[1])) if len(message) > 1 else None
    if command is None:
        return GARBAGE
    rest = tuple(message[2:])
    if command is Command.REGISTER or (role is Role.CLIENT and command is Command.REQUEST):
        if not rest or not isinstance(rest[0], bytes):
            return GARBAGE
        return CoreCommand(role, command, service=rest[0], body=rest[1:])
    if command in (Command.PARTIAL, Command.FINAL):
        if not rest or not isinstance(rest[0], bytes):
            return GARBAGE
        return CoreCommand(role, command, address=rest[0], body=rest[1:])
    return CoreCommand(role, command)


def _encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed:
    header = NW if command.role is Role.WORKER else NC
    name = command.command.value.encode()
    if command.command is Command.REQUEST:  # to a worker: whose it is, then the body
        return (b"", header, name, command.address, b"", *command.body)
    if command.role is Role.CLIENT:
        return (b"", header, name, command.service, *command.body)
    return (b"", header, name)


NAMED = DialectCodec(
    dialect=Named.NAMED,
    capabilities=Capabilities(
        clients=True,
        workers=True,
        partial_replies=True,
        worker_heartbeats=True,
        broker_heartbeats=True,
        disconnect=True,
        mmi=True,
        outstanding_per_client=1,
        client_hops=False,
    ),
    claims=_claims,
    decode=_decode,
    encode=_encode,
)


def broker() -> FamilyBroker:
    return FamilyBroker(CONFIG, Registry((*DETECTION_ORDER, NAMED)))


def sent(made: FamilyBroker) -> list[tuple[bytes, tuple[bytes, ...]]]:
    out = [(peer, plain(frames)) for _, peer, frames in made.take_outgoing()]
    made.flushed()
    return out


def test_a_named_worker_serves_an_mdp02_client() -> None:
    made = broker()
    worker = peer_key(b"N", (), Named.NAMED)
    events = made.receive(b"N", [b"", NW, b"register", b"echo"], 0.0)
    assert [(type(e), e.worker) for e in events if isinstance(e, WorkerRegistered)] == [
        (WorkerRegistered, worker)
    ]
    made.receive(b"C", [MDPC02, b"\x01", b"echo", b"hi"], 0.1)
    assert sent(made) == [(b"N", (b"", NW, b"request", b"C", b"", b"hi"))]
    made.receive(b"N", [b"", NW, b"partial", b"C", b"h"], 0.2)
    made.receive(b"N", [b"", NW, b"final", b"C", b"HI"], 0.3)
    out = [(peer, plain(frames)) for _, peer, frames in made.take_outgoing()]
    assert out == [
        (b"C", (MDPC02, b"\x02", b"echo", b"h")),
        (b"C", (MDPC02, b"\x03", b"echo", b"HI")),
    ]
    assert [type(e) for e in made.flushed()] == [RequestCompleted]


def test_a_named_client_is_served_by_an_mdp02_worker() -> None:
    made = broker()
    client = peer_key(b"Q", (), Named.NAMED)
    made.receive(b"W", [MDPW02, b"\x01", b"echo"], 0.0)
    made.receive(b"Q", [b"", NC, b"request", b"echo", b"hi"], 0.1)
    assert sent(made) == [(b"W", (MDPW02, b"\x02", client, b"", b"hi"))]
    made.receive(b"W", [MDPW02, b"\x04", client, b"", b"HI"], 0.2)
    assert sent(made) == [(b"Q", (b"", NC, b"final", b"echo", b"HI"))]


def test_what_is_none_of_its_commands_is_garbage() -> None:
    """MDP-W-08 from a peer the broker does not know; MDP-W-16 from its registered worker."""
    made = broker()
    stranger = peer_key(b"S", (), Named.NAMED)
    events = made.receive(b"S", [b"", NW, b"dance"], 0.0)
    assert [(e.peer, e.rule) for e in events if isinstance(e, ProtocolViolation)] == [
        (stranger, "MDP-W-08")
    ]
    worker = peer_key(b"N", (), Named.NAMED)
    made.receive(b"N", [b"", NW, b"register", b"echo"], 0.0)
    events = made.receive(b"N", [b"", NW, b"final"], 0.1)
    assert [(e.worker, e.reason) for e in events if isinstance(e, WorkerDisconnected)] == [
        (worker, "invalid-message")
    ]
    assert worker not in made.workers()
