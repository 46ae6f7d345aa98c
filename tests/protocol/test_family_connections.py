"""FamilyBroker on several connections: a peer is (connection, routing id) (MDP-A-02).

A runtime numbers its sockets 0, 1, ... and tells the broker which one a message came on; the
broker says which one each outgoing message goes to. The same routing id on two connections is
two peers; the I/O layer's word about a routing id applies to its connection only.
"""

from __future__ import annotations

from domo.protocol import BrokerConfig
from domo.protocol.dialects import Dialect
from domo.protocol.events import (
    ProtocolViolation,
    RequestCompleted,
    RequestDropped,
    WorkerDisconnected,
    WorkerRegistered,
)
from domo.protocol.family import FamilyBroker, peer_key

from .mdp_strategies import plain

C02, W02, C01, W01 = b"MDPC02", b"MDPW02", b"MDPC01", b"MDPW01"
CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=10.0)
Out = list[tuple[int, bytes, tuple[bytes, ...]]]


def out(broker: FamilyBroker) -> Out:
    """What the broker sends, as a runtime's flush takes it (``flushed`` included, MDP-D-24)."""
    sent = [(conn, peer, plain(frames)) for conn, peer, frames in broker.take_outgoing()]
    broker.flushed()
    return sent


def test_a_client_on_one_connection_is_served_by_a_worker_on_another() -> None:
    broker = FamilyBroker(CONFIG)
    assert broker.receive(b"W", [W02, b"\x01", b"echo"], 0.0, 0) == [
        WorkerRegistered(b"W", b"echo", 0.0)
    ]
    broker.receive(b"C", [C02, b"\x01", b"echo", b"hi"], 0.1, 1)
    client = peer_key(b"C", (), Dialect.MDP02, 1)
    assert out(broker) == [(0, b"W", (W02, b"\x02", client, b"", b"hi"))]
    assert broker.address(client) == (1, b"C")
    broker.receive(b"W", [W02, b"\x03", client, b"", b"half"], 0.2)
    broker.receive(b"W", [W02, b"\x04", client, b"", b"HI"], 0.3)
    assert out(broker) == [
        (1, b"C", (C02, b"\x02", b"echo", b"half")),  # MDP-R-01: PARTIALs reach it
        (1, b"C", (C02, b"\x03", b"echo", b"HI")),
    ]
    assert broker.keys() == 0  # forgotten once done, as a dialect peer's key (REQREP-06)


def test_the_same_routing_id_on_two_connections_is_two_peers() -> None:
    broker = FamilyBroker(CONFIG)
    broker.receive(b"X", [W02, b"\x01", b"svc"], 0.0, 0)
    events = broker.receive(b"X", [W02, b"\x01", b"svc"], 0.0, 1)
    second = peer_key(b"X", (), Dialect.MDP02, 1)
    assert events == [WorkerRegistered(second, b"svc", 0.0)]  # not READY twice (MDP-W-09)
    assert list(broker.workers()) == [b"X", second]
    broker.receive(b"X", [C01, b"svc", b"a"], 0.1, 2)  # a bare MDPC01 is no family message
    broker.receive(b"X", [b"", C01, b"svc", b"a"], 0.1, 2)  # MDP01-01 on a third connection
    broker.receive(b"X", [b"", C01, b"svc", b"b"], 0.1, 3)
    sent = out(broker)
    assert [(conn, peer) for conn, peer, _ in sent] == [(0, b"X"), (1, b"X")]
    first_client, second_client = (frames[2] for _, _, frames in sent)
    assert first_client == peer_key(b"X", (), Dialect.MDP01, 2, b"#1")  # FAM-08: numbered
    assert second_client == peer_key(b"X", (), Dialect.MDP01, 3, b"#1")
    broker.receive(b"X", [W02, b"\x04", second_client, b"", b"B"], 0.2, 1)
    assert out(broker) == [(3, b"X", (b"", C01, b"svc", b"B"))]


def test_unreachable_and_congested_apply_to_their_connection_only() -> None:
    broker = FamilyBroker(CONFIG)
    broker.receive(b"X", [W02, b"\x01", b"svc"], 0.0, 0)
    broker.receive(b"X", [b"", W01, b"\x01", b"svc"], 0.0, 1)
    other = peer_key(b"X", (), Dialect.MDP01, 1)
    events = broker.peer_unreachable(b"X", 0.1, 1)
    assert [(type(e), e.worker) for e in events if isinstance(e, WorkerDisconnected)] == [
        (WorkerDisconnected, other)
    ]
    assert list(broker.workers()) == [b"X"]  # the peer on connection 0 is untouched
    broker.receive(b"C", [C02, b"\x01", b"svc", b"x"], 0.2, 1)
    client = peer_key(b"C", (), Dialect.MDP02, 1)
    assert out(broker) == [(0, b"X", (W02, b"\x02", client, b"", b"x"))]
    assert broker.peer_congested(b"C", 0.3, 0) == []  # no such peer on connection 0
    events = broker.peer_congested(b"C", 0.3, 1)  # MDP-D-15: the request is given up
    assert [type(e) for e in events] == [RequestDropped]


def test_garbage_on_another_connection_is_refused_and_leaves_nothing() -> None:
    broker = FamilyBroker(CONFIG)
    events = broker.receive(b"R", [b"junk", b"more"], 0.0, 1)
    assert [(e.rule, e.action) for e in events if isinstance(e, ProtocolViolation)] == [
        ("MDP-W-08", "dropped")
    ]
    assert out(broker) == []
    assert broker.keys() == 0


def test_a_dialect_worker_on_a_second_connection_serves_connection_0() -> None:
    """MDP01-11 across sockets: an MDP/0.1 worker on connection 1, an MDP/0.2 client on 0."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [b"", W01, b"\x01", b"upper"], 0.0, 1)
    broker.receive(b"C", [C02, b"\x01", b"upper", b"abc"], 0.1, 0)
    assert out(broker) == [(1, b"W", (b"", W01, b"\x02", b"C", b"", b"abc"))]
    assert broker.receive(b"W", [b"", W01, b"\x03", b"C", b"", b"ABC"], 0.2, 1) == []
    assert [(c, p, plain(f)) for c, p, f in broker.take_outgoing()] == [
        (0, b"C", (C02, b"\x03", b"upper", b"ABC"))
    ]
    assert [type(e) for e in broker.flushed()] == [RequestCompleted]  # sent (MDP-D-24)
    broker.tick(1.3)
    assert out(broker) == [(1, b"W", (b"", W01, b"\x04"))]  # MDP01-07, on its own socket
