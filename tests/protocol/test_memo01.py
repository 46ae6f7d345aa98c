"""memo01 (specs/memo01.md) on the family core, sans-IO: the codec and ``Memo01Broker``.

Connection 1 is the memo01 (NNG) connection; connection 0 carries MDP/0.2 peers. A memo01 message
comes with its token (8-byte pipe id, then a request number: MEMO-01) and each reply goes to one.
"""

from __future__ import annotations

import pytest

pytest.importorskip("cbor2")  # the `nng` extra

import cbor2

from domo.protocol import BrokerConfig
from domo.protocol.broker import REQUEST_OVERHEAD
from domo.protocol.dialects.memo01 import (
    Memo01Message,
    MessageType,
    claimed_sender,
    encode,
    parse,
)
from domo.protocol.errors import MalformedMessage
from domo.protocol.events import (
    BrokerEvent,
    MessageDropped,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    WorkerDisconnected,
    WorkerRegistered,
)
from domo.protocol.memo01 import (
    Memo01Broker,
    Memo01Config,
    body_to_payload,
    payload_to_body,
)

C02, W02 = b"MDPC02", b"MDPW02"
CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=10.0)
EPOCH = b"EPOC"
NNG = 1
T, R, H, J, D = (
    MessageType.RESULT,
    MessageType.READY,
    MessageType.HEARTBEAT,
    MessageType.JOB,
    MessageType.DISCONNECT,
)


def token(n: int, pipe: int = 1) -> bytes:
    return pipe.to_bytes(8, "big") + n.to_bytes(8, "big")


def make(**memo: object) -> Memo01Broker:
    return Memo01Broker(CONFIG, memo_connections={NNG}, memo=Memo01Config(epoch=EPOCH, **memo))  # type: ignore[arg-type]


def out(broker: Memo01Broker) -> list[tuple[int, bytes, tuple[bytes, ...]]]:
    sent = [(c, p, tuple(bytes(f) for f in fr)) for c, p, fr in broker.take_outgoing()]
    broker.flushed()
    return sent


def replies(broker: Memo01Broker) -> dict[bytes, Memo01Message | None]:
    """What each memo01 token got: a message, or None (released with no reply)."""
    got: dict[bytes, Memo01Message | None] = {}
    for conn, peer, frames in out(broker):
        assert conn == NNG
        got[peer] = parse(frames[0], from_broker=True) if frames else None
    return got


def ready(*services: str) -> bytes:
    return encode(R, services=services)


def job(service: str, payload: bytes = b"p", timeout_ms: int = 5000) -> bytes:
    return encode(J, b"", payload, service=service, timeout_ms=timeout_ms)


def new_worker(broker: Memo01Broker, tok: bytes, *services: str, now: float = 0.0) -> None:
    broker.receive(tok, [ready(*services)], now, NNG)


def worker_id(broker: Memo01Broker) -> bytes:
    (ident,) = broker.memo_workers()
    return ident


# -- the codec (MEMO-01..MEMO-07) -------------------------------------------------------------


def test_memo_01_header_then_payload() -> None:
    """MEMO-01."""
    data = cbor2.dumps(["memo01", 2, b"", "svc", 10]) + b"\x00payload"
    message = parse(data)
    assert message == Memo01Message(J, b"", b"\x00payload", service="svc", timeout_ms=10)
    for garbage in (b"", b"\xff\xff", cbor2.dumps({"a": 1}), cbor2.dumps(["memo01", 2])):
        with pytest.raises(MalformedMessage) as caught:
            parse(garbage)
        assert caught.value.rule == "MEMO-01"
    with pytest.raises(MalformedMessage, match="protocol field"):
        parse(cbor2.dumps(["memo02", 2, b"", "svc", 10]))
    with pytest.raises(MalformedMessage, match="byte string"):
        parse(cbor2.dumps(["memo01", 2, "", "svc", 10]))


def test_memo_02_types_heartbeat_and_disconnect() -> None:
    """MEMO-02."""
    assert parse(encode(H, b"id")) == Memo01Message(H, b"id")
    assert parse(encode(D, b"id")) == Memo01Message(D, b"id")
    with pytest.raises(MalformedMessage, match="unknown message type"):
        parse(cbor2.dumps(["memo01", 6, b"id"]))
    with pytest.raises(MalformedMessage, match="unknown message type"):
        parse(cbor2.dumps(["memo01", True, b"id"]))  # a bool is no type number
    for bad in (cbor2.dumps(["memo01", 4, b"id", 1]), encode(H, b"id") + b"x", encode(D, b"")):
        with pytest.raises(MalformedMessage) as caught:
            parse(bad)
        assert caught.value.rule == "MEMO-02"


def test_memo_03_ready_service_set_sorted_length_first() -> None:
    """MEMO-03."""
    assert parse(ready("bb", "a", "c")).services == ("a", "c", "bb")  # encode sorts
    raw = cbor2.dumps(["memo01", 1, b"", ["a", "c", "bb"]])
    assert parse(raw).services == ("a", "c", "bb")
    bad_sets: list[object] = [["bb", "a"], ["a", "a"], [], ["a", ""], ["a", 1], "a", ["é"]]
    bad_sets.append([f"s{i:03}" for i in range(257)])
    for services in bad_sets:
        with pytest.raises(MalformedMessage) as caught:
            parse(cbor2.dumps(["memo01", 1, b"", services]))
        assert caught.value.rule == "MEMO-03", services
    for bad in (cbor2.dumps(["memo01", 1, b"x", ["a"]]), ready("a") + b"payload"):
        with pytest.raises(MalformedMessage, match="READY"):
            parse(bad)


def test_memo_04_job_layout_and_timeout_range() -> None:
    """MEMO-04."""
    assert parse(job("svc", b"", 1)).timeout_ms == 1
    assert parse(job("svc", b"", 2**31 - 1)).timeout_ms == 2**31 - 1
    bad = [
        ["memo01", 2, b"", "svc", 0],
        ["memo01", 2, b"", "svc", 2**31],
        ["memo01", 2, b"", "svc", 1.5],
        ["memo01", 2, b"", "svc", True],
        ["memo01", 2, b"", "svc"],
        ["memo01", 2, b"", b"svc", 10],
        ["memo01", 2, b"wid", "svc", 10],  # a client's JOB has no id
    ]
    for header in bad:
        with pytest.raises(MalformedMessage) as caught:
            parse(cbor2.dumps(header))
        assert caught.value.rule == "MEMO-04", header
    to_worker = encode(J, b"wid", b"x", service="svc", timeout_ms=5)
    assert parse(to_worker, from_broker=True).id == b"wid"
    with pytest.raises(MalformedMessage):
        parse(to_worker)


def test_memo_05_result_with_and_without_the_leaving_flag() -> None:
    """MEMO-05."""
    assert parse(encode(T, b"w", b"out")) == Memo01Message(T, b"w", b"out")
    assert parse(encode(T, b"w", b"out", leaving=True)).leaving is True
    assert parse(encode(T, b"w", b"", leaving=False)).leaving is False
    for header in (["memo01", 3, b"w", 1], ["memo01", 3, b"w", True, 1], ["memo01", 3, b""]):
        with pytest.raises(MalformedMessage) as caught:
            parse(cbor2.dumps(header))
        assert caught.value.rule == "MEMO-05"
    assert parse(encode(T, b"", b"r"), from_broker=True).payload == b"r"  # to a client


def test_memo_07_deterministic_header_any_encoding_accepted() -> None:
    """MEMO-07."""
    message = encode(J, b"w", b"", service="svc", timeout_ms=24)
    assert message == cbor2.dumps(["memo01", 2, b"w", "svc", 24], canonical=True)
    assert message[:1] == b"\x85"  # a definite-length array: the shortest form
    # An indefinite-length array (not deterministic) is well-formed CBOR: accepted.
    loose = b"\x9f" + b"".join(cbor2.dumps(x) for x in ["memo01", 2, b"", "svc", 24]) + b"\xff"
    assert parse(loose + b"pay") == Memo01Message(J, b"", b"pay", service="svc", timeout_ms=24)


def test_claimed_sender_reads_what_it_can() -> None:
    assert claimed_sender(cbor2.dumps(["memo01", 3, b"id", "junk"])) == (T, b"id")
    assert claimed_sender(b"\xff") == (None, b"")
    assert claimed_sender(cbor2.dumps(["memo01", 9, b"id"])) == (None, b"")


# -- the broker: workers ------------------------------------------------------------------------


def test_memo_10_worker_id_is_epoch_then_number_learned_from_first_reply() -> None:
    """MEMO-10."""
    broker = make()
    new_worker(broker, token(1), "echo")
    ident = worker_id(broker)
    assert ident[:4] == EPOCH
    assert len(ident) == 8
    assert replies(broker) == {}  # the READY's context is held
    broker.receive(b"C", [C02, b"\x01", b"echo", b"hi"], 0.1)
    got = replies(broker)[token(1)]
    assert got == Memo01Message(J, ident, b"hi", service="echo", timeout_ms=60000)  # MEMO-13


def test_memo_10_stale_id_after_restart_gets_disconnect() -> None:
    """MEMO-10."""
    old = make()
    new_worker(old, token(1), "echo")
    stale = worker_id(old)
    restarted = Memo01Broker(CONFIG, memo_connections={NNG}, memo=Memo01Config(epoch=b"NEW!"))
    events = restarted.receive(token(2), [encode(H, stale)], 5.0, NNG)
    assert replies(restarted) == {token(2): Memo01Message(D, stale)}
    assert any(isinstance(e, MessageDropped) and "MEMO-10" in e.reason for e in events)
    restarted.receive(token(3), [encode(T, stale, b"late")], 5.1, NNG)
    assert replies(restarted) == {token(3): Memo01Message(D, stale)}  # its payload discarded


def test_memo_11_service_set_worker_serves_each_service_one_job_at_a_time() -> None:
    """MEMO-11."""
    broker = make()
    new_worker(broker, token(1), "a", "b")
    events = broker.receive(b"C1", [C02, b"\x01", b"b", b"one"], 0.1)
    assert [type(e) for e in events] == [
        type(e) for e in events if not isinstance(e, WorkerDisconnected)
    ], "withdrawing the other seat is bookkeeping, not reported"
    ident = worker_id(broker)
    assert replies(broker) == {
        token(1): Memo01Message(J, ident, b"one", service="b", timeout_ms=60000)
    }
    events = broker.receive(b"C2", [C02, b"\x01", b"a", b"two"], 0.2)
    assert [type(e).__name__ for e in events] == ["RequestQueued"]  # no seat of a is free
    assert replies(broker) == {}  # busy: service a waits, it is not sent a second job
    broker.receive(token(2), [encode(T, ident, b"ONE")], 0.3, NNG)
    sent = out(broker)
    assert (0, b"C1", (C02, b"\x03", b"b", b"ONE")) in sent
    assert (NNG, token(2), (encode(J, ident, b"two", service="a", timeout_ms=60000),)) in sent


@pytest.mark.parametrize("echo_late", [False, True], ids=["request-held", "awaiting-echo"])
def test_memo_11_two_seats_dispatched_at_once_the_worker_runs_its_busy_seats_job(
    echo_late: bool,
) -> None:
    """MEMO-11, MEMO-05 (issue 23): two workers expire together with a job each (given while
    they awaited a HEARTBEAT echo), and the core re-dispatches both jobs in one go to the two
    seats of one service-set worker. The layer keeps the first seat and withdraws the other, so
    the core takes that job back; the REQUEST it had already queued to the withdrawn seat is
    stale. It was translated all the same: it replaced the worker's JOB and client, so the
    worker was sent the job taken back (then run elsewhere too) while the kept job's clock
    started unsent, or its RESULT went to the other job's client (MDP-D-13) and was lost."""
    broker = make()
    new_worker(broker, token(1, pipe=1), "a")  # X1 and X2: silent from here on
    new_worker(broker, token(1, pipe=2), "b")
    new_worker(broker, token(1, pipe=3), "a", "b")  # W
    w = list(broker.memo_workers())[2]
    broker.tick(1.0)
    replies(broker)  # HEARTBEAT to all three
    broker.receive(token(2, pipe=3), [encode(H, w)], 1.0, NNG)
    broker.receive(b"C0", [C02, b"\x01", b"a", b"zero"], 1.1)  # to X1 (idle longest)
    broker.receive(b"C1", [C02, b"\x01", b"b", b"one"], 1.2)  # to X2
    assert replies(broker) == {}  # both JOBs wait for echoes that never come
    broker.tick(2.0)
    assert list(replies(broker)) == [token(2, pipe=3)]  # HEARTBEAT to W
    if not echo_late:
        broker.receive(token(3, pipe=3), [encode(H, w)], 2.0, NNG)
    events = broker.tick(3.0)  # X1 and X2 expire: both jobs go to W's two seats
    assert sum(isinstance(e, RequestDispatched) and w in e.worker for e in events) == 2
    # The seat given back is withdrawn once: no second DISCONNECT, dropped by the core as
    # "from a silenced peer" (a false alarm in the broker's log).
    assert not any(isinstance(e, MessageDropped) for e in events)
    sent = replies(broker)
    if echo_late:
        assert sent == {}
        broker.receive(token(3, pipe=3), [encode(H, w)], 3.5, NNG)  # the echo: now the JOB
        sent = replies(broker)
    # One JOB, for the job W's busy seat holds (the later one's service went first).
    assert sent == {token(3, pipe=3): Memo01Message(J, w, b"one", service="b", timeout_ms=60000)}
    events = broker.receive(token(4, pipe=3), [encode(T, w, b"ONE")], 3.6, NNG)
    assert not any(isinstance(e, ProtocolViolation) for e in events)
    after = out(broker)
    assert (0, b"C1", (C02, b"\x03", b"b", b"ONE")) in after  # MEMO-05: its job's FINAL
    # The job taken back waited in its queue for W, which gets it on its next request.
    job = encode(J, w, b"zero", service="a", timeout_ms=60000)
    assert (NNG, token(4, pipe=3), (job,)) in after


def test_memo_11_lru_across_workers_of_a_set() -> None:
    """MEMO-11."""
    broker = make()
    new_worker(broker, token(1), "a", "b", now=0.0)
    new_worker(broker, token(2), "b", now=0.1)
    broker.receive(b"C", [C02, b"\x01", b"b", b"x"], 0.2)
    assert list(replies(broker)) == [token(1)]  # idle longest (MDP-A-04)
    broker.receive(b"D", [C02, b"\x01", b"b", b"y"], 0.3)
    assert list(replies(broker)) == [token(2)]


def test_memo_05_result_is_the_jobs_final_and_the_worker_waits_for_more() -> None:
    """MEMO-05."""
    broker = make()
    new_worker(broker, token(1), "echo")
    broker.receive(b"C", [C02, b"\x01", b"echo", b"hi"], 0.1)
    ident = worker_id(broker)
    out(broker)
    events = broker.receive(token(2), [encode(T, ident, b"HI")], 0.2, NNG)
    sent = broker.take_outgoing()
    assert [(c, p, tuple(f)) for c, p, f in sent] == [(0, b"C", (C02, b"\x03", b"echo", b"HI"))]
    assert any(isinstance(e, RequestCompleted) for e in broker.flushed())
    assert not any(isinstance(e, WorkerRegistered) for e in events)  # seats back: bookkeeping
    broker.receive(b"D", [C02, b"\x01", b"echo", b"again"], 0.3)
    assert replies(broker)[token(2)].payload == b"again"  # type: ignore[union-attr]


def test_memo_06_leaving_flag_result_forwarded_then_disconnect() -> None:
    """MEMO-06."""
    broker = make()
    new_worker(broker, token(1), "echo")
    broker.receive(b"C", [C02, b"\x01", b"echo", b"hi"], 0.1)
    ident = worker_id(broker)
    out(broker)
    events = broker.receive(token(2), [encode(T, ident, b"bye", leaving=True)], 0.2, NNG)
    sent = out(broker)
    assert (0, b"C", (C02, b"\x03", b"echo", b"bye")) in sent
    assert (NNG, token(2), (encode(D, ident),)) in sent
    assert broker.memo_workers() == {}
    assert broker.workers() == {}
    assert any(isinstance(e, WorkerDisconnected) for e in events)


def test_memo_08_disconnect_from_an_idle_worker() -> None:
    """MEMO-08."""
    broker = make()
    new_worker(broker, token(1), "echo")
    ident = worker_id(broker)
    broker.receive(token(2), [encode(D, ident)], 0.1, NNG)
    # The held READY's context is released; the DISCONNECT is answered with DISCONNECT.
    assert replies(broker) == {token(1): None, token(2): Memo01Message(D, ident)}
    assert broker.workers() == {}


def test_memo_08_disconnect_from_a_busy_worker_redispatches_its_job() -> None:
    """MEMO-08."""
    broker = make()
    new_worker(broker, token(1), "echo")
    new_worker(broker, token(2), "echo", now=0.05)
    broker.receive(b"C", [C02, b"\x01", b"echo", b"hi"], 0.1)
    first = replies(broker)
    assert list(first) == [token(1)]
    ident = first[token(1)].id  # type: ignore[union-attr]
    broker.receive(token(3), [encode(D, ident)], 0.2, NNG)
    got = replies(broker)
    assert got[token(3)] == Memo01Message(D, ident)
    assert got[token(2)].payload == b"hi"  # type: ignore[union-attr]  # MDP-D-08


def test_memo_09_result_from_an_idle_worker_is_a_violation() -> None:
    """MEMO-09."""
    broker = make()
    new_worker(broker, token(1), "echo")
    ident = worker_id(broker)
    events = broker.receive(token(2), [encode(T, ident, b"what")], 0.1, NNG)
    assert any(isinstance(e, ProtocolViolation) and e.rule == "MEMO-09" for e in events)
    assert replies(broker) == {token(1): None, token(2): Memo01Message(D, ident)}
    assert broker.workers() == {}


def test_memo_09_heartbeat_from_a_busy_worker_is_a_violation() -> None:
    """MEMO-09."""
    broker = make()
    new_worker(broker, token(1), "echo")
    broker.receive(b"C", [C02, b"\x01", b"echo", b"hi"], 0.1)
    ident = worker_id(broker)
    out(broker)
    events = broker.receive(token(2), [encode(H, ident)], 0.2, NNG)
    assert any(isinstance(e, ProtocolViolation) and e.rule == "MEMO-09" for e in events)
    assert replies(broker) == {token(2): Memo01Message(D, ident)}


# -- heartbeats and timeouts --------------------------------------------------------------------


def test_memo_15_idle_worker_gets_heartbeat_answers_and_stays() -> None:
    """MEMO-15."""
    broker = make()
    new_worker(broker, token(1), "a", "b")
    ident = worker_id(broker)
    assert broker.next_deadline() == pytest.approx(1.0)
    broker.tick(1.0)
    assert replies(broker) == {token(1): Memo01Message(H, ident)}  # once, not once per seat
    broker.receive(token(2), [encode(H, ident)], 1.1, NNG)
    for now in (2.1, 3.1, 4.1):
        broker.tick(now)
        assert replies(broker) == {token(2 if now == 2.1 else int(now)): Memo01Message(H, ident)}
        broker.receive(token(int(now) + 1), [encode(H, ident)], now + 0.1, NNG)
    assert len(broker.workers()) == 2  # both seats alive


def test_memo_15_silent_worker_expires() -> None:
    """MEMO-15."""
    broker = make()
    new_worker(broker, token(1), "a", "b")
    ident = worker_id(broker)
    events = broker.tick(1.0) + broker.tick(3.5)
    assert broker.memo_workers() == {}
    assert broker.workers() == {}
    assert sum(1 for e in events if type(e).__name__ == "WorkerExpired") >= 1
    broker.receive(token(9), [encode(H, ident)], 3.6, NNG)
    assert replies(broker)[token(9)] == Memo01Message(D, ident)  # MEMO-10: forgotten id


def test_memo_12_busy_worker_is_alive_for_its_jobs_timeout_not_heartbeats() -> None:
    """MEMO-12."""
    broker = make()
    new_worker(broker, token(1), "slow")
    broker.receive(token(5), [job("slow", b"x", timeout_ms=20_000)], 0.1, NNG)
    ident = worker_id(broker)
    assert replies(broker)[token(1)].timeout_ms == 20_000  # type: ignore[union-attr]
    events = broker.tick(19.0)  # far past liveness x interval (3 s): still alive
    assert not any(type(e).__name__ == "WorkerExpired" for e in events)
    assert replies(broker) == {}  # no HEARTBEAT to a busy worker (no context to answer)
    broker.receive(token(6), [encode(T, ident, b"done")], 19.5, NNG)
    got = replies(broker)
    assert got[token(5)] == Memo01Message(T, b"", b"done")


def test_memo_12_memo_13_busy_worker_past_its_timeout_is_dropped_and_job_released() -> None:
    """MEMO-12, MEMO-13."""
    broker = make()
    new_worker(broker, token(1), "slow")
    broker.receive(token(5), [job("slow", b"x", timeout_ms=2_000)], 0.1, NNG)
    ident = worker_id(broker)
    out(broker)
    events = broker.tick(2.2)
    assert any(isinstance(e, MessageDropped) and "MEMO-13" in e.reason for e in events)
    assert any(isinstance(e, MessageDropped) and "MEMO-12" in e.reason for e in events)
    assert any(isinstance(e, RequestDropped) for e in events)
    assert replies(broker) == {token(5): None}  # MEMO-18: released, no reply: it resends
    assert broker.workers() == {}
    assert broker.memo_jobs() == 0
    # MEMO-14: its late RESULT gets DISCONNECT and goes nowhere.
    broker.receive(token(7), [encode(T, ident, b"late")], 2.5, NNG)
    assert replies(broker) == {token(7): Memo01Message(D, ident)}


def test_memo_13_mdp_clients_job_on_a_memo01_worker_is_redispatched_at_timeout() -> None:
    """MEMO-13."""
    broker = make(job_timeout=2.0)
    new_worker(broker, token(1), "svc")
    broker.receive(b"C", [C02, b"\x01", b"svc", b"x"], 0.0)
    assert replies(broker)[token(1)].timeout_ms == 2000  # type: ignore[union-attr]
    new_worker(broker, token(2), "svc", now=0.5)
    broker.tick(2.1)
    got = replies(broker)
    assert got[token(2)].payload == b"x"  # type: ignore[union-attr]  # MDP-D-08


def test_memo_13_memo01_clients_timeout_applies_to_an_mdp_worker_too() -> None:
    """MEMO-13."""
    broker = make()
    broker.receive(b"W", [W02, b"\x01", b"svc"], 0.0)
    broker.receive(token(5), [job("svc", b"x", timeout_ms=1500)], 0.1, NNG)
    sent = out(broker)
    assert sent[0][:2] == (0, b"W")
    client = sent[0][2][2]
    broker.receive(b"W", [W02, b"\x05"], 1.0)
    events = broker.tick(1.7)
    assert any(isinstance(e, RequestDropped) for e in events)
    assert (NNG, token(5), ()) in out(broker)  # released: no reply
    broker.receive(b"W", [W02, b"\x04", client, b"", b"late"], 1.8)
    assert out(broker) == []  # the FINAL for a client that is gone is dropped


def test_memo_18_queue_expiry_releases_the_context() -> None:
    """MEMO-18."""
    broker = make()
    broker.receive(token(5), [job("nobody")], 0.0, NNG)
    events = broker.tick(10.5)
    assert any(isinstance(e, RequestExpired) for e in events)
    assert replies(broker) == {token(5): None}


def test_memo_18_malformed_client_job_released_worker_message_disconnected() -> None:
    """MEMO-18."""
    broker = make()
    events = broker.receive(token(1), [cbor2.dumps(["memo01", 2, b"", "svc", -1])], 0.0, NNG)
    assert [e.rule for e in events if isinstance(e, ProtocolViolation)] == ["MEMO-04"]
    assert replies(broker) == {token(1): None}
    broker.receive(token(2), [b"\xff garbage"], 0.1, NNG)
    assert replies(broker) == {token(2): None}
    broker.receive(token(3), [b"two", b"frames"], 0.1, NNG)
    assert replies(broker) == {token(3): None}
    new_worker(broker, token(4), "svc")
    ident = worker_id(broker)
    events = broker.receive(token(5), [cbor2.dumps(["memo01", 4, ident, "x"])], 0.2, NNG)
    assert any(isinstance(e, ProtocolViolation) and e.rule == "MEMO-02" for e in events)
    assert replies(broker) == {token(4): None, token(5): Memo01Message(D, ident)}
    assert broker.workers() == {}
    broker.receive(token(6), [cbor2.dumps(["memo01", 1, b"", ["b", "a"]])], 0.3, NNG)
    assert replies(broker) == {token(6): Memo01Message(D, b"")}  # a bad READY: start again


def test_memo_18_mmi_service_answers_a_memo01_client() -> None:
    """MEMO-18."""
    broker = make()
    new_worker(broker, token(1), "echo")
    broker.receive(token(2), [job("mmi.service", b"echo")], 0.1, NNG)
    broker.receive(token(3), [job("mmi.service", b"nope")], 0.1, NNG)
    got = replies(broker)
    assert got[token(2)] == Memo01Message(T, b"", b"200")
    assert got[token(3)] == Memo01Message(T, b"", b"404")


# -- duplicates and resends ---------------------------------------------------------------------


def test_memo_16_identical_job_while_outstanding_runs_once_every_context_gets_result() -> None:
    """MEMO-16."""
    broker = make()
    new_worker(broker, token(1), "svc")
    new_worker(broker, token(2), "svc")
    broker.receive(token(5), [job("svc", b"same")], 0.1, NNG)
    broker.receive(token(6), [job("svc", b"same")], 0.2, NNG)  # NNG's resend
    got = replies(broker)
    assert list(got) == [token(1)]  # one worker got it; the other still waits
    ident = got[token(1)].id  # type: ignore[union-attr]
    broker.receive(token(7), [encode(T, ident, b"R")], 0.3, NNG)
    got = replies(broker)
    assert got[token(5)] == got[token(6)] == Memo01Message(T, b"", b"R")
    broker.receive(token(8), [job("svc", b"same")], 0.4, NNG)  # done: a new job runs
    assert token(2) in replies(broker)


def test_a_finished_jobs_route_is_forgotten_not_kept_idle() -> None:
    """A memo01 job's key names that job alone (an NNG token is never used again), so when the
    job is over its route goes; only peers' routes are kept idle for their next request
    (REQREP-06). Kept idle, every job's route stayed until 4,096 of them filled the bound: about
    3 MiB of the broker's RSS after a flood (issue 27)."""
    broker = make()
    new_worker(broker, token(1), "svc")
    ident = worker_id(broker)
    replies(broker)
    base_idle, base_keys = broker.idle(), broker.keys()
    held = token(1)
    for n in range(20):
        client = token(100 + n, pipe=2)
        broker.receive(client, [job("svc", b"%d" % n)], 0.1 + n / 100, NNG)
        got = replies(broker)
        assert got[held] == Memo01Message(J, ident, b"%d" % n, service="svc", timeout_ms=5000)
        held = token(200 + n)
        broker.receive(held, [encode(T, ident, b"R%d" % n)], 0.105 + n / 100, NNG)
        assert replies(broker) == {client: Memo01Message(T, b"", b"R%d" % n)}
        assert (broker.idle(), broker.keys()) == (base_idle, base_keys), n


def test_memo_17_newer_message_supersedes_the_held_context() -> None:
    """MEMO-17."""
    broker = make()
    new_worker(broker, token(1), "svc")
    broker.receive(token(2), [ready("svc")], 0.5, NNG)  # another worker: not a resend
    assert len(broker.memo_workers()) == 2
    assert replies(broker) == {}
    ident = next(iter(broker.memo_workers()))
    broker.receive(token(3), [encode(H, ident)], 0.6, NNG)
    broker.receive(token(4), [encode(H, ident)], 0.7, NNG)  # NNG resent its HEARTBEAT
    # Each newer request releases the older context (its reply would be discarded by NNG).
    assert replies(broker) == {token(1): None, token(3): None}
    broker.receive(b"C", [C02, b"\x01", b"svc", b"x"], 0.8)
    assert token(4) in replies(broker)


def test_memo_17_lost_job_is_sent_again_on_a_new_pipe() -> None:
    """MEMO-17."""
    broker = make()
    new_worker(broker, token(1, pipe=1), "svc")
    ident = worker_id(broker)
    broker.receive(b"C", [C02, b"\x01", b"svc", b"x"], 0.1)
    job_sent = replies(broker)[token(1, pipe=1)]
    broker.receive(token(2, pipe=1), [encode(T, ident, b"r1")], 0.2, NNG)
    out(broker)
    broker.receive(b"D", [C02, b"\x01", b"svc", b"y"], 0.3)
    second = replies(broker)[token(2, pipe=1)]
    assert second is not None
    assert second.payload == b"y"
    assert job_sent is not None
    # The pipe broke before the JOB arrived; NNG resends the RESULT on the new pipe.
    broker.receive(token(3, pipe=2), [encode(T, ident, b"r1")], 0.4, NNG)
    assert replies(broker) == {token(3, pipe=2): second}  # its JOB again, no second FINAL
    # On the same pipe the same bytes are a genuine RESULT of the new job.
    broker.receive(token(4, pipe=2), [encode(T, ident, b"r1")], 0.5, NNG)
    assert (0, b"D", (C02, b"\x03", b"svc", b"r1")) in out(broker)


# -- shutdown, back-pressure, mapping -----------------------------------------------------------


def test_memo_19_shutdown_disconnects_held_workers_and_releases_clients() -> None:
    """MEMO-19."""
    broker = make()
    new_worker(broker, token(1), "a", "b")
    ident = worker_id(broker)
    broker.receive(token(2), [job("none")], 0.1, NNG)
    broker.shutdown(0.2)
    assert replies(broker) == {token(1): Memo01Message(D, ident), token(2): None}


def test_memo_19_congested_job_send_drops_the_worker_and_redispatches() -> None:
    """MEMO-19."""
    broker = make()
    new_worker(broker, token(1), "svc")
    new_worker(broker, token(2), "svc")
    broker.receive(b"C", [C02, b"\x01", b"svc", b"x"], 0.1)
    sent = broker.take_outgoing()
    assert [p for _, p, _ in sent] == [token(1)]
    broker.peer_congested(token(1), 0.1, NNG, unsent=0)
    assert len(broker.memo_workers()) == 1
    assert replies(broker)[token(2)].payload == b"x"  # type: ignore[union-attr]


def test_memo_20_payload_frames_mapping() -> None:
    """MEMO-20."""
    assert payload_to_body(b"") == (b"",)
    assert payload_to_body(b"\x82\x00\x01") == (b"\x82\x00\x01",)
    assert body_to_payload([b"one"]) == b"one"
    assert body_to_payload([b"a", b"bc"]) == cbor2.dumps([b"a", b"bc"], canonical=True)
    assert body_to_payload([]) == b"\x80"
    broker = make()
    broker.receive(b"W", [W02, b"\x01", b"svc"], 0.0)
    broker.receive(token(1), [job("svc", b"\x01\x02")], 0.1, NNG)
    ((_, _, frames),) = out(broker)
    assert frames[4:] == (b"\x01\x02",)
    broker.receive(b"W", [W02, b"\x04", frames[2], b"", b"x", b"yz"], 0.2)
    assert replies(broker)[token(1)] == Memo01Message(T, b"", cbor2.dumps([b"x", b"yz"]))


def test_events_name_the_memo01_peers_by_core_key() -> None:
    broker = make()
    events: list[BrokerEvent] = []
    events += broker.receive(token(1), [ready("svc")], 0.0, NNG)
    events += broker.receive(token(2), [job("svc")], 0.1, NNG)
    kinds = [type(e) for e in events]
    assert kinds == [WorkerRegistered, type(events[1]), RequestDispatched]


def test_memo_21_memo01_on_connection_0_beside_zeromq_peers() -> None:
    """MEMO-21: the NNG endpoint may be the first bind (connection 0): its peers are keyed by
    the layer's routing ids, ZeroMQ peers on connection 1 by the family's keys."""
    broker = Memo01Broker(CONFIG, memo_connections={0}, memo=Memo01Config(epoch=EPOCH))
    broker.receive(token(1), [ready("svc")], 0.0, 0)
    broker.receive(b"C", [C02, b"\x01", b"svc", b"hi"], 0.1, 1)
    (sent,) = broker.take_outgoing()
    broker.flushed()
    assert sent[:2] == (0, token(1))
    ident = parse(bytes(sent[2][0]), from_broker=True).id
    broker.receive(token(2), [encode(T, ident, b"HI")], 0.2, 0)
    assert out(broker) == [(1, b"C", (C02, b"\x03", b"svc", b"HI"))]


def test_memo_03_reserved_service_name_is_refused_with_disconnect() -> None:
    """MEMO-03, MDP-D-14: a READY for mmi.* is refused as the core refuses an MDP worker's:
    the worker is answered DISCONNECT and forgotten."""
    broker = make()
    events = broker.receive(token(1), [ready("mmi.x")], 0.0, NNG)
    assert any(isinstance(e, ProtocolViolation) and e.rule == "MDP-D-14" for e in events)
    answer = replies(broker)[token(1)]
    assert answer is not None
    assert answer.type is D
    assert broker.memo_workers() == {}


def test_memo_22_a_refused_job_is_not_kept_and_its_resend_is_served() -> None:
    """MEMO-22: a JOB the core refuses (over max_held_bytes, MDP-D-26) leaves nothing behind:
    its context is released, no job is counted, and NNG's resend of it, once there is room,
    is a job afresh that runs (it was joined to the dead entry before and never served)."""
    config = BrokerConfig(
        heartbeat_interval=1.0,
        liveness=3,
        request_expiry=10.0,
        max_message_bytes=100,
        max_held_bytes=100 + REQUEST_OVERHEAD,  # the least: one JOB of 80 bytes, not two
        max_peer_bytes=400,
        max_pending_bytes=100,
    )
    broker = Memo01Broker(config, memo_connections={NNG}, memo=Memo01Config(epoch=EPOCH))
    broker.receive(token(1), [job("svc", b"a" * 80)], 0.0, NNG)  # held: 80 + REQUEST_OVERHEAD
    events = broker.receive(token(2), [job("svc", b"b" * 80)], 0.1, NNG)
    assert [(type(e).__name__, getattr(e, "rule", None)) for e in events] == [
        ("RequestRefused", "MDP-D-26")
    ]
    assert broker.memo_jobs() == 1
    assert replies(broker) == {token(2): None}  # released, no reply (MEMO-18)
    new_worker(broker, token(3), "svc", now=0.2)
    [(_, ident)] = [(t, m.id) for t, m in replies(broker).items() if m is not None]
    broker.receive(token(4), [encode(T, ident, b"A")], 0.3, NNG)
    assert replies(broker)[token(1)] == Memo01Message(T, b"", b"A")
    broker.receive(token(5), [job("svc", b"b" * 80)], 0.4, NNG)  # the resend: room now
    assert broker.memo_jobs() == 1
    got = replies(broker)
    assert got[token(4)].payload == b"b" * 80  # type: ignore[union-attr]  # sent to the worker
    broker.receive(token(6), [encode(T, ident, b"B")], 0.5, NNG)
    assert replies(broker)[token(5)] == Memo01Message(T, b"", b"B")
    assert broker.memo_jobs() == 0


def test_memo_23_a_busy_workers_pipe_closing_sends_its_job_to_the_next_at_once() -> None:
    """MEMO-23: the runtime says an NNG pipe closed (a message of no frames from it): the
    busy worker whose JOB went out on it is gone, and its job goes to the other worker at
    once, long before the job's 60 s timeout (it waited for that timeout before)."""
    broker = make()
    new_worker(broker, token(1, pipe=7), "echo")
    new_worker(broker, token(2, pipe=8), "echo", now=0.05)
    broker.receive(b"C", [C02, b"\x01", b"echo", b"hi"], 0.1)
    assert list(replies(broker)) == [token(1, pipe=7)]  # the JOB went out on pipe 7
    broker.receive((9).to_bytes(8, "big"), [], 0.15, NNG)  # another pipe: nothing happens
    assert replies(broker) == {}
    events = broker.receive((7).to_bytes(8, "big"), [], 0.2, NNG)
    assert any(isinstance(e, WorkerDisconnected) for e in events)
    got = replies(broker)
    assert got[token(2, pipe=8)].payload == b"hi"  # type: ignore[union-attr]  # MDP-D-08
    assert len(broker.memo_workers()) == 1
