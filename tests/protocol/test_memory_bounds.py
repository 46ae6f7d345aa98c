"""The broker's byte bounds (MDP-D-25, MDP-D-26, MDP-D-27), through the sans-IO core.

Each test drives a real ``Broker`` and checks the outbox and the events after every step: a
request over a bound is refused with the rule named and nothing held; an accepted request still
ends in exactly one outcome (MDP-D-24) and gives its bytes back when it ends.
"""

from __future__ import annotations

import sys

import pytest

from domo.protocol.broker import REQUEST_OVERHEAD, Broker, BrokerConfig
from domo.protocol.events import (
    BrokerEvent,
    MessageDropped,
    PartialForwarded,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    RequestRefused,
)
from domo.protocol.family import FamilyBroker

W = b"MDPW02"
C = b"MDPC02"
KIB = 1024


def _broker(**limits: int) -> Broker:
    config = BrokerConfig(heartbeat_interval=1.0, request_expiry=5.0, **limits)
    return Broker(config)


def _request(broker: Broker, client: bytes, size: int, now: float) -> list[BrokerEvent]:
    return broker.receive(client, [C, b"\x01", b"echo", b"x" * size], now)


def _ready(broker: Broker, worker: bytes, now: float) -> None:
    broker.receive(worker, [W, b"\x01", b"echo"], now)
    assert broker.take_outgoing() == []


def test_a_request_over_max_message_bytes_is_refused_and_nothing_held() -> None:
    """MDP-D-25: refused, with the rule and the size; the client's state does not change."""
    broker = _broker(max_message_bytes=10 * KIB, max_held_bytes=100 * KIB, max_peer_bytes=40 * KIB)
    _ready(broker, b"W1", 0.0)
    events = _request(broker, b"C1", 10 * KIB + 1, 0.1)
    assert events == [RequestRefused(b"C1", b"echo", "too-large", 10 * KIB + 1, 0, "MDP-D-25", 0.1)]
    assert broker.take_outgoing() == []  # not dispatched, nothing sent
    assert broker.requests() == []
    assert broker.held_bytes() == 0
    # Exactly at the bound is accepted, and the client may send it at once (no outstanding).
    events = _request(broker, b"C1", 10 * KIB, 0.2)
    assert [type(e) for e in events] == [RequestQueued, RequestDispatched]
    assert broker.held_bytes() == 10 * KIB + REQUEST_OVERHEAD
    [(peer, _)] = broker.take_outgoing()
    assert peer == b"W1"


def test_the_body_is_summed_over_its_frames() -> None:
    """MDP-D-25 counts the body, every frame of it."""
    broker = _broker(max_message_bytes=10 * KIB, max_held_bytes=100 * KIB, max_peer_bytes=40 * KIB)
    frames = [C, b"\x01", b"echo", b"a" * (6 * KIB), b"b" * (6 * KIB)]
    [refused] = broker.receive(b"C1", frames, 0.0)
    assert isinstance(refused, RequestRefused)
    assert (refused.reason, refused.size, refused.rule) == ("too-large", 12 * KIB, "MDP-D-25")


def test_requests_over_max_held_bytes_are_refused_until_one_ends() -> None:
    """MDP-D-26: the queued requests, each its body plus ``REQUEST_OVERHEAD``, never pass
    max_held_bytes; a refusal names the bytes held; a request that ends (completed, expired,
    dropped) gives its bytes back."""
    overhead = REQUEST_OVERHEAD
    broker = _broker(
        max_message_bytes=40 * KIB,
        max_held_bytes=100 * KIB + 4 * overhead,
        max_peer_bytes=160 * KIB,
    )
    for index in range(3):  # no worker: they wait in the queue
        events = _request(broker, b"C%d" % index, 30 * KIB, 0.1)
        assert [type(e) for e in events] == [RequestQueued]
    assert broker.held_bytes() == 90 * KIB + 3 * overhead
    events = _request(broker, b"C3", 30 * KIB, 0.2)
    assert events == [
        RequestRefused(
            b"C3", b"echo", "broker-full", 30 * KIB, 90 * KIB + 3 * overhead, "MDP-D-26", 0.2
        )
    ]
    assert broker.queued(b"echo") == 3
    assert broker.held_bytes() == 90 * KIB + 3 * overhead
    # A smaller one still fits, exactly.
    assert [type(e) for e in _request(broker, b"C4", 10 * KIB, 0.3)] == [RequestQueued]
    assert broker.held_bytes() == 100 * KIB + 4 * overhead
    assert isinstance(_request(broker, b"C3", 1, 0.3)[0], RequestRefused)

    # A worker takes C0's request and answers: completed, 30 KiB and its overhead given back.
    broker.receive(b"W1", [W, b"\x01", b"echo"], 1.0)  # READY: C0's is dispatched at once
    [(worker, frames)] = broker.take_outgoing()
    assert worker == b"W1"
    assert frames[2] == b"C0"
    assert broker.held_bytes() == 100 * KIB + 4 * overhead  # dispatched: still held
    broker.receive(b"W1", [W, b"\x04", b"C0", b"", b"ok"], 1.1)  # FINAL; C1's goes out next
    assert broker.held_bytes() == 70 * KIB + 3 * overhead
    out = broker.take_outgoing()
    assert [peer for peer, _ in out] == [b"C0", b"W1"]
    [completed] = broker.flushed()
    assert isinstance(completed, RequestCompleted)
    assert completed.client == b"C0"
    assert [type(e) for e in _request(broker, b"C3", 30 * KIB, 1.2)] == [RequestQueued]
    assert broker.held_bytes() == 100 * KIB + 4 * overhead

    # Expiry gives the bytes back too (C2, C4 and C3 wait; C1 is with the worker).
    events = broker.receive(b"W1", [W, b"\x05"], 3.0)  # HEARTBEATs: the worker stays alive
    events += broker.receive(b"W1", [W, b"\x05"], 5.5)
    events += broker.tick(6.5)
    assert sorted(e.client for e in events if isinstance(e, RequestExpired)) == [
        b"C2",
        b"C3",
        b"C4",
    ]
    assert broker.held_bytes() == 30 * KIB + overhead
    # And a drop: the worker is lost after a PARTIAL (MDP-D-09).
    broker.receive(b"W1", [W, b"\x03", b"C1", b"", b"part"], 6.6)
    broker.receive(b"W1", [W, b"\x06"], 6.7)
    assert broker.held_bytes() == 0
    assert broker.requests() == []


def test_a_flood_of_tiny_requests_is_bounded_by_what_each_request_costs() -> None:
    """MDP-D-26: each accepted request counts its body plus ``REQUEST_OVERHEAD``, so requests
    of 1-byte and empty bodies from many clients are refused ``broker-full`` once
    ``n * (body + REQUEST_OVERHEAD)`` would pass max_held_bytes: a flood of them is bounded in
    what it really costs the broker (the bodies alone would let 65,536 in, not 31)."""
    broker = _broker(max_message_bytes=KIB, max_held_bytes=64 * KIB, max_peer_bytes=4 * KIB)
    cost = 1 + REQUEST_OVERHEAD
    fits = 64 * KIB // cost
    assert fits == 31
    for index in range(fits):  # no worker: they all wait
        events = _request(broker, b"C%d" % index, 1, 0.1)
        assert [type(e) for e in events] == [RequestQueued]
    assert broker.held_bytes() == fits * cost == 63519
    held = broker.held_bytes()
    assert _request(broker, b"D1", 1, 0.2) == [
        RequestRefused(b"D1", b"echo", "broker-full", 1, held, "MDP-D-26", 0.2)
    ]
    # An empty body still costs REQUEST_OVERHEAD: 63,519 + 2,048 is over 65,536 too.
    assert _request(broker, b"D2", 0, 0.2) == [
        RequestRefused(b"D2", b"echo", "broker-full", 0, held, "MDP-D-26", 0.2)
    ]
    assert broker.queued(b"echo") == fits
    assert broker.held_bytes() == fits * cost
    # They expire (request_expiry, 5 s): every byte counted is given back, and room is made.
    events = broker.tick(5.2)
    assert len([e for e in events if isinstance(e, RequestExpired)]) == fits
    assert broker.held_bytes() == 0
    assert broker.requests() == []
    assert [type(e) for e in _request(broker, b"D2", 0, 5.3)] == [RequestQueued]
    assert broker.held_bytes() == REQUEST_OVERHEAD


def test_a_final_over_max_message_bytes_is_not_relayed() -> None:
    """MDP-D-25: the request is dropped with the rule; the worker is idle and takes the next."""
    broker = _broker(max_message_bytes=10 * KIB, max_held_bytes=100 * KIB, max_peer_bytes=40 * KIB)
    _ready(broker, b"W1", 0.0)
    _request(broker, b"C1", 10, 0.1)
    _request(broker, b"C2", 10, 0.1)
    [(_, frames)] = broker.take_outgoing()
    assert frames[2] == b"C1"
    events = broker.receive(b"W1", [W, b"\x04", b"C1", b"", b"y" * (10 * KIB + 1)], 0.2)
    dropped = [e for e in events if isinstance(e, RequestDropped)]
    assert [(e.client, e.reason, e.worker, e.rule) for e in dropped] == [
        (b"C1", "final-too-large", b"W1", "MDP-D-25")
    ]
    # Nothing to C1; C2's request goes to the same worker, still registered.
    out = broker.take_outgoing()
    assert [(peer, frames[2]) for peer, frames in out] == [(b"W1", b"C2")]
    assert broker.flushed() == []
    assert broker.held_bytes() == 10 + REQUEST_OVERHEAD  # C2's, with its worker
    assert b"W1" in broker.workers()


def test_a_partial_over_max_message_bytes_ends_the_request_and_the_worker_finishes() -> None:
    """MDP-D-25: a PARTIAL too large drops its request; the worker's later replies for it are
    dropped, its FINAL makes it idle again, and nothing reaches the client."""
    broker = _broker(max_message_bytes=10 * KIB, max_held_bytes=100 * KIB, max_peer_bytes=40 * KIB)
    _ready(broker, b"W1", 0.0)
    _request(broker, b"C1", 10, 0.1)
    broker.take_outgoing()
    events = broker.receive(b"W1", [W, b"\x03", b"C1", b"", b"ok"], 0.2)
    assert [type(e) for e in events] == [PartialForwarded]
    [(peer, _)] = broker.take_outgoing()
    assert peer == b"C1"
    events = broker.receive(b"W1", [W, b"\x03", b"C1", b"", b"z" * (11 * KIB)], 0.3)
    assert [(type(e), getattr(e, "reason", None), getattr(e, "rule", None)) for e in events] == [
        (RequestDropped, "partial-too-large", "MDP-D-25")
    ]
    assert broker.take_outgoing() == []
    events = broker.receive(b"W1", [W, b"\x04", b"C1", b"", b"done"], 0.4)
    assert [type(e) for e in events] == [MessageDropped]
    assert broker.take_outgoing() == []
    assert broker.held_bytes() == 0
    # The worker is idle: the client's next request goes to it.
    _request(broker, b"C1", 10, 0.5)
    [(peer, _)] = broker.take_outgoing()
    assert peer == b"W1"


def test_the_family_broker_applies_the_same_bounds_to_other_dialects() -> None:
    """MDP-D-25 and MDP-D-26 through FamilyBroker, for an MDP/0.1 REQ client too."""
    config = BrokerConfig(
        max_message_bytes=10 * KIB, max_held_bytes=15 * KIB, max_peer_bytes=40 * KIB
    )
    broker = FamilyBroker(config)
    big = [b"", b"MDPC01", b"echo", b"x" * (10 * KIB + 1)]
    [refused] = broker.receive(b"R1", big, 0.0)
    assert isinstance(refused, RequestRefused)
    assert refused.rule == "MDP-D-25"
    [queued] = broker.receive(b"R2", [b"", b"MDPC01", b"echo", b"x" * (10 * KIB)], 0.1)
    assert isinstance(queued, RequestQueued)
    [refused] = broker.receive(b"R3", [b"", b"MDPC01", b"echo", b"x" * (6 * KIB)], 0.2)
    assert isinstance(refused, RequestRefused)
    assert refused.rule == "MDP-D-26"
    assert broker.take_outgoing() == []
    broker.flushed()
    assert broker.keys() == 1  # the refused clients left nothing behind (R2 waits)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_message_bytes": 0}, "max_message_bytes must be >= 1"),
        ({"max_message_bytes": 10, "max_held_bytes": 9}, "max_held_bytes"),
        (
            {"max_message_bytes": 10, "max_held_bytes": 10 + REQUEST_OVERHEAD - 1},
            r"max_held_bytes \(2057\) must be >= max_message_bytes \(10\) \+ REQUEST_OVERHEAD "
            r"\(2048\), that is 2058",
        ),
        ({"max_message_bytes": 10, "max_peer_bytes": 9}, "max_peer_bytes"),
        ({"max_message_bytes": 10, "max_peer_bytes": 39}, r"at least 4 x max_message_bytes"),
        ({"max_message_bytes": 10, "max_pending_bytes": 9}, "max_pending_bytes"),
    ],
)
def test_limits_that_cannot_hold_one_message_are_refused(
    limits: dict[str, int], message: str
) -> None:
    """MDP-D-25..27, MDP-D-30; MDP-D-32: a pipe must hold at least four of the largest
    messages; MDP-D-26: the held bytes at least one request of the largest size, overhead
    included."""
    with pytest.raises(ValueError, match=message):
        BrokerConfig(**limits)


def test_pipe_messages_is_the_peer_bound_over_the_largest_message() -> None:
    """MDP-D-27: the high-water mark a runtime gives each pipe; defaults 64 MiB / 4 MiB."""
    assert BrokerConfig().pipe_messages == 16
    held = 1000 + REQUEST_OVERHEAD  # the least max_held_bytes (MDP-D-26)
    config = BrokerConfig(max_message_bytes=1000, max_peer_bytes=4999, max_held_bytes=held)
    assert config.pipe_messages == 4
    least = BrokerConfig(max_message_bytes=1000, max_peer_bytes=4000, max_held_bytes=held)
    assert least.pipe_messages == 4  # MDP-D-32: the fewest allowed


def test_a_request_that_waited_does_not_outlive_its_end() -> None:
    """MDP-D-26: the bytes counted are the bytes held. A request that waited in its queue left a
    timer entry behind when it was dispatched; that entry must not keep its body alive for
    ``request_expiry`` (it did: ~500 bytes a request, and the whole body, for 60 s), and the
    stale entries are dropped as they pile up (the heap stays within twice its live entries)."""
    broker = _broker(max_message_bytes=10 * KIB, max_held_bytes=100 * KIB, max_peer_bytes=40 * KIB)
    _ready(broker, b"W1", 0.0)
    bodies = [b"%d" % n + b"b" * 1000 for n in range(3000)]
    baseline = [sys.getrefcount(body) for body in bodies]
    now = 0.0
    for start in range(0, len(bodies), 3):
        for offset, body in enumerate(bodies[start : start + 3]):  # one dispatched, two wait
            now += 0.001
            broker.receive(b"C%d" % offset, [C, b"\x01", b"echo", body], now)
        out = broker.take_outgoing()
        for _ in range(3):
            [client] = [frames[2] for peer, frames in out if peer == b"W1"]
            now += 0.001
            broker.receive(b"W1", [W, b"\x05"], now)  # the worker stays alive
            broker.receive(b"W1", [W, b"\x04", client, b"", b"ok"], now)
            out = broker.take_outgoing()
            assert len(broker.flushed()) == 1
        assert len(broker._timers) <= 1024 + 4  # stale entries dropped: 2,000 without
    del out, body
    assert broker.requests() == []
    assert broker.held_bytes() == 0
    assert [sys.getrefcount(body) for body in bodies] == baseline


def test_a_client_whose_pipe_was_full_is_refused_for_a_while() -> None:
    """MDP-D-29: after ``peer_congested`` a client's REQUESTs are refused (with the rule) for
    liveness x interval, its mmi.* requests still answered, other clients untouched; then it is
    served again. The table of such clients is forgotten as they expire."""
    broker = _broker(max_message_bytes=10 * KIB, max_held_bytes=100 * KIB, max_peer_bytes=40 * KIB)
    _ready(broker, b"W1", 0.0)
    _request(broker, b"C1", 10, 0.1)
    [(worker, _)] = broker.take_outgoing()
    assert worker == b"W1"
    broker.receive(b"W1", [W, b"\x04", b"C1", b"", b"ok"], 0.2)
    [(peer, _)] = broker.take_outgoing()
    assert peer == b"C1"
    events = broker.peer_congested(b"C1", 0.2, unsent=0)  # its FINAL did not fit
    assert [(type(e), getattr(e, "reason", None)) for e in events] == [
        (RequestDropped, "client-congested")
    ]
    assert broker.flushed() == []
    events = _request(broker, b"C1", 10, 0.3)
    assert events == [RequestRefused(b"C1", b"echo", "client-congested", 10, 0, "MDP-D-29", 0.3)]
    assert broker.take_outgoing() == []
    mmi = broker.receive(b"C1", [C, b"\x01", b"mmi.service", b"echo"], 0.4)
    assert [type(e).__name__ for e in mmi] == ["MmiReplied"]
    broker.take_outgoing()
    broker.flushed()
    assert [type(e) for e in _request(broker, b"C2", 10, 0.5)] == [RequestQueued, RequestDispatched]
    broker.take_outgoing()
    broker.receive(b"W1", [W, b"\x04", b"C2", b"", b"ok"], 0.6)
    broker.take_outgoing()
    broker.flushed()
    # Just before liveness x interval (3 s) it is still refused; at it, served.
    assert isinstance(_request(broker, b"C1", 10, 3.1999)[0], RequestRefused)
    assert [type(e) for e in _request(broker, b"C1", 10, 3.2)] == [
        RequestQueued,
        RequestDispatched,
    ]
    assert broker._congested == {}


def test_the_table_of_congested_clients_stays_bounded() -> None:
    """MDP-D-29's memory: clients whose time is up are forgotten as new ones come."""
    broker = _broker()
    for index in range(5000):
        broker.peer_congested(b"C%d" % index, index * 0.01)
    assert len(broker._congested) <= 2 * 301 + 1024  # those of the last 3 s, and the slack


def test_only_a_worker_that_is_no_client_is_left_out_of_the_pending_count() -> None:
    """MDP-D-30: a runtime leaves a message out of the pending bytes only if its peer is a
    registered worker holding nothing as a client (MDP-A-02); a client, an unknown peer, a peer
    on another connection, and a worker with a request of its own in flight are counted."""
    broker = FamilyBroker(BrokerConfig(heartbeat_interval=1.0))
    assert not broker.only_serves(b"W1")
    broker.receive(b"W1", [W, b"\x01", b"echo"], 0.0)
    assert broker.only_serves(b"W1")
    assert not broker.only_serves(b"W1", connection=1)
    broker.receive(b"C1", [C, b"\x01", b"echo", b"hi"], 0.1)
    assert not broker.only_serves(b"C1")
    assert broker.only_serves(b"W1")  # busy with C1's request, still only a worker
    [(_, peer, frames)] = broker.take_outgoing()
    assert peer == b"W1"
    assert list(frames[:2]) == [W, b"\x02"]  # the REQUEST, sent while W1 is only a worker
    broker.flushed()
    broker.receive(b"W1", [C, b"\x01", b"echo", b"mine"], 0.2)  # W1 asks too (MDP-A-02)
    assert not broker.only_serves(b"W1")
