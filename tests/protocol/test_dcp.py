"""DCP v1 through ``FamilyBroker``, sans-IO: every rule of specs/dcp-v1.md, frame by frame.

Peers here are routing ids and frames written out by hand from the DCP text and from the wire
captures of DagBox's broker (the 4-byte type frame); nothing of the dialect module is used to
build what a peer sends or to read what it gets.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domo.protocol.broker import BrokerConfig
from domo.protocol.commands import HEARTBEAT
from domo.protocol.events import (
    ProtocolViolation,
    RequestCompleted,
    RequestExpired,
    WorkerExpired,
    WorkerRegistered,
)
from domo.protocol.family import FamilyBroker

H = b"DGBX\x01"
# The type frames, both widths: the text's one byte and DagBox's little-endian int.
T1 = {name: bytes([code]) for name, code in (("reg", 1), ("ping", 2), ("pong", 3))}
T1 |= {"req": b"\x04", "rep": b"\x05", "recon": b"\x06"}
T4 = {name: frame + b"\x00\x00\x00" for name, frame in T1.items()}
W, C, C2, M = b"\x00wrk01", b"\x00cli01", b"\x00cli02", b"\x00mdp01"
INTERVAL = 1.0


def new_broker() -> FamilyBroker:
    return FamilyBroker(BrokerConfig(heartbeat_interval=INTERVAL, liveness=3, request_expiry=5))


def out(broker: FamilyBroker) -> list[tuple[bytes, tuple[bytes, ...]]]:
    sent = [(peer, tuple(bytes(f) for f in frames)) for _, peer, frames in broker.take_outgoing()]
    broker.flushed()
    return sent


def register(broker: FamilyBroker, peer: bytes, service: bytes, t: dict[str, bytes]) -> None:
    broker.receive(peer, [b"", H, t["reg"], service], broker.now if broker.now > 0 else 0.0)
    assert out(broker) == [(peer, (b"", H, t["reg"], service))]  # DCP-04: the echo


def violations(events: Sequence[object]) -> list[str]:
    return [e.rule for e in events if isinstance(e, ProtocolViolation)]


@pytest.mark.parametrize("t", [T1, T4], ids=["1-byte", "4-byte"])
def test_round_trip_with_metadata_in_each_width(t: dict[str, bytes]) -> None:
    """DCP-01, DCP-02, DCP-03, DCP-04, DCP-06, DCP-08, DCP-09, DCP-11, DCP-12."""
    broker = new_broker()
    register(broker, W, b"echo", t)
    broker.receive(C, [b"", H, t["req"], b"echo", b"", b"m1", b"m2", b"", b"d1", b"d2"], 0.1)
    [(to, request)] = out(broker)
    assert to == W
    assert request[:4] == (b"", H, t["req"], b"echo")
    token = request[4]
    assert token
    assert request[5:] == (b"", b"m1", b"m2", b"", b"d1", b"d2")
    # The worker garbles the metadata: the client still gets its own back (DCP-09).
    events = broker.receive(W, [b"", H, t["rep"], token, b"", b"zz", b"", b"r1"], 0.2)
    assert out(broker) == [(C, (b"", H, t["rep"], C, b"", b"m1", b"m2", b"", b"r1"))]
    assert not violations(events)


def test_the_width_follows_the_peer_not_the_broker() -> None:
    """DCP-03: a 1-byte client served by a 4-byte worker gets 1-byte replies, and back."""
    broker = new_broker()
    register(broker, W, b"svc", T4)
    broker.receive(C, [b"", H, T1["req"], b"svc", b"", b"", b"x"], 0.1)
    [(_, request)] = out(broker)
    assert request[2] == T4["req"]
    broker.receive(W, [b"", H, T4["rep"], request[4], b"", b"", b"y"], 0.2)
    assert out(broker) == [(C, (b"", H, T1["rep"], C, b"", b"", b"y"))]


def test_other_versions_and_type_frames_are_dropped_by_name() -> None:
    """DCP-01, DCP-02, DCP-23: dropped with an event naming the rule, nothing sent."""
    broker = new_broker()
    cases = {
        "DCP-01": [b"", b"DGBX\x02", b"\x04", b"s", b"", b"", b"d"],
        "DCP-02": [b"", H, b"\x04\x00"],
    }
    for rule, frames in cases.items():
        assert violations(broker.receive(C, frames, 0.0)) == [rule]
    for bad_type in (b"\x00", b"\x07", b"\x04\x00\x00\x01", b"", b"\x04\x00\x00\x00\x00"):
        assert violations(broker.receive(C, [b"", H, bad_type], 0.0)) == ["DCP-02"]
    assert violations(broker.receive(C, [b"", H], 0.0)) == ["DCP-02"]
    assert out(broker) == []
    assert broker.keys() == 0  # nothing is kept for garbage


def test_malformed_requests_registrations_and_replies() -> None:
    """DCP-04, DCP-05, DCP-06, DCP-12, DCP-13, DCP-15, DCP-23."""
    broker = new_broker()
    register(broker, W, b"s", T1)
    cases = [
        ("DCP-04", [b"", H, T1["reg"]]),
        ("DCP-04", [b"", H, T1["reg"], b"a", b"b"]),
        ("DCP-05", [b"", H, T1["reg"], b"mmi.x"]),
        ("DCP-05", [b"", H, T1["reg"], b"\x01bin"]),
        ("DCP-05", [b"", H, T1["req"], b"", b"", b""]),
        ("DCP-06", [b"", H, T1["req"]]),
        ("DCP-06", [b"", H, T1["req"], b"s", b"addr", b"m"]),  # no delimiter after address
        ("DCP-06", [b"", H, T1["req"], b"s", b"", b"m1", b"m2"]),  # no metadata delimiter
        ("DCP-06", [b"", H, T1["rep"]]),
        ("DCP-12", [b"", H, T1["rep"], b"", b"", b"d"]),  # a reply naming no client
        ("DCP-12", [b"", H, T1["rep"], b"x" * 256, b"", b"", b"d"]),
        ("DCP-13", [b"", H, T1["ping"], b"extra"]),
        ("DCP-15", [b"", H, T1["pong"]]),
        ("DCP-15", [b"", H, T4["recon"]]),
    ]
    for rule, frames in cases:
        assert violations(broker.receive(C2, frames, 0.1)) == [rule], frames
    assert out(broker) == []
    # The registered worker was not harmed by any of it (DCP-23): it still gets pong.
    broker.receive(W, [b"", H, T1["ping"]], 0.2)
    assert out(broker) == [(W, (b"", H, T1["pong"]))]


def test_an_explicit_client_address_is_echoed_not_routed_to() -> None:
    """DCP-07, DCP-08: the reply goes to the sender; its written address comes back in it."""
    broker = new_broker()
    register(broker, W, b"s", T1)
    broker.receive(C, [b"", H, T1["req"], b"s", C2, b"", b"tag", b"", b"d"], 0.1)
    [(_, request)] = out(broker)
    assert request[4] not in (C, C2)  # the worker sees the broker's token
    broker.receive(W, [b"", H, T1["rep"], request[4], b"", b"tag", b"", b"r"], 0.2)
    assert out(broker) == [(C, (b"", H, T1["rep"], C2, b"", b"tag", b"", b"r"))]


def test_several_requests_in_flight_answered_out_of_order() -> None:
    """DCP-10: distinct metadata, any number outstanding, replies in any order."""
    broker = new_broker()
    workers = [bytes([0, 0x77, n]) for n in range(3)]
    for worker in workers:
        register(broker, worker, b"s", T4)
    for n in range(3):
        broker.receive(C, [b"", H, T4["req"], b"s", b"", b"id-%d" % n, b"", b"q%d" % n], 0.1)
    dispatched = {request[-1]: (to, request[4]) for to, request in out(broker)}
    assert sorted(dispatched) == [b"q0", b"q1", b"q2"]
    for n in (2, 0, 1):
        to, token = dispatched[b"q%d" % n]
        broker.receive(to, [b"", H, T4["rep"], token, b"", b"x", b"", b"r%d" % n], 0.2)
        assert out(broker) == [(C, (b"", H, T4["rep"], C, b"", b"id-%d" % n, b"", b"r%d" % n))]
    assert broker.keys() == 3  # the workers; each request's key is forgotten once answered


def test_the_same_request_twice_in_flight_the_first_stands() -> None:
    """DCP-10: the second of two indistinguishable requests is dropped (MDP-S-02)."""
    broker = new_broker()
    frames = [b"", H, T1["req"], b"s", b"", b"same", b"", b"d"]
    broker.receive(C, frames, 0.0)
    assert violations(broker.receive(C, frames, 0.1)) == ["MDP-S-02"]
    # With other data but the same metadata it is the same request to the client, too.
    assert violations(broker.receive(C, [*frames[:-1], b"other"], 0.1)) == ["MDP-S-02"]
    assert len(broker.core.requests()) == 1


@pytest.mark.parametrize("size", [1, 64, 65, 255])
def test_requests_without_metadata_are_told_apart_by_width_and_service(size: int) -> None:
    """DCP-10, DCP-11: a request with neither address nor metadata is the same request as
    another only with the same width and service, whatever the service's length; its token
    is an address the worker can copy back (1-255 bytes), and its reply reaches the client."""
    broker = new_broker()
    service = b"s" * size
    for n in range(4):
        register(broker, bytes([0, 0x77, n]), service, T1)
    plain = [b"", H, T1["req"], service, b"", b"", b"d"]
    tokens = []
    for frames in (
        plain,
        [b"", H, T4["req"], *plain[3:]],  # the other width: another request
        [b"", H, T1["req"], service, b"", b"m", b"", b"d"],  # with metadata: another
        [b"", H, T1["req"], service, C2, b"", b"", b"d"],  # with an address: another
    ):
        assert not violations(broker.receive(C, frames, 0.1))
        [(_, request)] = out(broker)
        assert 0 < len(request[4]) <= 255
        tokens.append(request[4])
    assert len(set(tokens)) == 4
    assert violations(broker.receive(C, plain, 0.1)) == ["MDP-S-02"]  # the first stands
    assert len(broker.core.requests()) == 4
    broker.receive(bytes([0, 0x77, 0]), [b"", H, T1["rep"], tokens[0], b"", b"", b"r"], 0.2)
    assert out(broker) == [(C, (b"", H, T1["rep"], C, b"", b"", b"r"))]


def test_ping_pong_and_reconnect() -> None:
    """DCP-13, DCP-14: pong to a registered worker, reconnect to anyone else, every time."""
    broker = new_broker()
    broker.receive(W, [b"", H, T4["ping"]], 0.0)  # never registered
    assert out(broker) == [(W, (b"", H, T4["recon"]))]
    broker.receive(W, [b"", H, T4["ping"]], 0.1)  # still not: reconnect again, once
    assert out(broker) == [(W, (b"", H, T4["recon"]))]
    register(broker, W, b"s", T4)  # the worker does as told
    broker.receive(W, [b"", H, T4["ping"]], 0.2)
    assert out(broker) == [(W, (b"", H, T4["pong"]))]
    # A client must not ping: it is a peer with no worker side, so it gets reconnect.
    broker.receive(C, [b"", H, T1["ping"]], 0.3)
    assert out(broker) == [(C, (b"", H, T1["recon"]))]


def test_a_stray_reply_gets_one_reconnect_then_nothing_while_silenced() -> None:
    """DCP-12, DCP-14: a reply from a peer holding no request gets reconnect; a second stray
    from it while it is silenced (MDP-D-06) gets nothing, its ping still gets reconnect, and
    once it has been quiet for the liveness span a stray gets reconnect again."""
    broker = new_broker()
    stray = [b"", H, T1["rep"], C, b"", b"", b"d"]
    broker.receive(W, stray, 0.0)
    assert out(broker) == [(W, (b"", H, T1["recon"]))]
    broker.receive(W, stray, 0.1)
    assert out(broker) == []
    broker.receive(W, [b"", H, T1["ping"]], 0.2)
    assert out(broker) == [(W, (b"", H, T1["recon"]))]
    quiet_again = 0.2 + 3 * INTERVAL  # liveness x interval after its last message
    broker.tick(quiet_again)
    out(broker)
    broker.receive(W, stray, quiet_again + 0.1)
    assert out(broker) == [(W, (b"", H, T1["recon"]))]


def test_the_broker_never_pings_and_expires_a_silent_worker() -> None:
    """DCP-16: no broker heartbeat goes out; a silent worker's request goes to another one."""
    broker = new_broker()
    register(broker, W, b"s", T1)
    broker.receive(C, [b"", H, T1["req"], b"s", b"", b"", b"d"], 0.0)
    [(to, _)] = out(broker)
    assert to == W
    register(broker, b"\x00wrk02", b"s", T1)
    for step in range(1, 7):  # the second worker keeps pinging, the first is silent
        now = step * 0.5
        broker.receive(b"\x00wrk02", [b"", H, T1["ping"]], now)
        sent = out(broker)
        assert all(frames[2] != T1["req"] or to == b"\x00wrk02" for to, frames in sent)
        assert all(frames[2] in (T1["pong"], T1["req"]) for _, frames in sent)  # never a ping
    events = broker.tick(3.5)
    assert not [e for e in events if isinstance(e, WorkerExpired)]  # already expired by now
    assert W not in {broker.address(key)[1] for key in broker.workers()}


def test_the_codec_itself_never_encodes_a_heartbeat_as_a_ping() -> None:
    """DCP-16 in the codec: the core sends no HEARTBEAT to a DCP worker (its traits, FAM-01),
    and should one reach the codec anyway, for each width, it sends nothing."""
    for t in (T1, T4):
        broker = new_broker()
        register(broker, W, b"s", t)
        [key] = broker.workers()
        route = broker.route(key)
        assert route is not None
        assert route.codec.encode(route, HEARTBEAT, broker.route) is None


def test_a_ping_never_frees_a_busy_worker() -> None:
    """DCP-17: a second request waits while the only worker is busy, however it pings."""
    broker = new_broker()
    register(broker, W, b"s", T1)
    broker.receive(C, [b"", H, T1["req"], b"s", b"", b"a", b"", b"1"], 0.0)
    broker.receive(C, [b"", H, T1["req"], b"s", b"", b"b", b"", b"2"], 0.0)
    [(_, first)] = out(broker)
    broker.receive(W, [b"", H, T1["ping"]], 0.1)
    assert out(broker) == [(W, (b"", H, T1["pong"]))]  # pong, and no second request
    broker.receive(W, [b"", H, T1["rep"], first[4], b"", b"", b"r1"], 0.2)
    sent = out(broker)
    assert [to for to, _ in sent] == [C, W]
    assert sent[1][1][-1] == b"2"


def test_registering_again_goes_through_reconnect() -> None:
    """DCP-18, DCP-24: reconnect, then the new registration is served (and echoed)."""
    broker = new_broker()
    register(broker, W, b"a", T1)
    broker.receive(W, [b"", H, T1["reg"], b"b"], 0.1)
    assert out(broker) == [(W, (b"", H, T1["recon"]))]
    events = broker.receive(W, [b"", H, T1["reg"], b"b"], 0.2)
    assert [e.service for e in events if isinstance(e, WorkerRegistered)] == [b"b"]
    assert out(broker) == [(W, (b"", H, T1["reg"], b"b"))]


def test_a_reply_from_a_stranger_gets_reconnect() -> None:
    """DCP-12, DCP-24: a reply from a peer holding no request."""
    broker = new_broker()
    events = broker.receive(W, [b"", H, T4["rep"], b"who", b"", b"", b"d"], 0.0)
    assert violations(events) == ["MDP-W-15"]
    assert out(broker) == [(W, (b"", H, T4["recon"]))]


def test_shutdown_sends_reconnect() -> None:
    """DCP-24: the core's DISCONNECT reaches a DCP worker as reconnect."""
    broker = new_broker()
    register(broker, W, b"s", T4)
    broker.shutdown(0.1)
    assert out(broker) == [(W, (b"", H, T4["recon"]))]


def test_a_request_for_a_service_nobody_serves_is_queued() -> None:
    """DCP-19: queued, served by a worker that registers later; else expires."""
    broker = new_broker()
    broker.receive(C, [b"", H, T1["req"], b"later", b"", b"", b"d"], 0.0)
    broker.receive(C, [b"", H, T1["req"], b"never", b"", b"", b"d"], 0.0)
    assert out(broker) == []
    broker.receive(W, [b"", H, T1["reg"], b"later"], 1.0)
    sent = out(broker)
    assert [frames[2] for _, frames in sent] == [T1["reg"], T1["req"]]  # echo first (DCP-04)
    events = broker.tick(6.0)
    assert [e.service for e in events if isinstance(e, RequestExpired)] == [b"never"]


def test_a_worker_that_is_also_a_client() -> None:
    """DCP-20: a busy worker's own request is answered to it; it then replies to its client."""
    broker = new_broker()
    register(broker, W, b"front", T4)
    back = b"\x00wrk02"
    register(broker, back, b"back", T1)
    broker.receive(C, [b"", H, T1["req"], b"front", b"", b"c", b"", b"job"], 0.0)
    [(_, job)] = out(broker)
    # The front worker asks the back service, leaving its client address out.
    broker.receive(W, [b"", H, T4["req"], b"back", b"", b"sub", b"", b"part"], 0.1)
    [(to, sub)] = out(broker)
    assert to == back
    assert sub[5:] == (b"", b"sub", b"", b"part")
    broker.receive(back, [b"", H, T1["rep"], sub[4], b"", b"sub", b"", b"done"], 0.2)
    assert out(broker) == [(W, (b"", H, T4["rep"], W, b"", b"sub", b"", b"done"))]
    broker.receive(W, [b"", H, T4["ping"]], 0.3)  # still a registered, busy worker
    assert out(broker) == [(W, (b"", H, T4["pong"]))]
    broker.receive(W, [b"", H, T4["rep"], job[4], b"", b"c", b"", b"all done"], 0.4)
    assert out(broker) == [(C, (b"", H, T1["rep"], C, b"", b"c", b"", b"all done"))]


def test_empty_data_and_empty_data_parts() -> None:
    """DCP-06, DCP-21: no data parts round-trip; empty data parts after the first are data."""
    broker = new_broker()
    register(broker, W, b"s", T1)
    broker.receive(C, [b"", H, T1["req"], b"s", b"", b""], 0.0)
    [(_, request)] = out(broker)
    assert request[5:] == (b"", b"")  # delimiters only: no metadata, no data
    broker.receive(W, [b"", H, T1["rep"], request[4], b"", b"", b"a", b"", b"b"], 0.1)
    assert out(broker) == [(C, (b"", H, T1["rep"], C, b"", b"", b"a", b"", b"b"))]


def test_dcp_client_and_mdp02_worker() -> None:
    """DCP-21, DCP-25: the MDP/0.2 worker sees the data as its body; PARTIALs are withheld."""
    broker = new_broker()
    broker.receive(M, [b"MDPW02", b"\x01", b"mdp"], 0.0)
    broker.receive(C, [b"", H, T4["req"], b"mdp", b"", b"tag", b"", b"d1", b"d2"], 0.1)
    [(to, request)] = out(broker)
    assert to == M
    assert request[:2] == (b"MDPW02", b"\x02")
    assert request[3:] == (b"", b"d1", b"d2")
    client = request[2]
    broker.receive(M, [b"MDPW02", b"\x03", client, b"", b"partial"], 0.2)
    assert out(broker) == []  # DCP-25
    events = broker.receive(M, [b"MDPW02", b"\x04", client, b"", b"f1", b"f2"], 0.3)
    assert out(broker) == [(C, (b"", H, T4["rep"], C, b"", b"tag", b"", b"f1", b"f2"))]
    assert not violations(events)


def test_mdp02_client_and_dcp_worker() -> None:
    """DCP-21, DCP-22: no metadata to the worker; its data is the FINAL's body."""
    broker = new_broker()
    register(broker, W, b"dcp", T1)
    broker.receive(M, [b"MDPC02", b"\x01", b"dcp", b"b1", b"b2"], 0.0)
    [(_, request)] = out(broker)
    assert request[:4] == (b"", H, T1["req"], b"dcp")
    assert request[4] == M  # an MDP/0.2 client's token is its routing id
    assert request[5:] == (b"", b"", b"b1", b"b2")
    broker.receive(W, [b"", H, T1["rep"], M, b"", b"", b"r"], 0.1)
    assert out(broker) == [(M, (b"MDPC02", b"\x03", b"dcp", b"r"))]
    # One empty body frame is one empty data part; no data parts go back to an MDP/0.2
    # client as one empty frame, the nearest it can say (DCP-21, FAM-10).
    broker.receive(M, [b"MDPC02", b"\x01", b"dcp", b""], 0.2)
    [(_, request)] = out(broker)
    assert request[5:] == (b"", b"", b"")
    broker.receive(W, [b"", H, T1["rep"], M, b"", b""], 0.3)
    assert out(broker) == [(M, (b"MDPC02", b"\x03", b"dcp", b""))]


def test_dcp_21_data_parts_cross_dcp_to_dcp_exactly() -> None:
    """DCP-21, FAM-10: a DCP client's request with no data part, one empty part, or an empty
    part among others reaches a DCP worker as sent, and its reply's parts come back as sent
    (one empty part arrived as none before)."""
    broker = new_broker()
    register(broker, W, b"dcp", T1)
    for at, data in enumerate(((), (b"",), (b"", b"x", b""))):
        broker.receive(C, [b"", H, T1["req"], b"dcp", b"", b"m%d" % at, b"", *data], at)
        [(_, request)] = out(broker)
        token = request[4]
        assert request[5:] == (b"", b"m%d" % at, b"", *data)
        broker.receive(W, [b"", H, T1["rep"], token, b"", b"", *data], at + 0.5)
        assert out(broker) == [(C, (b"", H, T1["rep"], C, b"", b"m%d" % at, b"", *data))]


def test_mmi_service_for_a_dcp_client() -> None:
    """DCP-26."""
    broker = new_broker()
    register(broker, W, b"echo", T1)
    broker.receive(C, [b"", H, T1["req"], b"mmi.service", b"", b"q", b"", b"echo"], 0.0)
    broker.receive(C, [b"", H, T1["req"], b"mmi.service", b"", b"r", b"", b"nope"], 0.0)
    assert out(broker) == [
        (C, (b"", H, T1["rep"], C, b"", b"q", b"", b"200")),
        (C, (b"", H, T1["rep"], C, b"", b"r", b"", b"404")),
    ]


def test_the_wire_capture_of_dagbox() -> None:
    """DCP-02, DCP-08, DCP-11: the frames observed between DagBox's broker and its peers."""
    broker = new_broker()
    worker, client = b"\x00wrk99", b"\x00k\x8bEi"
    register(broker, worker, b"pyecho", T4)
    capture = [b"", H, b"\x04\x00\x00\x00", b"pyecho", b"", b"meta-1", b"", b"data-a", b"data-b"]
    broker.receive(client, capture, 0.1)
    [(_, request)] = out(broker)
    assert request[:4] == (b"", H, b"\x04\0\0\0", b"pyecho")
    assert request[5:] == (b"", b"meta-1", b"", b"data-a", b"data-b")
    reply = [b"", H, b"\x05\0\0\0", request[4], b"", b"meta-1", b"", b"data-a", b"data-b"]
    events = broker.receive(worker, reply, 0.2)
    observed = (b"", H, b"\x05\0\0\0", b"\x00k\x8bEi", b"", b"meta-1", b"", b"data-a", b"data-b")
    sent = broker.take_outgoing()
    assert [(peer, tuple(map(bytes, frames))) for _, peer, frames in sent] == [(client, observed)]
    assert not violations(events)
    assert [type(e) for e in broker.flushed()] == [RequestCompleted]  # once sent (MDP-D-24)


_ANY_FRAME = st.one_of(
    st.sampled_from([b"", H, b"DGBX\x02", b"s", b"mmi.service", b"\x00"]),
    st.sampled_from([bytes([n]) for n in range(8)] + [bytes([n, 0, 0, 0]) for n in range(8)]),
    st.binary(max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(
        st.tuples(
            st.sampled_from([W, C, C2]),
            st.lists(_ANY_FRAME, max_size=8).map(lambda rest: [b"", H, *rest]),
        ),
        max_size=12,
    )
)
def test_any_dgbx_message_is_served_or_dropped_never_a_crash(
    messages: list[tuple[bytes, list[bytes]]],
) -> None:
    """DCP-23: whatever follows the header, the broker answers only with DCP's messages in a
    width it reads, or drops the message with a violation; a registered worker keeps its pong."""
    broker = new_broker()
    register(broker, M, b"s", T4)
    now = 0.0
    for peer, frames in messages:
        now += 0.01
        events = broker.receive(peer, frames, now)
        for event in events:
            if isinstance(event, ProtocolViolation):
                assert event.rule.startswith(("DCP-", "MDP-"))
        for _, _to, sent in broker.take_outgoing():
            assert sent[:2] == (b"", H)
            assert len(sent[2]) in (1, 4)
            assert int.from_bytes(sent[2], "little") in (1, 3, 4, 5, 6)
        broker.flushed()
    broker.receive(M, [b"", H, T4["ping"]], now + 0.01)
    assert out(broker) == [(M, (b"", H, T4["pong"]))]


def test_dcp_peers_on_a_second_socket() -> None:
    """DCP-03, DCP-04, DCP-13: answers and replies go out on the connection the peer is on."""
    broker = new_broker()
    broker.receive(W, [b"", H, T4["reg"], b"s"], 0.0, connection=1)
    broker.receive(W, [b"", H, T4["ping"]], 0.1, connection=1)
    broker.receive(C, [b"", H, T1["req"], b"s", b"", b"", b"d"], 0.2)
    sent = broker.take_outgoing()
    assert [(conn, peer, frames[2]) for conn, peer, frames in sent] == [
        (1, W, T4["reg"]),
        (1, W, T4["pong"]),
        (1, W, T4["req"]),
    ]
    broker.flushed()
    token = sent[2][2][4]
    broker.receive(W, [b"", H, T4["rep"], token, b"", b"", b"r"], 0.3, connection=1)
    assert broker.take_outgoing() == [(0, C, (b"", H, T1["rep"], C, b"", b"", b"r"))]


def test_dcp_client_served_by_mdp01_and_majortomo_workers() -> None:
    """DCP-22: an MDP/0.1 worker and a majortomo worker serve a DCP client (its data their
    body, its metadata back in the reply)."""
    broker = new_broker()
    broker.receive(b"\x00old01", [b"", b"MDPW01", b"\x01", b"old"], 0.0)
    broker.receive(b"\x00maj01", [b"", b"MDPW02", b"\x01", b"maj"], 0.0)
    for n, (service, worker) in enumerate(((b"old", b"\x00old01"), (b"maj", b"\x00maj01"))):
        broker.receive(C, [b"", H, T4["req"], service, b"", b"t%d" % n, b"", b"x"], 0.1 + n * 0.3)
        [(to, request)] = out(broker)
        assert to == worker
        assert request[-2:] == (b"", b"x")
        client = request[3]
        if worker == b"\x00old01":  # RFC 7: "", MDPW01, REPLY 0x03, client, "", body
            reply = [b"", b"MDPW01", b"\x03", client, b"", b"y"]
        else:
            reply = [b"", b"MDPW02", b"\x04", client, b"", b"y"]
        broker.receive(worker, reply, 0.2 + n * 0.3)
        assert out(broker) == [(C, (b"", H, T4["rep"], C, b"", b"t%d" % n, b"", b"y"))]


def test_mdp01_req_client_served_by_a_dcp_worker() -> None:
    """DCP-22: an MDP/0.1 REQ client's request reaches a DCP worker; the reply goes back behind
    the REQ envelope."""
    broker = new_broker()
    register(broker, W, b"dcp", T1)
    broker.receive(b"\x00req01", [b"", b"MDPC01", b"dcp", b"q"], 0.0)
    [(_, request)] = out(broker)
    assert request[5:] == (b"", b"", b"q")  # no metadata, the body as data
    broker.receive(W, [b"", H, T1["rep"], request[4], b"", b"", b"a"], 0.1)
    assert out(broker) == [(b"\x00req01", (b"", b"MDPC01", b"dcp", b"a"))]
