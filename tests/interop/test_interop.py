"""domo against MDP/0.2 peers framed by hand from RFC 18 (``handframed.py``, no domo inside).

- domo's broker (``serve_broker`` in this process, and the ``domo broker`` command) serves a
  hand-framed client and worker: REQUEST, several PARTIALs, the FINAL, heartbeats both ways
  over many intervals, and the worker's DISCONNECT.
- domo's ``Client`` and ``run_worker`` work through the hand-framed broker: streaming PARTIALs,
  domo's heartbeats (idle and busy) accepted, the hand broker's heartbeats accepted, and the
  hand broker's DISCONNECT answered by a new READY on a new socket.
- The hand-framed peers also work with each other, so a failure above is domo's, not theirs.

The hand-framed code blocks, so it runs in threads (``trio.to_thread``); every test is bounded
by ``trio.fail_after`` and every peer closes its socket and context when its thread ends.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TypeVar

import pytest
import trio

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import (
    BrokerEvent,
    ReconnectRequired,
    RequestCompleted,
    RequestQueued,
    WorkerDisconnected,
    WorkerEvent,
    WorkerExpired,
    WorkerRegistered,
)
from domo.trio import Client, run_worker, serve_broker

from ..cli.conftest import QUICK_BEATS, StartDomo, run_domo
from ..trio.conftest import Recorder
from .handframed import (
    W_DISCONNECT,
    W_HEARTBEAT,
    W_READY,
    WORKER,
    Frames,
    HandBroker,
    HandClient,
    HandWorker,
)

pytestmark = pytest.mark.io

T = TypeVar("T")
INTERVAL = 0.2  # as QUICK_BEATS for the domo command
LIVENESS = 3
SPAN = LIVENESS * INTERVAL  # silence after which a peer is lost
IDLE = 4 * SPAN  # twelve heartbeat intervals with nothing else to say
BROKER = BrokerConfig(heartbeat_interval=INTERVAL, liveness=LIVENESS)
WORKER_CONFIG = WorkerConfig(heartbeat_interval=INTERVAL, liveness=LIVENESS)


def countdown(body: Frames) -> list[Frames]:
    """The hand worker's service: N PARTIALs of two frames each, then a FINAL echoing the body."""
    return [[b"part", b"%d" % index] for index in range(int(body[0]))] + [[b"done", *body]]


async def in_thread(function: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(function)


async def until(condition: Callable[[], bool], what: str, time_limit: float = 10.0) -> None:
    """Wait (polling) until ``condition()`` holds; fail after ``time_limit`` seconds."""
    deadline = trio.current_time() + time_limit
    while trio.current_time() < deadline:
        if condition():
            return
        await trio.sleep(0.01)  # the condition is another thread's state: nothing to wait on
    raise AssertionError(f"timed out waiting for {what}")


def beats_between(times: list[float], start: float, end: float) -> list[float]:
    return [at for at in times if start <= at <= end]


def assert_steady(beats: list[float], start: float, end: float) -> None:
    """Heartbeats all through ``[start, end]``: never a silence the peer would call lost
    (MDP-H-05), and about one per interval (MDP-H-04)."""
    points = [start, *beats, end]
    gaps = [later - earlier for earlier, later in itertools.pairwise(points)]
    assert max(gaps) < SPAN, f"a silence of {max(gaps):.3f} s in {gaps}"
    assert len(beats) >= (end - start) / INTERVAL / 2, f"only {len(beats)} heartbeats"


def assert_silent_after_disconnect(worker: HandWorker) -> None:
    """MDP-W-13: nothing reaches the worker after its DISCONNECT but what was already on its
    way: at most one HEARTBEAT, crossing it on the wire, and then silence for the rest of the
    span the worker listens (a broker ignoring DISCONNECT would heartbeat three more times)."""
    crossed = [frames for delay, frames in worker.after_disconnect if delay < INTERVAL / 2]
    assert crossed in ([], [[WORKER, W_HEARTBEAT]])
    assert len(worker.after_disconnect) == len(crossed), worker.after_disconnect


async def hand_client_and_worker_through(
    endpoint: str, registered: Callable[[], Awaitable[None]]
) -> tuple[HandWorker, float, float]:
    """Drive a hand-framed worker and client through the broker at ``endpoint``.

    MDP-W-01, MDP-W-09: the worker sends READY (``registered`` waits until the broker has it);
    MDP-C-01, MDP-C-02, MDP-C-03, MDP-W-02, MDP-W-03, MDP-W-04, MDP-R-01: a REQUEST gets three
    PARTIALs and the FINAL, each framed as the RFC says (the hand peers check every frame);
    MDP-C-09: the replies name the requested service; MDP-H-02, MDP-H-04, MDP-W-05: then only
    heartbeats (of exactly two frames) pass, both ways, for twelve intervals, and the worker is
    still registered (MDP-M-01: mmi.service says 200); MDP-W-06, MDP-W-12, MDP-W-13: the worker
    sends DISCONNECT and then hears nothing more. Returns the worker, after its thread ended,
    and the time span it was idle.
    """
    worker = HandWorker(endpoint, b"countdown", INTERVAL, LIVENESS, countdown)
    client = HandClient(endpoint)
    stop = threading.Event()
    try:
        async with trio.open_nursery() as threads:
            threads.start_soon(in_thread, partial(worker.run, stop))
            try:
                await registered()
                request = partial(client.request, b"countdown", b"3", b"x", timeout=5.0)
                assert await in_thread(request) == [
                    ("PARTIAL", [b"part", b"0"]),
                    ("PARTIAL", [b"part", b"1"]),
                    ("PARTIAL", [b"part", b"2"]),
                    ("FINAL", [b"done", b"3", b"x"]),
                ]
                idle_from = time.monotonic()
                await trio.sleep(IDLE)
                idle_to = time.monotonic()
                mmi = partial(client.request, b"mmi.service", b"countdown", timeout=5.0)
                assert await in_thread(mmi) == [("FINAL", [b"200"])]
            finally:
                stop.set()  # the worker sends DISCONNECT, listens for a span, and returns
    finally:
        client.close()
        worker.close()
    assert not worker.lost_broker
    assert not worker.told_to_disconnect
    assert_silent_after_disconnect(worker)
    [request_at] = [at for at, name, _ in worker.received if name == "REQUEST"]
    assert {name for _, name, _ in worker.received} == {"REQUEST", "HEARTBEAT"}
    broker_beats = [at for at, name, _ in worker.received if name == "HEARTBEAT"]
    assert_steady(beats_between(broker_beats, idle_from, idle_to), idle_from, idle_to)
    own_beats = [at for at, name in worker.sent if name == "HEARTBEAT"]
    assert_steady(beats_between(own_beats, idle_from, idle_to), idle_from, idle_to)
    assert [name for _, name in worker.sent if name != "HEARTBEAT"] == [
        "READY",
        *["PARTIAL"] * 3,
        "FINAL",
        "DISCONNECT",
    ]
    assert request_at < idle_from
    return worker, idle_from, idle_to


async def test_serve_broker_serves_a_hand_framed_client_and_worker() -> None:
    """domo's ``serve_broker`` with the RFC's frames spelled out by hand on both sides; its
    events show the worker registered, the request completed with three PARTIALs, the worker
    never expired while only heartbeats passed, and DISCONNECT unregistering it."""
    events: Recorder[BrokerEvent] = Recorder()

    async def registered() -> None:
        assert (await events.wait_for(WorkerRegistered)).service == b"countdown"

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, on_event=events)
            [endpoint] = await nursery.start(serve, "tcp://127.0.0.1:0")
            worker, _, _ = await hand_client_and_worker_through(endpoint, registered)
            gone = await events.wait_for(WorkerDisconnected)
            nursery.cancel_scope.cancel()
    [ready] = events.of_type(WorkerRegistered)
    assert (gone.worker, gone.reason, gone.disconnect_sent) == (
        ready.worker,
        "worker-disconnect",
        False,
    )
    # MDP-R-02, MDP-R-03: the REQUEST carries the client's ROUTER identity, then an empty frame.
    [queued] = [q for q in events.of_type(RequestQueued) if q.service == b"countdown"]
    [request] = [frames for _, name, frames in worker.received if name == "REQUEST"]
    assert request == [WORKER, b"\x02", queued.client, b"", b"3", b"x"]
    [completed] = events.of_type(RequestCompleted)
    assert (completed.worker, completed.partials) == (ready.worker, 3)
    assert events.of_type(WorkerExpired) == []


async def test_domo_broker_command_serves_a_hand_framed_client_and_worker(
    domo: StartDomo,
) -> None:
    """The same dialog through the ``domo broker`` command in its own process; its log shows
    the registration, the request with three PARTIALs, no expiry and the DISCONNECT."""
    broker = await domo(
        "broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS, "--log-level", "debug"
    )
    endpoint = await broker.endpoint()

    async def registered() -> None:
        assert "serves 'countdown'" in await broker.line("WorkerRegistered:", "stderr")

    with trio.fail_after(30):
        await hand_client_and_worker_through(endpoint, registered)
        completed = await broker.line("RequestCompleted:", "stderr")
        assert "for 'countdown' answered by worker " in completed
        assert "(3 partials, " in completed
        gone = await broker.line("WorkerDisconnected:", "stderr")
        assert gone.endswith(" left: worker-disconnect")  # and no DISCONNECT was sent to it
        assert not [line for line in broker.lines("stderr") if "WorkerExpired" in line]
        done = await run_domo("call", "mmi.service", "countdown", "--connect", endpoint)
        assert done.stdout == "404\n"


async def streaming_countdown(body: list[bytes]) -> AsyncIterator[list[bytes]]:
    """domo's worker side of ``countdown``; with a second frame ``slow`` it is busy for four
    heartbeat intervals before its FINAL."""
    for index in range(int(body[0])):
        yield [b"part", b"%d" % index]
    if body[1:] == [b"slow"]:
        await trio.sleep(4 * INTERVAL)
    yield [b"done", *body]


async def test_domo_client_and_worker_through_a_hand_framed_broker() -> None:
    """MDP-C-05, MDP-R-01: domo's Client gets every PARTIAL and the FINAL that domo's worker
    streams through the hand-framed broker; MDP-H-04: domo's worker heartbeats while busy and
    while idle, and the hand broker, which expires silent workers, keeps it; MDP-H-02: the hand
    broker's heartbeats keep domo's worker from reconnecting; MDP-W-17: after the hand broker's
    DISCONNECT the worker sends READY on a new socket and serves again; MDP-W-12: stopping
    domo's worker sends DISCONNECT."""
    broker = HandBroker("tcp://127.0.0.1:0", INTERVAL, LIVENESS)
    stop = threading.Event()
    worker_events: Recorder[WorkerEvent] = Recorder()

    def readies() -> list[bytes]:
        return [s.peer for s in broker.seen() if s.frames == [WORKER, W_READY, b"countdown"]]

    def heartbeats(peer: bytes) -> list[float]:
        return [s.at for s in broker.seen() if s.peer == peer and s.frames == [WORKER, W_HEARTBEAT]]

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as threads:
                threads.start_soon(in_thread, partial(broker.run, stop))
                try:
                    await domo_peers_through(broker, worker_events, readies, heartbeats)
                finally:
                    stop.set()
    finally:
        broker.close()
    assert broker.expired == []


async def domo_peers_through(
    broker: HandBroker,
    worker_events: Recorder[WorkerEvent],
    readies: Callable[[], list[bytes]],
    heartbeats: Callable[[bytes], list[float]],
) -> None:
    """The domo side of the test above: a worker and a client on the hand broker's endpoint."""
    async with trio.open_nursery() as workers:
        work = partial(run_worker, config=WORKER_CONFIG, on_event=worker_events)
        await workers.start(work, broker.endpoint, "countdown", streaming_countdown)
        async with Client(broker.endpoint, timeout=5.0, retries=0) as client:
            async with client.stream("countdown", b"2", b"x") as replies:
                got = [(reply.final, reply.body) async for reply in replies]
            assert got == [
                (False, [b"part", b"0"]),
                (False, [b"part", b"1"]),
                (True, [b"done", b"2", b"x"]),
            ]
            [first] = readies()
            busy_from = time.monotonic()
            assert await client.request("countdown", b"1", b"slow") == [b"done", b"1", b"slow"]
            busy_to = time.monotonic()
            await trio.sleep(IDLE)
            idle_to = time.monotonic()
            assert_steady(beats_between(heartbeats(first), busy_from, busy_to), busy_from, busy_to)
            assert_steady(beats_between(heartbeats(first), busy_to, idle_to), busy_to, idle_to)
            assert worker_events.of_type(ReconnectRequired) == []

            broker.disconnect(first)
            lost = await worker_events.wait_for(ReconnectRequired)
            assert lost.reason == "broker-disconnect"
            await until(lambda: len(readies()) == 2, "READY on the worker's new socket")
            second = readies()[1]
            assert second != first
            assert await client.request("countdown", b"0", b"again") == [b"done", b"0", b"again"]
        workers.cancel_scope.cancel()
    farewell = [WORKER, W_DISCONNECT]
    await until(
        lambda: any(s.peer == second and s.frames == farewell for s in broker.seen()),
        "DISCONNECT from the stopped worker",
    )
    assert not any(s.peer == first and s.frames == farewell for s in broker.seen())


async def test_hand_framed_peers_work_with_each_other() -> None:
    """The hand-framed client, worker and broker agree among themselves (the harness's own
    check): PARTIALs and FINAL, heartbeats both ways with nobody expired, DISCONNECT."""
    broker = HandBroker("tcp://127.0.0.1:0", INTERVAL, LIVENESS)
    stop = threading.Event()

    async def registered() -> None:
        await until(lambda: any(s.frames[:2] == [WORKER, W_READY] for s in broker.seen()), "READY")

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as threads:
                threads.start_soon(in_thread, partial(broker.run, stop))
                try:
                    await hand_client_and_worker_through_hand_broker(broker, registered)
                finally:
                    stop.set()
    finally:
        broker.close()
    assert broker.expired == []


async def hand_client_and_worker_through_hand_broker(
    broker: HandBroker, registered: Callable[[], Awaitable[None]]
) -> None:
    """The shared dialog, except ``mmi.service``, which the hand broker does not offer."""
    worker = HandWorker(broker.endpoint, b"countdown", INTERVAL, LIVENESS, countdown)
    client = HandClient(broker.endpoint)
    stop = threading.Event()
    try:
        async with trio.open_nursery() as threads:
            threads.start_soon(in_thread, partial(worker.run, stop))
            try:
                await registered()
                request = partial(client.request, b"countdown", b"2", timeout=5.0)
                assert await in_thread(request) == [
                    ("PARTIAL", [b"part", b"0"]),
                    ("PARTIAL", [b"part", b"1"]),
                    ("FINAL", [b"done", b"2"]),
                ]
                await trio.sleep(2 * SPAN)
            finally:
                stop.set()
    finally:
        client.close()
        worker.close()
    assert not worker.lost_broker
    assert_silent_after_disconnect(worker)
    assert [name for _, name, _ in worker.received].count("HEARTBEAT") >= SPAN / INTERVAL
