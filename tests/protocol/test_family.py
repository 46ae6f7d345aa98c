"""FamilyBroker and the dialect codecs: every message of every step checked, across dialects.

Each test drives ``FamilyBroker`` with the frames a ROUTER would hand it (routing id removed)
and checks everything it sends, in each peer's own framing (specs/mdp-0.1.md, majortomo.md,
reqrep.md). MDP/0.2 behaviour itself is tested in test_broker_*.py; here MDP/0.2 peers appear
as the other side of a cross-dialect exchange.
"""

from __future__ import annotations

import pytest

from domo.protocol import BrokerConfig
from domo.protocol.dialects import MAX_HOPS, Dialect, detect
from domo.protocol.events import (
    MmiReplied,
    PartialForwarded,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestQueued,
    WorkerDisconnected,
    WorkerRegistered,
)
from domo.protocol.family import IDLE_KEYS, FamilyBroker, peer_key

from .mdp_strategies import plain

C02, W02, C01, W01 = b"MDPC02", b"MDPW02", b"MDPC01", b"MDPW01"
CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=10.0)
Out = list[tuple[bytes, tuple[bytes, ...]]]


def out(broker: FamilyBroker) -> Out:
    """What the broker sends, as a runtime's flush takes it (``flushed`` included, MDP-D-24)."""
    sent = broker.take_outgoing()
    assert all(connection == 0 for connection, _, _ in sent)  # one socket: connection 0
    broker.flushed()
    return [(peer, plain(frames)) for _, peer, frames in sent]


def worker_address(sent: tuple[bytes, ...], header_at: int) -> bytes:
    """The client address the broker put in a REQUEST (frame 2 after the header)."""
    return sent[header_at + 2]


# --- detection ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frames", "found"),
    [
        ([C02, b"\x01", b"echo", b"x"], (Dialect.MDP02, 0)),
        ([W02, b"\x01", b"echo"], (Dialect.MDP02, 0)),
        ([b"", C01, b"echo", b"x"], (Dialect.MDP01, 0)),  # MDP01-01: a REQ client
        ([b"hop1", b"hop2", b"", C01, b"echo", b"x"], (Dialect.MDP01, 2)),  # behind two hops
        ([b"", W01, b"\x01", b"echo"], (Dialect.MDP01, 0)),  # MDP01-02: a DEALER worker
        ([b"", W02, b"\x01", b"echo"], (Dialect.MAJORTOMO, 0)),  # MAJ-01
        ([b"", C02, b"\x02", b"echo", b"x"], (Dialect.MAJORTOMO, 0)),  # MAJ-02
        ([b"", C02, b"\x01", b"echo", b"x"], (Dialect.MDP02_REQ, 0)),  # REQREP-04
        ([b"hop", b"", C02, b"\x01", b"echo", b"x"], (Dialect.MDP02_REQ, 1)),
    ],
)
def test_detect_tells_each_dialect_apart(frames: list[bytes], found: tuple[Dialect, int]) -> None:
    assert detect(frames) == found


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b""],
        [b"", b""],
        [b"junk"],
        [b"", b"MDPX01", b"x"],
        [b"hop", b"", W01, b"\x01", b"echo"],  # a worker is never behind hops
        [b"hop", b"", W02, b"\x01", b"echo"],
        [b"a"] * (MAX_HOPS + 1) + [b"", C01, b"echo", b"x"],  # REQREP-03: too many hops
        [memoryview(b"x" * 10), b"", C01, b"echo", b"x"],  # an address is never a view
    ],
)
def test_garbage_is_no_dialect(frames: list[bytes]) -> None:
    """REQREP-03: what is not a family message is left to the core, which drops it."""
    assert detect(frames) is None


def test_garbage_reaches_the_core_and_is_refused_as_before() -> None:
    broker = FamilyBroker(CONFIG)
    events = broker.receive(b"R", [b"hop", b"", b"MDPX01"], 0.0)
    assert [(e.rule, e.action) for e in events if isinstance(e, ProtocolViolation)] == [
        ("MDP-W-08", "dropped")
    ]
    assert out(broker) == []
    assert broker.keys() == 0


# --- MDP/0.1 --------------------------------------------------------------------------------


def test_mdp01_req_client_served_by_mdp02_worker_with_partials_withheld() -> None:
    """MDP01-01, MDP01-03, MDP01-05, MDP01-11: a REQ client's request reaches an MDP/0.2
    worker; the worker's PARTIAL is not sent to the REQ client, its FINAL is, in 0.1 framing."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [W02, b"\x01", b"echo"], 0.0)
    assert out(broker) == []
    broker.receive(b"C", [b"", C01, b"echo", b"one", b"two"], 0.1)
    [(to, request)] = out(broker)
    client = worker_address(request, 0)
    assert (to, request) == (b"W", (W02, b"\x02", client, b"", b"one", b"two"))
    assert client == peer_key(b"C", (), Dialect.MDP01, request_key=b"#1")  # FAM-08
    events = broker.receive(b"W", [W02, b"\x03", client, b"", b"half"], 0.2)
    assert [type(e) for e in events] == [PartialForwarded]
    assert out(broker) == []  # MDP01-05: a REQ socket takes one reply
    assert broker.receive(b"W", [W02, b"\x04", client, b"", b"ONE", b"TWO"], 0.3) == []
    assert [plain(f) for _, _, f in broker.take_outgoing()] == [(b"", C01, b"echo", b"ONE", b"TWO")]
    assert [type(e) for e in broker.flushed()] == [RequestCompleted]  # sent: done (MDP-D-24)
    assert broker.keys() == 0  # REQREP-06: forgotten once done


def test_mdp01_worker_serves_mdp02_client_and_heartbeats_in_01() -> None:
    """MDP01-02, MDP01-04, MDP01-07, MDP01-11: READY, REQUEST, REPLY and HEARTBEAT with the
    0.1 codes and leading empty frame; the MDP/0.2 client gets a proper 0.2 FINAL."""
    broker = FamilyBroker(CONFIG)
    events = broker.receive(b"W1", [b"", W01, b"\x01", b"upper"], 0.0)
    worker = peer_key(b"W1", (), Dialect.MDP01)
    assert events == [WorkerRegistered(worker, b"upper", 0.0)]
    broker.receive(b"C2", [C02, b"\x01", b"upper", b"abc"], 0.1)
    assert out(broker) == [(b"W1", (b"", W01, b"\x02", b"C2", b"", b"abc"))]
    broker.receive(b"W1", [b"", W01, b"\x03", b"C2", b"", b"ABC"], 0.2)
    assert out(broker) == [(b"C2", (C02, b"\x03", b"upper", b"ABC"))]
    broker.tick(1.2)  # one interval after the broker last sent it anything
    assert out(broker) == [(b"W1", (b"", W01, b"\x04"))]
    broker.receive(b"W1", [b"", W01, b"\x04"], 1.3)  # its HEARTBEAT keeps it alive
    broker.tick(3.25)
    assert out(broker) == [(b"W1", (b"", W01, b"\x04"))]
    assert list(broker.workers()) == [worker]


def test_mdp01_worker_disconnect_and_invalid_command() -> None:
    """MDP01-08: a DISCONNECT ends the worker, and its request goes back to its queue;
    MDP01-06: an unknown 0.1 command makes the worker invalid, as in 0.2; a valid but
    unexpected one gets DISCONNECT, in 0.1's framing."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W1", [b"", W01, b"\x01", b"svc"], 0.0)
    broker.receive(b"C", [C02, b"\x01", b"svc", b"x"], 0.1)
    out(broker)
    events = broker.receive(b"W1", [b"", W01, b"\x05"], 0.2)
    assert any(isinstance(e, WorkerDisconnected) for e in events)
    assert broker.core.queued(b"svc") == 1  # MDP-D-08: back at the front of its queue
    broker.receive(b"W2", [b"", W01, b"\x01", b"svc"], 0.3)
    assert out(broker) == [(b"W2", (b"", W01, b"\x02", b"C", b"", b"x"))]
    events = broker.receive(b"W2", [b"", W01, b"\x09"], 0.4)
    gone = [e for e in events if isinstance(e, WorkerDisconnected)]
    assert [(e.reason, e.disconnect_sent) for e in gone] == [("invalid-message", False)]
    assert out(broker) == []  # MDP-D-01: an invalid peer is dropped, not spoken to
    broker.receive(b"W3", [b"", W01, b"\x01", b"svc"], 0.5)
    events = broker.receive(b"W3", [b"", W01, b"\x01", b"svc"], 0.6)  # READY twice: unexpected
    gone = [e for e in events if isinstance(e, WorkerDisconnected)]
    assert [(e.reason, e.disconnect_sent) for e in gone] == [("unexpected-command", True)]
    assert out(broker)[-1] == (b"W3", (b"", W01, b"\x05"))  # DISCONNECT in 0.1


def test_mdp01_client_mmi() -> None:
    """MDP01-10: mmi.service answers an MDP/0.1 client in its one reply."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [W02, b"\x01", b"echo"], 0.0)
    events = broker.receive(b"C", [b"", C01, b"mmi.service", b"echo"], 0.1)
    assert [type(e) for e in events] == [MmiReplied]
    assert out(broker) == [(b"C", (b"", C01, b"mmi.service", b"200"))]
    broker.receive(b"C", [b"", C01, b"mmi.service", b"nobody"], 0.2)
    assert out(broker) == [(b"C", (b"", C01, b"mmi.service", b"404"))]
    assert broker.keys() == 0


def test_mdp01_dealer_client_has_several_requests_outstanding() -> None:
    """MDP01-09, FAM-08: an RFC 7 client on a DEALER may send several requests before it
    reads; the broker numbers them, each is queued, dispatched and answered on its own, and the
    replies go back in the order they come, with nothing of the client kept afterwards."""
    broker = FamilyBroker(CONFIG)
    for body in (b"1", b"2", b"3"):
        events = broker.receive(b"C", [b"", C01, b"echo", body], 0.0)
        assert [type(e) for e in events] == [RequestQueued]
    assert broker.core.queued(b"echo") == 3
    broker.receive(b"W1", [W02, b"\x01", b"echo"], 0.1)
    broker.receive(b"W2", [W02, b"\x01", b"echo"], 0.1)
    sent = out(broker)
    assert [(to, frames[4]) for to, frames in sent] == [(b"W1", b"1"), (b"W2", b"2")]
    first, second = (worker_address(frames, 0) for _, frames in sent)
    assert first == peer_key(b"C", (), Dialect.MDP01, request_key=b"#1")
    assert second == peer_key(b"C", (), Dialect.MDP01, request_key=b"#2")
    broker.receive(b"W2", [W02, b"\x04", second, b"", b"two"], 0.2)  # the second first
    assert out(broker) == [
        (b"C", (b"", C01, b"echo", b"two")),
        (b"W2", (W02, b"\x02", peer_key(b"C", (), Dialect.MDP01, request_key=b"#3"), b"", b"3")),
    ]
    broker.receive(b"W1", [W02, b"\x04", first, b"", b"one"], 0.3)
    assert out(broker) == [(b"C", (b"", C01, b"echo", b"one"))]
    third = peer_key(b"C", (), Dialect.MDP01, request_key=b"#3")
    broker.receive(b"W2", [W02, b"\x04", third, b"", b"three"], 0.4)
    assert out(broker) == [(b"C", (b"", C01, b"echo", b"three"))]
    assert broker.keys() == 0  # REQREP-06: every key forgotten once its reply went out
    assert broker.core.requests() == []


# --- majortomo ------------------------------------------------------------------------------


def test_majortomo_client_and_worker_through_the_broker() -> None:
    """MAJ-01, MAJ-02, MAJ-03, MAJ-04, MAJ-07: majortomo's worker with its leading empty
    frame, its client with REQUEST 0x02; replies come back as PARTIAL 0x03 and FINAL 0x04
    without a service frame."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"MW", [b"", W02, b"\x01", b"echo"], 0.0)
    broker.receive(b"MC", [b"", C02, b"\x02", b"echo", b"hi"], 0.1)
    [(to, request)] = out(broker)
    client = worker_address(request, 1)
    assert (to, request) == (b"MW", (b"", W02, b"\x02", client, b"", b"hi"))
    broker.receive(b"MW", [b"", W02, b"\x03", client, b"", b"p"], 0.2)
    assert out(broker) == [(b"MC", (b"", C02, b"\x03", b"p"))]
    broker.receive(b"MW", [b"", W02, b"\x04", client, b"", b"f"], 0.3)
    assert out(broker) == [(b"MC", (b"", C02, b"\x04", b"f"))]
    broker.tick(1.35)
    assert out(broker) == [(b"MW", (b"", W02, b"\x05"))]  # MAJ-06: heartbeats as RFC 18's


def test_majortomo_client_served_by_mdp01_worker_and_mmi() -> None:
    """MAJ-04, MAJ-05, MAJ-07: across dialects, and MMI in majortomo's FINAL."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [b"", W01, b"\x01", b"old"], 0.0)
    broker.receive(b"MC", [b"", C02, b"\x02", b"mmi.service", b"old"], 0.1)
    assert out(broker) == [(b"MC", (b"", C02, b"\x04", b"200"))]
    broker.receive(b"MC", [b"", C02, b"\x02", b"old", b"q"], 0.2)
    [(to, request)] = out(broker)
    assert to == b"W"
    broker.receive(b"W", [b"", W01, b"\x03", request[3], b"", b"a"], 0.3)
    assert out(broker) == [(b"MC", (b"", C02, b"\x04", b"a"))]


def test_majortomo_client_with_another_code_is_judged_by_mdp02() -> None:
    """MAJ-02: only 0x02 is majortomo's REQUEST; anything else after "", MDPC02 is an RFC 18
    client behind REQ (REQREP-04) and the core judges it: a client's FINAL is refused."""
    broker = FamilyBroker(CONFIG)
    events = broker.receive(b"X", [b"", C02, b"\x03", b"echo", b"x"], 0.0)
    assert [e.rule for e in events if isinstance(e, ProtocolViolation)]
    assert out(broker) == []


# --- REQ envelopes --------------------------------------------------------------------------


def test_envelopes_are_kept_and_clients_behind_one_hop_are_apart() -> None:
    """REQREP-01, REQREP-02: two REQ clients behind the same proxy connection are two clients,
    each answered behind its own address stack, in order."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [W02, b"\x01", b"echo"], 0.0)
    broker.receive(b"P", [b"c1", b"", C01, b"echo", b"from 1"], 0.1)
    broker.receive(b"P", [b"h2", b"c2", b"", C02, b"\x01", b"echo", b"from 2"], 0.2)
    [(_, first)] = out(broker)
    broker.receive(b"W", [W02, b"\x04", first[2], b"", b"r1"], 0.3)
    reply, (to, second) = out(broker)  # the reply, then the queued request to the freed worker
    assert reply == (b"P", (b"c1", b"", C01, b"echo", b"r1"))
    assert (to, second[4:]) == (b"W", (b"from 2",))
    broker.receive(b"W", [W02, b"\x03", second[2], b"", b"partial"], 0.4)
    assert out(broker) == []  # REQREP-05: the REQ client gets the FINAL only
    broker.receive(b"W", [W02, b"\x04", second[2], b"", b"r2"], 0.5)
    assert out(broker) == [(b"P", (b"h2", b"c2", b"", C02, b"\x03", b"echo", b"r2"))]


def test_an_unreachable_hop_takes_every_client_behind_it() -> None:
    """REQREP-02: the I/O layer's word about a routing id reaches every client behind it."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"P", [b"c1", b"", C01, b"nobody", b"1"], 0.0)
    broker.receive(b"P", [b"c2", b"", C01, b"nobody", b"2"], 0.1)
    assert broker.core.queued(b"nobody") == 2
    broker.peer_unreachable(b"P", 0.2)
    assert broker.core.queued(b"nobody") == 0
    assert out(broker) == []
    assert broker.keys() == 0  # forgotten once the outbox was taken


def test_an_unreachable_dealer_client_loses_every_request_behind_its_routing_id() -> None:
    """REQREP-02, MDP01-09: a DEALER client with two requests outstanding on connection 0
    (two keys behind one routing id) loses both when it is unreachable; their routes, kept
    idle afterwards, are forgotten when it is found unreachable again."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"C", [b"", C01, b"nobody", b"1"], 0.0)
    broker.receive(b"C", [b"", C01, b"nobody", b"2"], 0.1)
    assert broker.core.queued(b"nobody") == 2
    events = broker.peer_unreachable(b"C", 0.2)
    dropped = [event.client for event in events if isinstance(event, RequestDropped)]
    assert dropped == [
        peer_key(b"C", (), Dialect.MDP01, request_key=b"#1"),
        peer_key(b"C", (), Dialect.MDP01, request_key=b"#2"),
    ]
    assert broker.core.queued(b"nobody") == 0
    assert out(broker) == []
    assert (broker.keys(), broker.idle()) == (0, 2)
    broker.peer_unreachable(b"C", 0.3)
    assert (broker.keys(), broker.idle()) == (0, 0)


def test_short_lived_req_clients_do_not_grow_the_broker() -> None:
    """REQREP-06: a thousand REQ clients behind a proxy, each asking once: nothing is kept."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [W02, b"\x01", b"echo"], 0.0)
    for n in range(1000):
        now = 0.001 * (n + 1)
        broker.receive(b"P", [b"c%d" % n, b"", C01, b"echo", b"x"], now)
        [(_, request)] = out(broker)
        broker.receive(b"W", [W02, b"\x04", request[2], b"", b"y"], now)
        assert out(broker) == [(b"P", (b"c%d" % n, b"", C01, b"echo", b"y"))]
    assert broker.keys() == 0


def test_idle_routes_are_bounded_and_forgotten_with_their_peer() -> None:
    """REQREP-06: idle REQ clients' routes are kept for their next request, at most IDLE_KEYS
    of them (the oldest go first); one that asks again is served under the same key; one
    whose routing id is unreachable is forgotten at once."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [W02, b"\x01", b"echo"], 0.0)
    clients = IDLE_KEYS + 10
    for n in range(clients):
        broker.receive(b"P%d" % n, [b"", C01, b"echo", b"x"], 0.001)
        [(_, request)] = out(broker)
        broker.receive(b"W", [W02, b"\x04", request[2], b"", b"y"], 0.001)
        out(broker)
    assert (broker.keys(), broker.idle()) == (0, IDLE_KEYS)
    last = b"P%d" % (clients - 1)
    broker.receive(last, [b"", C01, b"echo", b"again"], 0.002)
    [(_, request)] = out(broker)
    assert request[2] == peer_key(last, (), Dialect.MDP01, request_key=b"#1")
    assert (broker.keys(), broker.idle()) == (1, IDLE_KEYS - 1)
    broker.receive(b"W", [W02, b"\x04", request[2], b"", b"y"], 0.003)
    assert out(broker) == [(last, (b"", C01, b"echo", b"y"))]
    broker.peer_unreachable(last, 0.004)
    assert (broker.keys(), broker.idle()) == (0, IDLE_KEYS - 1)


def test_a_dialect_worker_stays_known_while_registered() -> None:
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W", [b"", W01, b"\x01", b"svc"], 0.0)
    broker.tick(0.5)
    out(broker)
    assert broker.keys() == 1
    broker.tick(3.0)  # expired: nothing heard for liveness x interval
    out(broker)
    assert broker.keys() == 0


def test_mdp02_peers_pass_untouched_and_keys_are_deterministic() -> None:
    """An MDP/0.2 peer is its own routing id; a key depends only on what identifies a peer."""
    broker = FamilyBroker(CONFIG)
    events = broker.receive(b"W", [W02, b"\x01", b"echo"], 0.0)
    assert events == [WorkerRegistered(b"W", b"echo", 0.0)]
    body = memoryview(b"z" * 70000)
    broker.receive(b"C", [C02, b"\x01", b"echo", body], 0.1)
    [(connection, to, request)] = broker.take_outgoing()
    assert (connection, to) == (0, b"W")
    assert request[4] is body  # MDP-S-03: the very object, no copy
    assert broker.keys() == 0
    assert peer_key(b"a", (b"b",), Dialect.MDP01) != peer_key(b"ab", (), Dialect.MDP01)
    assert peer_key(b"a", (), Dialect.MDP01) != peer_key(b"a", (), Dialect.MAJORTOMO)
    assert len(peer_key(b"", (), Dialect.MDP01)) != 5  # never a libzmq-made routing id


def test_shutdown_disconnects_dialect_workers_in_their_framing() -> None:
    broker = FamilyBroker(CONFIG)
    broker.receive(b"A", [b"", W01, b"\x01", b"s"], 0.0)
    broker.receive(b"B", [b"", W02, b"\x01", b"s"], 0.0)
    broker.receive(b"D", [W02, b"\x01", b"s"], 0.0)
    broker.shutdown(0.1)
    assert out(broker) == [
        (b"A", (b"", W01, b"\x05")),
        (b"B", (b"", W02, b"\x06")),
        (b"D", (W02, b"\x06")),
    ]


def test_dispatch_order_is_the_core_s_across_dialects() -> None:
    """MDP-A-04 holds across dialects: the worker idle the longest gets the next request."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"A", [b"", W01, b"\x01", b"s"], 0.0)
    broker.receive(b"B", [b"", W02, b"\x01", b"s"], 0.1)
    broker.receive(b"D", [W02, b"\x01", b"s"], 0.2)
    for n, expected in enumerate([b"A", b"B", b"D"]):
        events = broker.receive(b"C%d" % n, [C02, b"\x01", b"s", b"x"], 0.3 + n / 100)
        assert RequestDispatched in [type(e) for e in events]
        assert [to for to, _ in out(broker)] == [expected]


def test_a_failed_send_behind_a_proxy_names_the_right_request() -> None:
    """MDP-D-24, REQREP-02: two REQ clients behind one proxy; a PARTIAL to one is withheld
    (MDP01-05), so the runtime's outbox is shorter than the core's: the failure at its second
    message still means the second client's FINAL, and the first client's request completes."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"W1", [W02, b"\x01", b"echo"], 0.0)
    broker.receive(b"W2", [W02, b"\x01", b"echo"], 0.0)
    broker.receive(b"P", [b"c1", b"", C01, b"echo", b"1"], 0.1)
    broker.receive(b"P", [b"c2", b"", C01, b"echo", b"2"], 0.1)
    sent = out(broker)
    key = {bytes(request[4]): worker_address(request, 0) for _, request in sent}
    broker.receive(b"W2", [W02, b"\x03", key[b"2"], b"", b"half"], 0.2)  # withheld
    broker.receive(b"W1", [W02, b"\x04", key[b"1"], b"", b"one"], 0.2)
    broker.receive(b"W2", [W02, b"\x04", key[b"2"], b"", b"two"], 0.2)
    outbox = broker.take_outgoing()
    assert [plain(frames)[0] for _, _, frames in outbox] == [b"c1", b"c2"]
    events = broker.peer_congested(b"P", 0.2, unsent=1)
    dropped = [e for e in events if isinstance(e, RequestDropped)]
    assert [(e.client, e.reason, e.rule) for e in dropped] == [
        (key[b"2"], "client-congested", "MDP-D-15")
    ]
    assert [(type(e), e.client) for e in broker.flushed()] == [(RequestCompleted, key[b"1"])]
    assert broker.keys() == 0
