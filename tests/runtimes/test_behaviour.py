"""The behaviour every runtime owes its users, written once and run over trio, asyncio and sync.

Each test takes the ``runtime`` fixture (three parameters) and uses only the face of
``drivers.Runtime``: a broker, workers with a ``Plan`` for a handler, a client. Real ZeroMQ on
tcp loopback; heartbeats every 100 ms so that losses show within a fraction of a second; every
wait bounded (``drivers.LIMIT``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from domo import DomoError
from domo.protocol import BrokerConfig, LocalProtocolError, WorkerConfig
from domo.protocol.events import (
    ReconnectRequired,
    RequestRedispatched,
    WorkerConnected,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from domo.runtime import ClientClosed, RemoteError, Reply, RequestError, RequestTimeout

from .conftest import Peer, free_tcp_port
from .drivers import Events, Runtime, Step, echo

INTERVAL = 0.1  # the broker gives a peer 3 of them: slack for a loaded machine
BROKER = BrokerConfig(heartbeat_interval=INTERVAL)
WORKER = WorkerConfig(heartbeat_interval=INTERVAL, reconnect_initial=0.05, reconnect_max=0.2)
LOCAL = "tcp://127.0.0.1:0"


def test_request_and_reply(runtime: Runtime) -> None:
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    worker = runtime.worker(endpoint, "echo", echo, WORKER)
    with runtime.client(endpoint, timeout=5, retries=0) as client:
        assert client.request("echo", b"hello") == [b"hello"]
        assert client.request("echo", b"a", b"", b"c") == [b"a", b"", b"c"]  # frames kept
        assert client.request(b"echo", b"again") == [b"again"]  # one session, many requests
    worker.stop()
    broker.stop()


def counting(body: list[bytes]) -> Sequence[Step]:
    count = int(body[0])
    return [("yield", [b"part", b"%d" % i]) for i in range(count)] + [("yield", b"done")]


def test_partials_then_final(runtime: Runtime) -> None:
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    worker = runtime.worker(endpoint, "count", counting, WORKER)
    with runtime.client(endpoint, timeout=5, retries=0) as client:
        replies: list[Reply] = []
        client.stream("count", b"3", into=replies)
        assert replies == [
            Reply([b"part", b"0"], final=False),
            Reply([b"part", b"1"], final=False),
            Reply([b"part", b"2"], final=False),
            Reply([b"done"], final=True),
        ]
        assert client.request("count", b"2") == [b"done"]  # request() skips the PARTIALs
    worker.stop()
    broker.stop()


def test_concurrent_requests_share_a_pool_of_sessions(runtime: Runtime) -> None:
    events = Events()
    endpoint, broker = runtime.broker(LOCAL, BROKER, events)
    delay = 0.3
    workers = [
        runtime.worker(endpoint, "slow", lambda body: [("sleep", delay), ("yield", body)], WORKER)
        for _ in range(3)
    ]
    bodies = [b"%d" % i for i in range(9)]
    with runtime.client(endpoint, timeout=10, retries=0, concurrency=3) as client:
        events.wait_for(WorkerRegistered, count=3)  # every worker ready before the clock starts
        started = time.monotonic()
        replies = client.request_all("slow", bodies)
        elapsed = time.monotonic() - started
    assert replies == [[body] for body in bodies]  # each caller got its own reply
    assert elapsed < 9 * delay * 0.8  # three at a time, not one (that would take 2.7 s)
    for worker in workers:
        worker.stop()
    broker.stop()


def test_timeout_then_retries_exhausted(runtime: Runtime) -> None:
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    with runtime.client(endpoint, timeout=0.2, retries=2) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeout) as failure:
            client.request("nobody", b"x")  # no worker offers it: every attempt times out
        elapsed = time.monotonic() - started
    assert failure.value.attempts == 3
    assert failure.value.reason == "retries-exhausted"
    assert 0.6 <= elapsed < 3.0
    broker.stop()


def slow_first(seen: list[bytes]) -> Callable[[list[bytes]], Sequence[Step]]:
    def plan(body: list[bytes]) -> Sequence[Step]:
        seen.append(body[0])
        delay = 1.0 if len(seen) == 1 else 0.0  # the first attempt outlives the timeout
        return [("sleep", delay), ("yield", [b"attempt", b"%d" % len(seen)])]

    return plan


def test_retry_on_timeout_reaches_a_worker(runtime: Runtime) -> None:
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    seen: list[bytes] = []
    plan = slow_first(seen)
    first = runtime.worker(endpoint, "svc", plan, WORKER)
    second = runtime.worker(endpoint, "svc", plan, WORKER)
    with runtime.client(endpoint, timeout=0.3, retries=2) as client:
        # The first attempt's reply comes after the resend: the client takes the resend's reply,
        # answered by the other worker, and never the stale one (MDP-C-08, MDP-D-20).
        assert client.request("svc", b"q") == [b"attempt", b"2"]
        assert seen == [b"q", b"q"]
        time.sleep(1.0)  # the slow first reply arrives at a socket that was given up
        assert client.request("svc", b"r")[0] == b"attempt"  # and does not reach this one
    first.stop()
    second.stop()
    broker.stop()


def test_cancelled_request_leaves_the_client_usable(runtime: Runtime) -> None:
    if runtime.name == "sync":
        pytest.skip("blocking code has no cancellation (a request ends by its timeout)")
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    plan = lambda body: [("sleep", 0.5 if body[0] == b"slow" else 0.0), ("yield", body)]  # noqa: E731
    worker = runtime.worker(endpoint, "svc", plan, WORKER)
    with runtime.client(endpoint, timeout=5, retries=0) as client:
        client.request_cancelled("svc", b"slow", after=0.1)
        # The session replaced its socket: the slow reply, when it comes, reaches nobody.
        assert client.request("svc", b"next") == [b"next"]
        time.sleep(0.6)
        assert client.request("svc", b"last") == [b"last"]
    worker.stop()
    broker.stop()


def announcing(body: list[bytes]) -> Sequence[Step]:
    if body[0] == b"only-partials":
        return [("partial", b"a"), ("partial", [b"b", b"c"])]
    return [("yield", b"held"), ("partial", b"at once"), ("yield", b"done")]


def test_partial_values_and_held_values(runtime: Runtime) -> None:
    """``yield Partial(body)`` is a PARTIAL, a plain value before another is one too, the last
    plain value is the FINAL; a generator of Partials only ends with one empty frame."""
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    worker = runtime.worker(endpoint, "say", announcing, WORKER)
    with runtime.client(endpoint, timeout=5, retries=0) as client:
        replies: list[Reply] = []
        client.stream("say", b"mixed", into=replies)
        assert replies == [
            Reply([b"held"], final=False),
            Reply([b"at once"], final=False),
            Reply([b"done"], final=True),
        ]
        replies = []
        client.stream("say", b"only-partials", into=replies)
        assert replies == [
            Reply([b"a"], final=False),
            Reply([b"b", b"c"], final=False),
            Reply([b""], final=True),
        ]
    worker.stop()
    broker.stop()


def failing(body: list[bytes]) -> Sequence[Step]:
    if body[0] == b"fail":
        return [("raise", "no such thing")]
    if body[0] == b"fail-after-partial":
        return [("yield", b"first"), ("yield", b"second"), ("raise", "then it broke")]
    return echo(body)


def test_handler_that_raises(runtime: Runtime) -> None:
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    events = Events()
    worker = runtime.worker(endpoint, "svc", failing, WORKER, on_event=events)
    with runtime.client(endpoint, timeout=5, retries=0) as client:
        with pytest.raises(RemoteError) as failure:
            client.request("svc", b"fail")
        assert failure.value.error_type == "ValueError"
        assert failure.value.message == "no such thing"
        replies: list[Reply] = []
        with pytest.raises(RemoteError, match="then it broke"):
            client.stream("svc", b"fail-after-partial", into=replies)
        # A value goes out as a PARTIAL once its successor is yielded: "first" did, "second"
        # was held when the handler raised, and the error FINAL took its place.
        assert replies == [Reply([b"first"], final=False)]
        assert client.request("svc", b"still here") == [b"still here"]  # the worker stayed
    assert len(events.of_type(WorkerConnected)) == 1  # never reconnected (MDP-D-23)
    worker.stop()
    broker.stop()


def test_busy_worker_keeps_heartbeating(runtime: Runtime) -> None:
    # A liveness of 6 intervals: a worker's loop held up 0.3 s on a loaded machine is not a
    # silence this test is about; the job still lasts twice the broker's whole liveness span.
    patient = BrokerConfig(heartbeat_interval=INTERVAL, liveness=6)
    endpoint = runtime.broker(LOCAL, patient, on_event := Events())[0]
    slow = 2 * patient.liveness * INTERVAL  # far longer than the broker's liveness span
    worker = runtime.worker(
        endpoint, "slow", lambda body: [("sleep", slow), ("yield", body)], WORKER
    )
    with runtime.client(endpoint, timeout=5, retries=0) as client:
        assert client.request("slow", b"x") == [b"x"]
        assert client.request("slow", b"y") == [b"y"]
    assert on_event.of_type(WorkerExpired) == []  # MDP-H-04: busy, yet alive
    assert len(on_event.of_type(WorkerRegistered)) == 1
    worker.stop()


def test_worker_killed_mid_request(runtime: Runtime, spawn: Callable[..., Peer]) -> None:
    events = Events()
    endpoint, broker = runtime.broker(LOCAL, BROKER, events)
    doomed = spawn("worker", runtime.name, endpoint, "svc", str(INTERVAL))
    events.wait_for(WorkerRegistered)
    with runtime.client(endpoint, timeout=8, retries=0) as client:
        replies: list[list[bytes]] = []

        def ask() -> None:
            replies.append(client.request("svc", b"job"))

        asking = threading.Thread(target=ask)
        asking.start()
        assert doomed.line("busy") == "busy job"
        doomed.kill()  # SIGKILL: no DISCONNECT, the broker learns from silence
        rescuer = runtime.worker(endpoint, "svc", echo, WORKER)
        asking.join(10)
        assert not asking.is_alive()
    assert replies == [[b"job"]]  # re-dispatched to the new worker (MDP-D-08)
    # Silence (expiry) or a heartbeat that found no route (unreachable): either way, once.
    lost = events.of_type(WorkerExpired) + [
        e for e in events.of_type(WorkerDisconnected) if e.reason == "unreachable"
    ]
    (redispatched,) = events.of_type(RequestRedispatched)
    assert [e.worker for e in lost] == [redispatched.lost_worker]
    rescuer.stop()
    broker.stop()


def test_broker_restart(runtime: Runtime, spawn: Callable[..., Peer]) -> None:
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    first = spawn("broker", runtime.name, endpoint, str(INTERVAL))
    first.line("bound")
    events = Events()
    worker = runtime.worker(endpoint, "echo", echo, WORKER, on_event=events)
    with runtime.client(endpoint, timeout=1, retries=5) as client:
        assert client.request("echo", b"before") == [b"before"]
        first.kill()  # no DISCONNECT: the worker notices the silence (MDP-H-06)
        events.wait_for(ReconnectRequired, lambda e: e.reason == "broker-lost")
        second = spawn("broker", runtime.name, endpoint, str(INTERVAL))
        second.line("bound")
        assert client.request("echo", b"after") == [b"after"]
    assert len(events.of_type(WorkerConnected)) >= 2  # READY again on a new socket
    worker.stop()


def test_disconnect_from_broker_makes_worker_reconnect(runtime: Runtime) -> None:
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    _, broker = runtime.broker(endpoint, BROKER)
    events = Events()
    worker = runtime.worker(endpoint, "echo", echo, WORKER, on_event=events)
    with runtime.client(endpoint, timeout=1, retries=5) as client:
        assert client.request("echo", b"one") == [b"one"]
        broker.stop()  # graceful: DISCONNECT to every worker (MDP-W-14)
        events.wait_for(ReconnectRequired, lambda e: e.reason == "broker-disconnect")
        _, broker = runtime.broker(endpoint, BROKER)
        assert client.request("echo", b"two") == [b"two"]
    worker.stop()
    broker.stop()


def test_graceful_worker_shutdown(runtime: Runtime) -> None:
    events = Events()
    endpoint, broker = runtime.broker(LOCAL, BROKER, events)
    worker = runtime.worker(endpoint, "echo", echo, WORKER)
    with runtime.client(endpoint, timeout=5, retries=0) as client:
        assert client.request("echo", b"x") == [b"x"]
    worker.stop()  # DISCONNECT: the broker forgets it at once, not after liveness
    (gone,) = events.wait_for(WorkerDisconnected)
    assert gone.reason == "worker-disconnect"
    assert events.of_type(WorkerExpired) == []
    broker.stop()


def test_closed_client_and_misuse_raise_domo_errors(runtime: Runtime) -> None:
    endpoint, broker = runtime.broker(LOCAL, BROKER)
    with (
        runtime.client(endpoint, timeout=5, retries=0) as client,
        pytest.raises(DomoError),  # the core's LocalProtocolError is a DomoError too
    ):
        client.request("echo", *[])  # a request needs a body (MDP-C-01)
    assert issubclass(LocalProtocolError, DomoError)
    assert issubclass(RequestTimeout, RequestError)
    assert issubclass(ClientClosed, DomoError)
    broker.stop()
