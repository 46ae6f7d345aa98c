"""``domo.sync.Client.map``: many requests in flight from one thread, replies in order.

Real ZeroMQ on tcp loopback: Trio's broker in a thread, ``domo.sync`` workers in threads, the
client in the test's thread. Every wait is bounded (``drivers.LIMIT``, the requests' timeouts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest

import domo.sync
from domo.protocol.events import RequestReceived
from domo.runtime import ClientClosed, RemoteError, RequestTimeout

from .drivers import Events, Runtime, Step, SyncRuntime
from .test_behaviour import BROKER, LOCAL, WORKER


@pytest.fixture
def sync() -> Iterator[Runtime]:
    made = SyncRuntime()
    try:
        yield made
    finally:
        made.close()


def slow_or_failing(body: list[bytes]) -> Sequence[Step]:
    """``b"fail"``: the handler raises; ``b"<n>"``: sleeps n/100 s, then echoes."""
    if body[0] == b"fail":
        return [("raise", "asked to fail")]
    return [("sleep", int(body[0]) / 100), ("yield", body)]


def test_replies_come_in_the_order_of_the_bodies_with_several_in_flight(sync: Runtime) -> None:
    endpoint, broker = sync.broker(LOCAL, BROKER)
    received = Events()
    workers = [
        sync.worker(endpoint, "echo", slow_or_failing, WORKER, on_event=received) for _ in range(3)
    ]
    bodies = [b"30", b"1", b"1", b"20", b"1", b"1", b"1", b"1"]  # early ones are slow
    drawn: list[float] = []

    def source() -> Iterator[bytes]:
        for body in bodies:
            drawn.append(time.monotonic())
            yield body

    with domo.sync.Client(endpoint, timeout=5, retries=0, concurrency=3) as client:
        replies = list(client.map("echo", source()))
        assert replies == [[body] for body in bodies]
        # Several were in flight at once: the fourth body was drawn before the first (0.3 s)
        # was answered, while the first worker was still sleeping.
        assert drawn[3] - drawn[0] < 0.25
        # Every request was served exactly once.
        served = sorted(e.body[0] for e in received.of_type(RequestReceived))
        assert served == sorted(bodies)
        assert client.request("echo", b"1") == [b"1"]  # the sessions were handed back
    for worker in workers:
        worker.stop()
    broker.stop()


def test_a_failed_request_raises_at_its_place_and_cancels_the_rest(sync: Runtime) -> None:
    endpoint, broker = sync.broker(LOCAL, BROKER)
    workers = [sync.worker(endpoint, "echo", slow_or_failing, WORKER) for _ in range(2)]
    with domo.sync.Client(endpoint, timeout=5, retries=0, concurrency=2) as client:
        results = client.map("echo", [b"1", b"fail", b"1", b"1"])
        assert next(results) == [b"1"]
        with pytest.raises(RemoteError, match="asked to fail"):
            next(results)
        with pytest.raises(StopIteration):
            next(results)
        # Both sessions are free again: two requests at once from two threads.
        answers: list[list[bytes]] = []
        threads = [
            threading.Thread(target=lambda: answers.append(client.request("echo", b"2")))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(5)
        assert answers == [[b"2"], [b"2"]]
    for worker in workers:
        worker.stop()
    broker.stop()


def test_closing_the_iterator_early_gives_the_sessions_back(sync: Runtime) -> None:
    endpoint, broker = sync.broker(LOCAL, BROKER)
    worker = sync.worker(endpoint, "echo", slow_or_failing, WORKER)
    with domo.sync.Client(endpoint, timeout=5, retries=0, concurrency=4) as client:
        results = client.map("echo", [b"1", b"5", b"5", b"5"], window=4)
        assert next(results) == [b"1"]
        results.close()  # three requests still in flight: cancelled, their sockets replaced
        assert client.request("echo", b"0") == [b"0"]  # not the late reply of a cancelled one
        assert list(client.map("echo", [b"2", b"0"])) == [[b"2"], [b"0"]]
    worker.stop()
    broker.stop()


def test_a_request_nobody_answers_times_out_after_its_retries(sync: Runtime) -> None:
    endpoint, broker = sync.broker(LOCAL, BROKER)
    with domo.sync.Client(endpoint, timeout=0.2, retries=1, concurrency=2) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeout) as caught:
            list(client.map("nobody", [b"a", b"b"]))
        assert caught.value.attempts == 2  # the first try and one resend, each 0.2 s
        assert 0.35 < time.monotonic() - started < 3.0
    broker.stop()


def test_map_checks_its_arguments_and_a_closed_client(sync: Runtime) -> None:
    endpoint, broker = sync.broker(LOCAL, BROKER)
    client = domo.sync.Client(endpoint, timeout=1, retries=0)
    with pytest.raises(ValueError, match="window"):
        client.map("echo", [b"a"], window=0)
    assert list(client.map("echo", [])) == []  # nothing to send: nothing waited for
    client.close()
    with pytest.raises(ClientClosed):
        list(client.map("echo", [b"a"]))
    broker.stop()
