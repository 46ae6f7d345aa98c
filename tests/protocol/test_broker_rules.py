"""Scenario tests for broker rules that a random walk reaches rarely, each naming its rule.

Every test drives a real ``Broker`` through its public API and checks the whole outbox after
every step (``Run.step`` drains it), so a message that should not have been sent fails the test
where it happens, not at the end.
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from random import Random
from types import FrameType
from typing import Any

import pytest

from domo.protocol.broker import Broker, BrokerConfig, PeerState
from domo.protocol.dispatch import RequestState
from domo.protocol.errors import LocalProtocolError
from domo.protocol.events import (
    BrokerEvent,
    MessageDropped,
    MmiReplied,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    RequestRedispatched,
    WorkerDisconnected,
    WorkerExpired,
)

from .mdp_strategies import plain

W = b"MDPW02"
C = b"MDPC02"
HEARTBEAT = (W, b"\x05")
DISCONNECT = (W, b"\x06")
INTERVAL = 1.0
SPAN = 3.0

Message = tuple[bytes, tuple[bytes, ...]]


def before(t: float) -> float:
    """The float just before ``t``: a boundary must not be crossed a hair early."""
    return math.nextafter(t, -math.inf)


class Run:
    """A broker and helpers that speak for its peers; ``out()`` drains the outbox."""

    def __init__(self, **config: Any) -> None:
        settings: dict[str, Any] = {
            "heartbeat_interval": INTERVAL,
            "liveness": 3,
            "request_expiry": 10.0,
        }
        settings.update(config)
        self.broker = Broker(BrokerConfig(**settings))
        self.counter = 0

    def body(self, n: int = 1) -> tuple[bytes, ...]:
        """Fresh body frames: distinct objects, so identity is checked (MDP-S-03)."""
        self.counter += 1
        return tuple(f"frame-{self.counter}-{i}".encode() for i in range(n))

    def out(self) -> list[Message]:
        return [(peer, plain(frames)) for peer, frames in self.broker.take_outgoing()]

    def send(self, peer: bytes, frames: tuple[bytes, ...], now: float) -> list[BrokerEvent]:
        return self.broker.receive(peer, list(frames), now)

    def ready(self, peer: bytes, service: bytes, now: float) -> list[BrokerEvent]:
        return self.send(peer, (W, b"\x01", service), now)

    def heartbeat(self, peer: bytes, now: float) -> list[BrokerEvent]:
        return self.send(peer, HEARTBEAT, now)

    def disconnect(self, peer: bytes, now: float) -> list[BrokerEvent]:
        return self.send(peer, DISCONNECT, now)

    def request(self, client: bytes, service: bytes, now: float, n: int = 1) -> tuple[bytes, ...]:
        body = self.body(n)
        self.send(client, (C, b"\x01", service, *body), now)
        return body

    def reply(
        self, worker: bytes, code: bytes, client: bytes, now: float
    ) -> tuple[tuple[bytes, ...], list[BrokerEvent]]:
        body = self.body()
        return body, self.send(worker, (W, code, client, b"", *body), now)

    def partial(self, worker: bytes, client: bytes, now: float) -> tuple[bytes, ...]:
        return self.reply(worker, b"\x03", client, now)[0]

    def final(self, worker: bytes, client: bytes, now: float) -> tuple[bytes, ...]:
        return self.reply(worker, b"\x04", client, now)[0]


def to_worker(client: bytes, body: tuple[bytes, ...]) -> tuple[bytes, ...]:
    return (W, b"\x02", client, b"", *body)


def to_client(code: bytes, service: bytes, body: tuple[bytes, ...]) -> tuple[bytes, ...]:
    return (C, code, service, *body)


def same_objects(sent: tuple[bytes, ...], body: tuple[bytes, ...]) -> bool:
    return len(sent) == len(body) and all(a is b for a, b in zip(sent, body, strict=True))


def of(kind: type, events: list[BrokerEvent]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


# --- the mmi. namespace ------------------------------------------------------------------------


def test_mmi_service_exact_match_200_404() -> None:
    """MDP-M-01: 200 only for a service served by exactly that name, idle or busy; else 404."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    cases = [
        (b"echo", b"200"),
        (b"ech", b"404"),
        (b"echo2", b"404"),
        (b"ECHO", b"404"),
        (b"echo ", b"404"),
        (b"nobody", b"404"),
    ]
    for query, status in cases:
        events = run.send(b"C1", (C, b"\x01", b"mmi.service", query), 0.1)
        assert run.out() == [(b"C1", to_client(b"\x03", b"mmi.service", (status,)))], query
        assert [(e.query, e.status) for e in of(MmiReplied, events)] == [(query, status)]
    # Busy counts as serving; only the first body frame is the query.
    run.request(b"C2", b"echo", 0.2)
    assert run.out()[0][0] == b"W1"
    run.send(b"C1", (C, b"\x01", b"mmi.service", b"echo", b"ignored"), 0.3)
    assert run.out() == [(b"C1", to_client(b"\x03", b"mmi.service", (b"200",)))]
    # Once the last worker is gone, the service is unknown again.
    run.disconnect(b"W1", 0.4)
    run.send(b"C1", (C, b"\x01", b"mmi.service", b"echo"), 0.5)
    assert run.out() == [(b"C1", to_client(b"\x03", b"mmi.service", (b"404",)))]


def test_mmi_query_in_a_view_is_matched_by_its_bytes() -> None:
    """MDP-M-01: the query is a body frame, so it may come as a view (MDP-S-03), even of a
    writable buffer, which cannot be hashed; it is matched by its bytes, and the broker never
    raises on what a remote peer sent."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    for query, status in ((b"echo", b"200"), (b"nobody", b"404")):
        view = memoryview(bytearray(query))
        try:
            run.send(b"C1", (C, b"\x01", b"mmi.service", view), 0.1)  # type: ignore[arg-type]
        except Exception as error:
            pytest.fail(f"the broker raised {error!r} on an mmi.service query given as a view")
        assert run.out() == [(b"C1", to_client(b"\x03", b"mmi.service", (status,)))], query


def test_mmi_other_501_and_never_outstanding() -> None:
    """MDP-M-02: any other mmi.* is 501. MDP-D-21: an mmi request never becomes the client's
    outstanding request, so the next REQUEST is accepted. Only the exact prefix is reserved."""
    run = Run()
    for service in (b"mmi.other", b"mmi.", b"mmi.service.x"):
        events = run.send(b"C1", (C, b"\x01", service, b"q"), 0.0)
        assert run.out() == [(b"C1", to_client(b"\x03", service, (b"501",)))]
        assert [e.status for e in of(MmiReplied, events)] == [b"501"]
        assert run.broker.requests() == []
    for service in (b"mmi", b"MMI.service", b"xmmi.service"):
        run.request(b"C1", service, 0.0)
        assert run.out() == []
        assert [r.service for r in run.broker.requests()] == [service]
        run.broker.peer_unreachable(b"C1", 0.0)  # give it up, free the client


def test_ready_for_reserved_name_is_refused() -> None:
    """MDP-D-14: READY for an mmi.* name gets DISCONNECT, and the name stays the broker's."""
    run = Run()
    events = run.ready(b"W1", b"mmi.service", 0.0)
    assert run.out() == [(b"W1", DISCONNECT)]
    assert [(e.rule, e.action) for e in of(ProtocolViolation, events)] == [
        ("MDP-D-14", "disconnected")
    ]
    assert run.broker.worker_state(b"W1") is PeerState.SILENCED
    assert run.broker.services() == {}
    run.send(b"C1", (C, b"\x01", b"mmi.service", b"mmi.service"), 0.1)
    assert run.out() == [(b"C1", to_client(b"\x03", b"mmi.service", (b"404",)))]


# --- queueing and expiry ----------------------------------------------------------------------


def test_request_for_unserved_service_queues_then_expires_at_boundary() -> None:
    """MDP-C-10: queued while nobody serves it. MDP-C-11, MDP-D-11: expires exactly at
    request_expiry, after which a new worker gets nothing; MDP-A-05: the service is forgotten."""
    run = Run(request_expiry=10.0)
    run.request(b"C1", b"nobody", 0.0)
    assert run.broker.queued(b"nobody") == 1
    assert run.broker.requests()[0].expires_at == 10.0
    assert run.broker.tick(before(10.0)) == []
    assert run.broker.queued(b"nobody") == 1
    events = run.broker.tick(10.0)
    assert [(e.client, e.waited) for e in of(RequestExpired, events)] == [(b"C1", 10.0)]
    assert len(events) == 1
    assert run.broker.requests() == []
    assert run.broker.services() == {}
    run.ready(b"W1", b"nobody", 10.0)
    assert run.out() == []
    # The client is free to ask again, and a worker is there now.
    body = run.request(b"C1", b"nobody", 10.5)
    assert run.out() == [(b"W1", to_worker(b"C1", body))]


def test_queued_request_dispatched_when_worker_arrives() -> None:
    """MDP-C-10, MDP-W-09: a waiting request goes to the first worker that registers."""
    run = Run()
    body = run.request(b"C1", b"echo", 0.0)
    assert run.out() == []
    run.ready(b"W1", b"echo", 5.0)
    out = run.out()
    assert out == [(b"W1", to_worker(b"C1", body))]
    assert same_objects(out[0][1][4:], body)


def test_request_expires_even_while_workers_are_busy_and_clock_restarts_on_requeue() -> None:
    """MDP-D-11: a request waiting behind a busy worker expires too; a re-queued request's
    expiry clock starts again."""
    run = Run(request_expiry=10.0)
    run.ready(b"W1", b"echo", 0.0)
    first = run.request(b"C1", b"echo", 0.0)
    assert run.out() == [(b"W1", to_worker(b"C1", first))]
    run.request(b"C2", b"echo", 1.0)  # waits behind C1's request
    assert run.out() == [(b"W1", HEARTBEAT)]
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0):
        run.heartbeat(b"W1", t)
        run.out()
    events = run.broker.tick(before(11.0))
    assert of(RequestExpired, events) == []
    events = run.broker.tick(11.0)
    assert [e.client for e in of(RequestExpired, events)] == [b"C2"]
    # C1's request goes back to the queue at 11.0 when W1 leaves: its clock restarts there.
    run.disconnect(b"W1", 11.0)
    assert [(r.client, r.expires_at) for r in run.broker.requests()] == [(b"C1", 21.0)]
    assert of(RequestExpired, run.broker.tick(before(21.0))) == []
    assert [e.client for e in of(RequestExpired, run.broker.tick(21.0))] == [b"C1"]


# --- re-dispatch ------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_redispatch_limit(limit: int) -> None:
    """MDP-D-08, MDP-S-01, MDP-D-22: a worker that says DISCONNECT while busy has its request
    resent to another worker, at most max_redispatches times; then the request is dropped."""
    run = Run(max_redispatches=limit)
    body = run.request(b"C1", b"echo", 0.0)
    for attempt in range(1, limit + 2):
        worker = f"W{attempt}".encode()
        run.ready(worker, b"echo", 0.0)
        out = run.out()
        assert out == [(worker, to_worker(b"C1", body))]
        assert same_objects(out[0][1][4:], body)
        events = run.disconnect(worker, 0.0)
        if attempt <= limit:
            assert [e.attempts for e in of(RequestRedispatched, events)] == [attempt]
            assert of(RequestDropped, events) == []
            assert run.broker.queued(b"echo") == 1
        else:
            dropped = of(RequestDropped, events)
            assert [(e.reason, e.worker) for e in dropped] == [("redispatch-limit", worker)]
            assert run.broker.requests() == []
    run.ready(b"late", b"echo", 0.0)
    assert run.out() == []


def test_requeue_goes_to_the_front() -> None:
    """MDP-D-08, MDP-A-03: a request whose worker is lost goes back before those that wait."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    first = run.request(b"C1", b"echo", 0.0)
    second = run.request(b"C2", b"echo", 0.1)
    third = run.request(b"C3", b"echo", 0.2)
    assert run.out() == [(b"W1", to_worker(b"C1", first))]
    run.disconnect(b"W1", 0.3)
    run.ready(b"W2", b"echo", 0.4)
    assert run.out() == [(b"W2", to_worker(b"C1", first))]
    run.final(b"W2", b"C1", 0.5)
    assert run.out()[1] == (b"W2", to_worker(b"C2", second))
    run.final(b"W2", b"C2", 0.6)
    assert run.out()[1] == (b"W2", to_worker(b"C3", third))


def test_no_redispatch_after_partial() -> None:
    """MDP-D-09: a request whose worker is lost after a PARTIAL was forwarded is dropped, not
    given to another worker, whether the worker left or expired."""
    for lose in ("disconnect", "expire"):
        run = Run()
        run.ready(b"W1", b"echo", 0.0)
        run.ready(b"W2", b"echo", 0.0)
        body = run.request(b"C1", b"echo", 0.0)
        assert run.out() == [(b"W1", to_worker(b"C1", body))]
        part = run.partial(b"W1", b"C1", 0.5)
        assert run.out() == [(b"C1", to_client(b"\x02", b"echo", part))]
        run.heartbeat(b"W2", 2.0)
        run.out()
        if lose == "disconnect":
            events = run.disconnect(b"W1", 2.0)
        else:
            events = run.broker.tick(3.5)  # W1 last heard at 0.5
            assert [e.worker for e in of(WorkerExpired, events)] == [b"W1"]
        assert [(e.reason, e.worker) for e in of(RequestDropped, events)] == [
            ("lost-after-partial", b"W1")
        ]
        assert [m for m in run.out() if m[1][1] == b"\x02"] == []
        assert run.broker.requests() == []


def test_late_final_from_expired_worker_is_never_forwarded() -> None:
    """MDP-D-10, MDP-C-06, MDP-H-07: W1 expires busy; its request goes to W2; W1's late FINAL is
    dropped, during its silence and after it; the client gets exactly one FINAL, W2's."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    body = run.request(b"C1", b"echo", 0.0)
    assert run.out() == [(b"W1", to_worker(b"C1", body))]
    run.ready(b"W2", b"echo", 2.5)
    assert run.out() == [(b"W1", HEARTBEAT)]  # due at 1.0, sent late, on W2's READY
    events = run.broker.tick(SPAN)
    assert [e.worker for e in of(WorkerExpired, events)] == [b"W1"]
    assert run.out() == [(b"W2", to_worker(b"C1", body))]
    _, events = run.reply(b"W1", b"\x04", b"C1", 3.1)
    assert run.out() == []
    assert [e.peer for e in of(MessageDropped, events)] == [b"W1"]
    reply = run.final(b"W2", b"C1", 3.2)
    assert run.out() == [(b"C1", to_client(b"\x03", b"echo", reply))]
    # Long after, W1's silence is over: a FINAL now is unexpected (DISCONNECT), not forwarded.
    run.heartbeat(b"W2", 5.0)
    run.broker.tick(6.5)
    run.out()
    assert run.broker.worker_state(b"W1") is PeerState.UNKNOWN
    _, events = run.reply(b"W1", b"\x04", b"C1", 6.6)
    assert run.out() == [(b"W1", DISCONNECT)]
    assert [e.rule for e in of(ProtocolViolation, events)] == ["MDP-W-15"]


def test_redispatch_on_expiry_never_goes_to_a_worker_dead_at_now() -> None:
    """MDP-H-07, MDP-D-04, MDP-D-08: when time jumps past several expiries, a lost request is
    not handed to a worker that is itself dead at that time (and the attempt is not used up)."""
    run = Run(max_redispatches=1)
    run.ready(b"A", b"echo", 0.0)
    run.ready(b"B", b"echo", 0.5)
    body = run.request(b"C1", b"echo", 0.6)
    assert run.out() == [(b"A", to_worker(b"C1", body))]
    run.heartbeat(b"A", 0.9)
    run.heartbeat(b"B", 0.9)
    events = run.broker.tick(10.0)
    assert run.out() == []
    assert sorted(e.worker for e in of(WorkerExpired, events)) == [b"A", b"B"]
    assert of(RequestDispatched, events) == []
    assert [(r.client, r.state, r.attempts) for r in run.broker.requests()] == [
        (b"C1", RequestState.QUEUED, 1)
    ]
    run.ready(b"C", b"echo", 10.0)
    assert run.out() == [(b"C", to_worker(b"C1", body))]


def test_requests_lost_together_requeue_in_acceptance_order() -> None:
    """MDP-D-08, MDP-A-03: requests whose workers expire in the same call go back to the front
    in the order they were accepted, whatever order their workers' timers were in."""
    run = Run()
    run.ready(b"A", b"echo", 0.0)
    run.ready(b"B", b"echo", 0.0)
    first = run.request(b"C1", b"echo", 0.0)  # to A
    second = run.request(b"C2", b"echo", 0.0)  # to B
    third = run.request(b"C3", b"echo", 0.0)  # waits
    run.out()
    # Both timers fire in the same call, A's first (registered first): re-queueing each at the
    # front as it fires would put C2 before C1.
    run.heartbeat(b"A", 0.5)
    run.ready(b"D", b"echo", 3.5)  # both A and B are dead by now
    assert run.out() == [(b"D", to_worker(b"C1", first))]
    run.final(b"D", b"C1", 3.6)
    assert run.out()[1] == (b"D", to_worker(b"C2", second))
    run.final(b"D", b"C2", 3.7)
    assert run.out()[1] == (b"D", to_worker(b"C3", third))


# --- liveness and heartbeats ------------------------------------------------------------------


def test_heartbeat_exact_boundary_and_suppression() -> None:
    """MDP-D-05, MDP-H-03, MDP-H-04: a HEARTBEAT (exactly two frames, MDP-W-05) is due exactly
    one interval after the last thing sent to the worker, not before; anything else sent
    restarts the interval; a busy worker keeps getting heartbeats."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    run.broker.tick(before(1.0))
    assert run.out() == []
    run.broker.tick(1.0)
    assert run.out() == [(b"W1", HEARTBEAT)]
    run.heartbeat(b"W1", 1.25)
    body = run.request(b"C1", b"echo", 1.5)
    assert run.out() == [(b"W1", to_worker(b"C1", body))]
    run.broker.tick(before(2.5))
    assert run.out() == []
    run.heartbeat(b"W1", 2.5)  # the broker's heartbeat falls due as this one arrives
    assert run.out() == [(b"W1", HEARTBEAT)]
    assert run.broker.workers()[b"W1"].state is PeerState.BUSY
    run.broker.tick(3.49)
    assert run.out() == []
    run.broker.tick(3.5)
    assert run.out() == [(b"W1", HEARTBEAT)]


def test_replies_to_a_peer_that_is_also_a_worker_put_its_heartbeat_off() -> None:
    """MDP-D-05: a peer may be a worker and a client on one socket; a PARTIAL, a FINAL or an
    MMI reply sent to it as a client is something sent to it, so its HEARTBEAT falls due one
    interval after that, not after the last worker-side message."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    body = run.request(b"W1", b"echo", 0.0)  # W1 asks, and is the only worker of echo
    assert run.out() == [(b"W1", to_worker(b"W1", body))]
    part = run.partial(b"W1", b"W1", 0.25)
    assert run.out() == [(b"W1", to_client(b"\x02", b"echo", part))]
    final = run.final(b"W1", b"W1", 1.0)  # 1 s after the REQUEST, 0.75 s after the PARTIAL
    assert run.out() == [(b"W1", to_client(b"\x03", b"echo", final))]
    run.send(b"W1", (C, b"\x01", b"mmi.service", b"echo"), 1.75)
    assert run.out() == [(b"W1", to_client(b"\x03", b"mmi.service", (b"200",)))]
    run.broker.tick(before(2.75))
    assert run.out() == []
    run.broker.tick(2.75)
    assert run.out() == [(b"W1", HEARTBEAT)]


def test_liveness_exact_boundary_and_refresh() -> None:
    """MDP-D-04, MDP-H-02, MDP-H-05, MDP-D-07: alive a hair before last_heard + liveness *
    interval, dead exactly at it; any command refreshes; an expired worker is sent nothing."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    run.heartbeat(b"W1", 0.5)
    run.request(b"C1", b"echo", 0.5)
    run.out()
    run.partial(b"W1", b"C1", 1.0)  # a PARTIAL is a heartbeat too
    run.out()
    assert run.broker.workers()[b"W1"].expires_at == 4.0
    assert of(WorkerExpired, run.broker.tick(before(4.0))) == []
    assert run.broker.worker_state(b"W1") is PeerState.BUSY
    run.out()
    events = run.broker.tick(4.0)
    assert [(e.worker, e.last_heard) for e in of(WorkerExpired, events)] == [(b"W1", 1.0)]
    assert run.out() == []
    for t in (5.0, 6.0, 6.5):
        run.broker.tick(t)
        assert run.out() == []


def test_silence_ends_after_quiet_and_ready_reopens() -> None:
    """MDP-D-06: a silenced peer's chatter extends its silence without a reply; quiet for the
    whole span ends it; READY during the silence opens a new conversation at once."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    run.ready(b"W1", b"echo", 0.0)
    assert run.out() == [(b"W1", DISCONNECT)]
    for t in (1.0, 2.0, 2.5):
        events = run.heartbeat(b"W1", t)
        assert run.out() == []
        assert [e.peer for e in of(MessageDropped, events)] == [b"W1"]
    assert run.broker.silenced() == {b"W1": 5.5}
    run.broker.tick(before(5.5))
    assert run.broker.worker_state(b"W1") is PeerState.SILENCED
    run.broker.tick(5.5)
    assert run.broker.worker_state(b"W1") is PeerState.UNKNOWN
    assert run.out() == []
    # A second peer: READY while silenced re-registers and takes waiting work.
    run.ready(b"W2", b"echo", 6.0)
    run.disconnect(b"W2", 6.0)
    body = run.request(b"C1", b"echo", 6.1)
    run.ready(b"W2", b"echo", 6.2)
    assert run.out() == [(b"W2", to_worker(b"C1", body))]
    assert run.broker.silenced() == {}


def test_no_second_disconnect_to_a_silenced_peer() -> None:
    """MDP-W-15, MDP-D-06: after DISCONNECT (exactly two frames, MDP-W-06), nothing more goes to
    that worker, even if it keeps sending unexpected commands."""
    run = Run()
    run.heartbeat(b"W1", 0.0)  # HEARTBEAT before READY: unexpected (MDP-H-01)
    assert run.out() == [(b"W1", DISCONNECT)]
    for t, frames in [
        (0.1, HEARTBEAT),
        (0.2, (W, b"\x04", b"C1", b"", b"xx")),
        (0.3, (W, b"\x02", b"C1", b"", b"xx")),
        (0.4, (W, b"\x07")),
    ]:
        run.send(b"W1", frames, t)
        assert run.out() == []
    for t in (1.0, 2.0, 3.0):
        run.broker.tick(t)
        assert run.out() == []


def test_reply_for_another_client_is_refused() -> None:
    """MDP-D-13: a busy worker's PARTIAL or FINAL naming a client other than its request's is
    valid but unexpected: DISCONNECT, nothing to either client, the request re-dispatched."""
    for code in (b"\x03", b"\x04"):
        run = Run()
        run.ready(b"W1", b"echo", 0.0)
        run.ready(b"W2", b"echo", 0.0)
        body = run.request(b"C1", b"echo", 0.0)
        run.request(b"C2", b"other", 0.0)  # a real client, waiting for something else
        assert run.out() == [(b"W1", to_worker(b"C1", body))]
        _, events = run.reply(b"W1", code, b"C2", 0.5)
        assert run.out() == [(b"W1", DISCONNECT), (b"W2", to_worker(b"C1", body))]
        assert [(e.rule, e.action) for e in of(ProtocolViolation, events)] == [
            ("MDP-D-13", "disconnected")
        ]
        assert [e.attempts for e in of(RequestRedispatched, events)] == [1]


# --- clients ----------------------------------------------------------------------------------


def test_duplicate_request_keeps_the_first() -> None:
    """MDP-S-02, MDP-D-12, MDP-D-33: a second REQUEST while one is outstanding is dropped, each
    time with a violation; the first stands and gets the only reply."""
    run = Run()
    first = run.request(b"C1", b"echo", 0.0)
    before_views = run.broker.requests()
    second_body = run.body()
    events = run.send(b"C1", (C, b"\x01", b"echo", *second_body), 0.1)
    assert [(e.rule, e.action) for e in of(ProtocolViolation, events)] == [("MDP-S-02", "dropped")]
    events = run.send(b"C1", (C, b"\x01", b"echo", *second_body), 0.1)  # told again
    assert [(e.rule, e.action) for e in of(ProtocolViolation, events)] == [("MDP-S-02", "dropped")]
    assert run.broker.requests() == before_views
    run.ready(b"W1", b"echo", 0.2)
    out = run.out()
    assert out == [(b"W1", to_worker(b"C1", first))]
    assert same_objects(out[0][1][4:], first)
    reply = run.final(b"W1", b"C1", 0.3)
    assert run.out() == [(b"C1", to_client(b"\x03", b"echo", reply))]
    assert run.out() == []


def test_client_partial_final_and_malformed_are_dropped() -> None:
    """MDP-D-16: a client PARTIAL/FINAL or malformed client message is dropped; the client's
    outstanding request is untouched and the client is sent nothing."""
    run = Run()
    run.request(b"C1", b"echo", 0.0)
    views = run.broker.requests()
    for frames, rule in [
        ((C, b"\x02", b"echo", b"x"), "MDP-D-16"),
        ((C, b"\x03", b"echo", b"x"), "MDP-D-16"),
        ((C, b"\x01", b"echo"), "MDP-C-01"),
        ((C, b"\x04", b"echo", b"x"), "MDP-C-01"),
        ((C, b"\x01", b"bad\x00name", b"x"), "MDP-D-01"),
        ((C,), "MDP-C-01"),
    ]:
        events = run.send(b"C1", frames, 0.1)
        assert [(e.rule, e.action) for e in events if isinstance(e, ProtocolViolation)] == [
            (rule, "dropped")
        ], frames
        assert run.broker.requests() == views
        assert run.out() == []
    assert run.broker.worker_state(b"C1") is PeerState.UNKNOWN


def test_bodies_pass_through_as_the_same_objects() -> None:
    """MDP-S-03, MDP-R-03: body frames reach the worker and the client as the very same bytes
    objects, with the client's address as the REQUEST's address frame. The layouts are exact:
    REQUEST (MDP-W-02), and PARTIAL / FINAL with the service frame (MDP-C-02, MDP-C-03), for the
    worker's PARTIAL and FINAL (MDP-W-03, MDP-W-04)."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    body = run.request(b"C1", b"echo", 0.0, n=3)
    [(peer, frames)] = run.out()
    assert (peer, frames[:4]) == (b"W1", (W, b"\x02", b"C1", b""))
    assert same_objects(frames[4:], body)
    part = run.body(2)
    run.send(b"W1", (W, b"\x03", b"C1", b"", *part), 0.1)
    [(peer, frames)] = run.out()
    assert (peer, frames[:3]) == (b"C1", (C, b"\x02", b"echo"))
    assert same_objects(frames[3:], part)
    final = run.body(2)
    run.send(b"W1", (W, b"\x04", b"C1", b"", *final), 0.2)
    [(peer, frames)] = run.out()
    assert (peer, frames[:3]) == (b"C1", (C, b"\x03", b"echo"))
    assert same_objects(frames[3:], final)


@pytest.mark.parametrize("feedback", ["peer_unreachable", "peer_congested"])
def test_unreachable_client_with_queued_request(feedback: str) -> None:
    """MDP-D-15: a client that cannot be reached loses its queued request; a worker arriving
    later gets nothing; MDP-A-05: the service is forgotten."""
    run = Run()
    run.request(b"C1", b"echo", 0.0)
    events = getattr(run.broker, feedback)(b"C1", 0.5)
    reason = "client-unreachable" if feedback == "peer_unreachable" else "client-congested"
    assert [(e.client, e.reason, e.worker) for e in of(RequestDropped, events)] == [
        (b"C1", reason, None)
    ]
    assert run.broker.requests() == []
    assert run.broker.services() == {}
    run.ready(b"W1", b"echo", 0.6)
    assert run.out() == []


@pytest.mark.parametrize("feedback", ["peer_unreachable", "peer_congested"])
def test_unreachable_client_with_dispatched_request(feedback: str) -> None:
    """MDP-D-15: a client that cannot be reached loses its dispatched request; its worker
    finishes, its PARTIAL and FINAL are dropped, and then it serves the next request. The
    same client asking again is not answered with the old reply (MDP-D-10); one that was
    congested is refused for liveness x interval first (MDP-D-29)."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    run.ready(b"W2", b"echo", 0.0)
    run.request(b"C1", b"echo", 0.0)
    assert [m[0] for m in run.out()] == [b"W1"]
    events = getattr(run.broker, feedback)(b"C1", 0.1)
    assert [(e.client, e.worker) for e in of(RequestDropped, events)] == [(b"C1", b"W1")]
    assert run.out() == []
    assert run.broker.worker_state(b"W1") is PeerState.BUSY
    unreachable = feedback == "peer_unreachable"
    again = run.request(b"C1", b"echo", 0.2)  # the client comes back on a new connection
    assert run.out() == ([(b"W2", to_worker(b"C1", again))] if unreachable else [])
    run.partial(b"W1", b"C1", 0.3)
    assert run.out() == []
    _, events = run.reply(b"W1", b"\x04", b"C1", 0.4)
    assert run.out() == []
    assert of(MessageDropped, events)
    assert not of(RequestCompleted, events)
    assert run.broker.worker_state(b"W1") is PeerState.IDLE
    if unreachable:
        reply = run.final(b"W2", b"C1", 0.5)
        assert run.out() == [(b"C1", to_client(b"\x03", b"echo", reply))]
    waiting = run.request(b"C2", b"echo", 0.6)
    # The longest idle worker takes it: W1 (idle since 0.4), or W2 (idle all along).
    assert run.out() == [(b"W1" if unreachable else b"W2", to_worker(b"C2", waiting))]


@pytest.mark.parametrize("feedback", ["peer_unreachable", "peer_congested"])
def test_unreachable_worker_requeues(feedback: str) -> None:
    """MDP-D-15, MDP-D-08: a worker that cannot be reached is unregistered without DISCONNECT
    and its request goes to another worker."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    body = run.request(b"C1", b"echo", 0.0)
    run.ready(b"W2", b"echo", 0.1)
    run.out()
    events = getattr(run.broker, feedback)(b"W1", 0.2)
    assert run.out() == [(b"W2", to_worker(b"C1", body))]
    assert [e.disconnect_sent for e in of(WorkerDisconnected, events)] == [False]
    assert run.broker.worker_state(b"W1") is PeerState.SILENCED


def test_client_and_worker_sides_are_independent() -> None:
    """MDP-A-02: one peer may be a worker and a client at once; each side lives its own life."""
    run = Run()
    run.ready(b"X", b"echo", 0.0)
    assert run.out() == []  # MDP-W-11: no reply to READY
    body = run.request(b"X", b"echo", 0.1)
    assert run.out() == [(b"X", to_worker(b"X", body))]
    reply = run.final(b"X", b"X", 0.2)
    assert run.out() == [(b"X", to_client(b"\x03", b"echo", reply))]
    # Its worker side told DISCONNECT and silenced, its client side still waits and is served:
    # the silence of MDP-D-06 is about worker commands.
    other = run.request(b"X", b"other", 0.3)
    run.ready(b"X", b"echo", 0.4)
    assert run.out() == [(b"X", DISCONNECT)]
    assert run.broker.worker_state(b"X") is PeerState.SILENCED
    assert [r.client for r in run.broker.requests()] == [b"X"]
    run.ready(b"Y", b"other", 0.5)
    assert run.out() == [(b"Y", to_worker(b"X", other))]
    reply = run.final(b"Y", b"X", 0.6)
    assert run.out() == [(b"X", to_client(b"\x03", b"other", reply))]


def test_service_names_match_exactly() -> None:
    """MDP-C-09: a request goes only to workers of exactly its service name, byte for byte."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    for name in (b"Echo", b"echo ", b"ech", b"echo2"):
        run.request(name, name, 0.1)
        assert run.out() == []
        assert run.broker.queued(name) == 1
    body = run.request(b"C1", b"echo", 0.2)
    assert run.out() == [(b"W1", to_worker(b"C1", body))]


def test_client_address_is_any_routing_id() -> None:
    """MDP-D-02: a client address is 1 to 255 bytes of any value; an empty or longer address in
    a worker's reply is malformed (MDP-D-02) and the worker is dropped without DISCONNECT."""
    for client in (b"\x00", b"\xff\x00\x01", bytes(range(255))):
        run = Run()
        run.ready(b"W1", b"echo", 0.0)
        body = run.request(client, b"echo", 0.0)
        assert run.out() == [(b"W1", to_worker(client, body))]
        reply = run.final(b"W1", client, 0.1)
        assert run.out() == [(client, to_client(b"\x03", b"echo", reply))]
    for address in (b"", bytes(256)):
        run = Run()
        run.ready(b"W1", b"echo", 0.0)
        run.request(b"C1", b"echo", 0.0)
        run.out()
        events = run.send(b"W1", (W, b"\x04", address, b"", b"late"), 0.1)
        assert [(e.rule, e.action) for e in of(ProtocolViolation, events)] == [
            ("MDP-D-02", "dropped")
        ]
        assert run.out() == []
        assert run.broker.worker_state(b"W1") is PeerState.SILENCED


# --- dispatch order ---------------------------------------------------------------------------


def test_least_recently_used_worker_first() -> None:
    """MDP-A-04: the worker idle the longest gets the next request. MDP-A-06: a busy worker is
    never offered a second request."""
    run = Run()
    for w in (b"W1", b"W2", b"W3"):
        run.ready(w, b"echo", 0.0)
    run.request(b"C1", b"echo", 0.1)
    assert [m[0] for m in run.out()] == [b"W1"]
    run.final(b"W1", b"C1", 0.2)  # W1 idle again: now the most recently used
    run.out()
    for client, worker in [(b"C2", b"W2"), (b"C3", b"W3"), (b"C4", b"W1")]:
        body = run.request(client, b"echo", 0.3)
        assert run.out() == [(worker, to_worker(client, body))]
    run.request(b"C5", b"echo", 0.4)
    assert run.out() == []
    assert run.broker.queued(b"echo") == 1


def test_first_come_first_served() -> None:
    """MDP-A-03: requests of one service are served in the order they arrived."""
    run = Run()
    bodies = [run.request(f"C{i}".encode(), b"echo", 0.1 * i) for i in range(1, 5)]
    run.ready(b"W1", b"echo", 1.0)
    for i, body in enumerate(bodies, start=1):
        client = f"C{i}".encode()
        out = run.out()
        assert out[-1] == (b"W1", to_worker(client, body))
        run.final(b"W1", client, 1.0 + 0.1 * i)
    assert [m[0] for m in run.out()] == [b"C4"]


def test_service_forgotten_when_unused() -> None:
    """MDP-A-05: a service exists while it has workers or waiting requests, and no longer."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    assert list(run.broker.services()) == [b"echo"]
    run.request(b"C1", b"other", 0.0)
    assert list(run.broker.services()) == [b"echo", b"other"]
    view = run.broker.services()[b"other"]
    assert (view.workers, view.idle, view.queued) == (0, 0, 1)
    run.disconnect(b"W1", 0.1)
    assert list(run.broker.services()) == [b"other"]
    run.broker.tick(10.0)
    assert run.broker.services() == {}


# --- shutdown and time ------------------------------------------------------------------------


def test_shutdown_disconnects_registered_workers_only() -> None:
    """MDP-W-14: shutdown sends DISCONNECT to every registered worker (idle or busy) and to no
    one else, drops every request, and the workers stay silenced."""
    run = Run()
    run.ready(b"W1", b"echo", 0.0)
    run.ready(b"W2", b"echo", 0.0)
    run.request(b"C1", b"echo", 0.0)
    run.request(b"C2", b"nobody", 0.0)
    run.disconnect(b"gone", 0.0)  # a silenced stranger
    run.out()
    events = run.broker.shutdown(0.5)
    assert sorted(run.out()) == [(b"W1", DISCONNECT), (b"W2", DISCONNECT)]
    assert sorted((e.client, e.reason) for e in of(RequestDropped, events)) == [
        (b"C1", "broker-shutdown"),
        (b"C2", "broker-shutdown"),
    ]
    assert run.broker.workers() == {}
    assert run.broker.requests() == []
    assert set(run.broker.silenced()) == {b"W1", b"W2", b"gone"}
    run.final(b"W1", b"C1", 0.6)
    run.broker.tick(2.0)
    assert run.out() == []


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.receive(b"W9", [W, b"\x01", b"echo"], 0.5),
        lambda b: b.tick(0.5),
        lambda b: b.peer_unreachable(b"W1", 0.5),
        lambda b: b.peer_congested(b"W1", 0.5),
        lambda b: b.shutdown(0.5),
    ],
    ids=["receive", "tick", "peer_unreachable", "peer_congested", "shutdown"],
)
def test_time_going_backwards_raises_and_changes_nothing(call: Callable[[Broker], Any]) -> None:
    """MDP-D-03: ``now`` never decreases; an earlier ``now`` is local misuse, raised before any
    state changes."""
    run = Run()
    run.ready(b"W1", b"echo", 1.0)
    run.request(b"C1", b"echo", 1.0)
    run.out()
    snapshot = (run.broker.workers(), run.broker.requests(), run.broker.silenced())
    with pytest.raises(LocalProtocolError):
        call(run.broker)
    assert (run.broker.workers(), run.broker.requests(), run.broker.silenced()) == snapshot
    assert run.out() == []
    assert run.broker.now == 1.0
    run.broker.tick(1.0)  # the same time again is fine


# --- work proportional to what is due (MDP-S-04) ----------------------------------------------


@contextmanager
def counting_calls() -> Iterator[list[int]]:
    """Count Python function calls made inside the block (a measure of work, not of time)."""
    counter = [0]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            counter[0] += 1

    # A garbage collection inside the block would count the finalizers of whatever earlier
    # tests left behind (seen in a full run: 2 more calls in one of two identical ticks).
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        yield counter
    finally:
        sys.setprofile(None)
        gc.enable()


def _crowd(n: int) -> Broker:
    """A broker with ``n`` idle workers heard at 0.5, and one lone worker heard at 0."""
    broker = Broker(BrokerConfig(heartbeat_interval=INTERVAL, liveness=3))
    broker.receive(b"lone", [W, b"\x01", b"echo"], 0.0)
    for i in range(n):
        broker.receive(b"w%d" % i, [W, b"\x01", b"echo"], 0.5)
    return broker


def test_tick_work_is_proportional_to_what_is_due() -> None:
    """MDP-S-04: with 10,000 idle workers, a tick with nothing due does no per-worker work, and
    a tick with one heartbeat due does the same work as with 10 workers."""
    small, large = _crowd(10), _crowd(10_000)
    for broker in (small, large):
        assert broker.next_deadline() == 1.0  # the lone worker's heartbeat
    costs = []
    for broker in (small, large):
        with counting_calls() as idle_tick:
            assert broker.tick(0.75) == []
        with counting_calls() as one_due:
            broker.tick(1.0)
        with counting_calls() as one_message:
            broker.receive(b"w3", [W, b"\x05"], 1.1)
        assert broker.take_outgoing()[-1:] == [(b"lone", HEARTBEAT)]
        costs.append((idle_tick[0], one_due[0], one_message[0]))
    assert costs[0] == costs[1]
    assert all(cost < 50 for cost in costs[1])
    assert large.next_deadline() == 1.5  # the crowd's heartbeats, all due together


# --- delivery: one reported outcome per request (MDP-D-24) -------------------------------------


def outcomes(events: Sequence[BrokerEvent]) -> list[tuple[str, int]]:
    """The request outcomes among ``events``, in order: ("completed" | "dropped", request id)."""
    found: list[tuple[str, int]] = []
    for event in events:
        if isinstance(event, RequestCompleted):
            found.append(("completed", event.request_id))
        elif isinstance(event, RequestDropped):
            found.append(("dropped", event.request_id))
    return found


def busy_pair(run: Run) -> None:
    """Two workers of "echo", both idle."""
    run.ready(b"W1", b"echo", 0.0)
    run.ready(b"W2", b"echo", 0.0)
    assert run.out() == []


@pytest.mark.parametrize("feedback", ["peer_unreachable", "peer_congested"])
def test_mdp_d_24_a_final_not_sent_ends_its_request_as_dropped(feedback: str) -> None:
    """MDP-D-24, MDP-D-15: the FINAL is in the outbox, the send fails: that request is dropped
    (named, with its rule), never completed; nothing is reported twice."""
    run = Run()
    busy_pair(run)
    run.request(b"C1", b"echo", 0.1)
    run.out()
    assert run.broker.flushed() == []  # a REQUEST to a worker completes nothing
    assert run.reply(b"W1", b"\x04", b"C1", 0.2)[1] == []  # not completed before it is sent
    [(to, _)] = run.out()
    assert to == b"C1"
    assert run.broker.holds(b"C1")  # its reply is in flight
    events = getattr(run.broker, feedback)(b"C1", 0.2, unsent=0)
    [dropped] = of(RequestDropped, events)
    reason = "client-unreachable" if feedback == "peer_unreachable" else "client-congested"
    assert (dropped.request_id, dropped.client, dropped.reason, dropped.worker, dropped.rule) == (
        1,
        b"C1",
        reason,
        b"W1",
        "MDP-D-15",
    )
    assert run.broker.flushed() == []
    assert not run.broker.holds(b"C1")
    assert run.broker.worker_state(b"W1") is PeerState.IDLE  # the worker did its part


def test_mdp_d_24_a_newer_request_is_not_blamed_for_an_older_final() -> None:
    """MDP-D-24: the client asked again before its first FINAL left; that FINAL fails: the
    first request is dropped, the second is still served and completed."""
    run = Run()
    busy_pair(run)
    run.request(b"C1", b"echo", 0.1)
    run.out()
    run.final(b"W1", b"C1", 0.2)
    second = run.request(b"C1", b"echo", 0.2)  # same batch: the first is forgotten (MDP-D-10)
    outbox = run.out()
    assert [peer for peer, _ in outbox] == [b"C1", b"W2"]  # FINAL 1, then REQUEST 2 to W2
    assert outbox[1][1] == to_worker(b"C1", second)
    events = run.broker.peer_congested(b"C1", 0.2, unsent=0)
    assert outcomes(events) == [("dropped", 1)]
    assert [r.request_id for r in run.broker.requests()] == [2]  # still outstanding
    assert run.broker.flushed() == []
    reply = run.final(b"W2", b"C1", 0.3)
    assert run.out() == [(b"C1", to_client(b"\x03", b"echo", reply))]
    assert outcomes(run.broker.flushed()) == [("completed", 2)]


def test_mdp_d_24_a_final_sent_before_the_failure_is_completed() -> None:
    """MDP-D-24: two FINALs to one client in one outbox; the second does not fit: the first
    request is completed, the second dropped."""
    run = Run()
    busy_pair(run)
    run.request(b"C1", b"echo", 0.1)
    run.out()
    run.final(b"W1", b"C1", 0.2)
    run.request(b"C1", b"echo", 0.2)  # to W2, idle the longest (MDP-A-04)
    run.final(b"W2", b"C1", 0.2)
    outbox = run.out()
    finals = [i for i, (peer, frames) in enumerate(outbox) if peer == b"C1"]
    assert len(finals) == 2
    events = run.broker.peer_congested(b"C1", 0.2, unsent=finals[1])
    assert outcomes(events) == [("dropped", 2)]
    assert outcomes(run.broker.flushed()) == [("completed", 1)]
    assert run.broker.requests() == []


def test_mdp_d_24_a_partial_not_sent_drops_its_request() -> None:
    """MDP-D-24, MDP-D-15: a PARTIAL that was not sent ends the request it belongs to; its
    worker's FINAL is then dropped as a late reply (MDP-D-10)."""
    run = Run()
    busy_pair(run)
    run.request(b"C1", b"echo", 0.1)
    run.out()
    run.partial(b"W1", b"C1", 0.2)
    assert len(run.out()) == 1
    events = run.broker.peer_congested(b"C1", 0.2, unsent=0)
    assert [(e.request_id, e.reason) for e in of(RequestDropped, events)] == [
        (1, "client-congested")
    ]
    _, late = run.reply(b"W1", b"\x04", b"C1", 0.3)
    assert of(MessageDropped, late)
    assert run.out() == []
    assert run.broker.flushed() == []


def test_mdp_d_24_an_mmi_reply_not_sent_is_reported_and_spares_the_request() -> None:
    """MDP-D-24: an mmi.* reply that was not sent is a MessageDropped; the client's queued
    request does not pay for it."""
    run = Run()
    run.request(b"C1", b"nobody", 0.0)
    run.send(b"C2", (C, b"\x01", b"mmi.service", b"echo"), 0.1)
    run.out()
    events = run.broker.peer_congested(b"C2", 0.1, unsent=0)
    [dropped] = of(MessageDropped, events)
    assert dropped.peer == b"C2"
    assert "mmi.service" in dropped.reason
    assert not of(RequestDropped, events)
    assert [r.client for r in run.broker.requests()] == [b"C1"]


def test_mdp_d_24_without_an_index_nothing_in_flight_counts_as_sent() -> None:
    """MDP-D-24: feedback that does not say which message failed drops the FINAL in flight
    and the outstanding request alike (nothing is claimed completed that may not be)."""
    run = Run()
    busy_pair(run)
    run.request(b"C1", b"echo", 0.1)
    run.out()
    run.final(b"W1", b"C1", 0.2)
    run.request(b"C1", b"echo", 0.2)
    run.out()
    events = run.broker.peer_congested(b"C1", 0.2)
    assert sorted(outcomes(events)) == [("dropped", 1), ("dropped", 2)]
    assert run.broker.flushed() == []


def test_mdp_d_24_every_accepted_request_has_one_outcome() -> None:
    """MDP-D-24: many clients, FINALs failing at random points of their outboxes: each
    accepted request ends exactly once, completed or dropped."""
    rng = Random(24)
    run = Run(heartbeat_interval=100.0)
    workers = [b"W%d" % i for i in range(4)]
    for worker in workers:
        run.ready(worker, b"echo", 0.0)
    run.out()
    accepted: list[int] = []
    ended: list[tuple[str, int]] = []
    now = 0.0
    for _ in range(300):
        now += 0.01
        events: list[BrokerEvent] = []
        for client in (b"C%d" % rng.randrange(6) for _ in range(3)):
            events += run.broker.receive(client, [C, b"\x01", b"echo", b"x"], now)
        for view in run.broker.workers().values():
            if view.client is not None and rng.random() < 0.7:
                events += run.broker.receive(view.peer, [W, b"\x04", view.client, b"", b"y"], now)
        while outbox := run.broker.take_outgoing():
            failed: set[bytes] = set()
            for index, (peer, _) in enumerate(outbox):
                if peer in failed or not peer.startswith(b"C") or rng.random() > 0.2:
                    continue
                failed.add(peer)
                events += run.broker.peer_congested(peer, now, unsent=index)
        events += run.broker.flushed()
        accepted += [e.request_id for e in events if isinstance(e, RequestQueued)]
        ended += outcomes(events)
    for request in run.broker.requests():
        accepted.remove(request.request_id)  # still outstanding: no outcome yet
    assert sorted(rid for _, rid in ended) == sorted(accepted)
    kinds = {kind for kind, _ in ended}
    assert kinds == {"completed", "dropped"}


def test_mdp_d_24_a_final_not_yet_taken_is_not_completed() -> None:
    """MDP-D-24: flushed() completes only FINALs the runtime took; one still in the outbox
    waits for the next flush."""
    run = Run()
    busy_pair(run)
    run.request(b"C1", b"echo", 0.1)
    run.request(b"C2", b"echo", 0.1)
    run.out()
    run.final(b"W1", b"C1", 0.2)
    assert run.broker.flushed() == []  # queued, not taken: not sent yet
    assert len(run.out()) == 1
    run.final(b"W2", b"C2", 0.3)  # queued after the take
    assert outcomes(run.broker.flushed()) == [("completed", 1)]
    assert len(run.out()) == 1
    assert outcomes(run.broker.flushed()) == [("completed", 2)]
