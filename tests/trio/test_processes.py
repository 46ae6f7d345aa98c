"""Peers in other processes that die, freeze or restart (``tests/trio/peers.py``).

Workers and brokers run as subprocesses that the test kills or stops by PID. Heartbeats are
fast (0.1 s, liveness 3) so a lost peer is noticed in about 0.3 s.
"""

from __future__ import annotations

import os
import signal
from functools import partial

import pytest
import trio
import zmq

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import (
    BrokerEvent,
    ReconnectRequired,
    RequestCompleted,
    RequestRedispatched,
    WorkerEvent,
    WorkerExpired,
    WorkerRegistered,
)
from domo.trio import Client, run_worker, serve_broker

from .conftest import Recorder, Spawn, free_tcp_port

pytestmark = [pytest.mark.io, pytest.mark.slow]

Context = zmq.Context[zmq.Socket[bytes]]
INTERVAL = 0.1
SPAN = 3 * INTERVAL
BROKER = BrokerConfig(heartbeat_interval=INTERVAL, liveness=3)
WORKER = WorkerConfig(heartbeat_interval=INTERVAL, liveness=3, reconnect_max=0.5)


async def worker_b(body: list[bytes]) -> list[bytes]:
    return [b"B", *body]


async def start_broker_here(nursery: trio.Nursery, events: Recorder[BrokerEvent]) -> str:
    serve = partial(serve_broker, config=BROKER, on_event=events)
    bound: list[str] = await nursery.start(serve, "tcp://127.0.0.1:0")
    return bound[0]


async def test_worker_killed_mid_request_the_request_completes_elsewhere_once(
    spawn: Spawn, zmq_context: Context
) -> None:
    """MDP-S-01, MDP-D-08, MDP-D-10: worker A is SIGKILLed while handling a request; the broker
    finds it gone (unreachable or expired), re-dispatches the request to worker B, and the
    client's socket receives exactly one FINAL, B's."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            endpoint = await start_broker_here(nursery, events)
            peer = await spawn("worker", endpoint, "job", "A", str(INTERVAL), "30")
            a = (await events.wait_for(WorkerRegistered)).worker
            client = zmq_context.socket(zmq.DEALER)  # raw, to see every message it receives
            try:
                client.connect(endpoint)
                client.send_multipart([b"MDPC02", b"\x01", b"job", b"r1"])
                assert await peer.line("start") == "start r1"
                work = partial(run_worker, config=WORKER)
                await nursery.start(work, endpoint, "job", worker_b)
                b = (await events.wait_for(WorkerRegistered, lambda e: e.worker != a)).worker
                os.kill(peer.pid, signal.SIGKILL)
                received: list[list[bytes]] = []
                while not received:
                    await trio.sleep(0.01)
                    while client.poll(0):
                        received.append(client.recv_multipart())
                await trio.sleep(4 * SPAN)  # anything more would have arrived by now
                while client.poll(0):
                    received.append(client.recv_multipart())
            finally:
                client.close(linger=0)
            assert received == [[b"MDPC02", b"\x03", b"job", b"B", b"r1"]]
            redispatched = events.of_type(RequestRedispatched)
            assert [(r.lost_worker, r.request_id) for r in redispatched] == [(a, 1)]
            completed = events.of_type(RequestCompleted)
            assert [(c.request_id, c.worker) for c in completed] == [(1, b)]
            nursery.cancel_scope.cancel()


async def test_frozen_worker_is_expired_and_its_request_redispatched(spawn: Spawn) -> None:
    """MDP-H-05, MDP-D-04, MDP-H-07: worker A is frozen with SIGSTOP while busy; the broker
    expires it after liveness*interval and re-dispatches to B; after SIGCONT, A notices the
    silent broker (MDP-H-06), drops the request and registers again on a new socket."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            endpoint = await start_broker_here(nursery, events)
            peer = await spawn("worker", endpoint, "job", "A", str(INTERVAL), "30")
            a = (await events.wait_for(WorkerRegistered)).worker
            async with Client(endpoint, timeout=10.0) as client:
                replies: list[list[bytes]] = []

                async def ask() -> None:
                    replies.append(await client.request("job", b"r1"))

                async with trio.open_nursery() as requests:
                    requests.start_soon(ask)
                    assert await peer.line("start") == "start r1"
                    work = partial(run_worker, config=WORKER)
                    await nursery.start(work, endpoint, "job", worker_b)
                    b = (await events.wait_for(WorkerRegistered, lambda e: e.worker != a)).worker
                    os.kill(peer.pid, signal.SIGSTOP)
                try:
                    assert replies == [[b"B", b"r1"]]
                    expired = events.of_type(WorkerExpired)
                    assert [e.worker for e in expired] == [a]
                    assert SPAN <= expired[0].at - expired[0].last_heard < SPAN + 1.0
                finally:
                    os.kill(peer.pid, signal.SIGCONT)
                again = await events.wait_for(WorkerRegistered, lambda e: e.worker not in (a, b))
                assert again.service == b"job"
                assert await client.request("job", b"r2") in ([b"A", b"r2"], [b"B", b"r2"])
            completed = events.of_type(RequestCompleted)
            assert [c.request_id for c in completed] == [1, 2]
            assert completed[0].worker == b
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
async def test_restarted_broker_gets_workers_back_and_client_retries_succeed(
    spawn: Spawn, stop: signal.Signals
) -> None:
    """MDP-H-06 (SIGKILL: the broker falls silent) and MDP-W-14, MDP-W-17 (SIGTERM: a graceful
    stop sends DISCONNECT): the worker reconnects until the broker is back on the same port and
    registers again; MDP-C-08: a request made meanwhile succeeds by the client's resends."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    worker_events: Recorder[WorkerEvent] = Recorder()
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            first = await spawn("broker", endpoint, str(INTERVAL))
            assert await first.line("bound") == f"bound {endpoint}"
            work = partial(run_worker, config=WORKER, on_event=worker_events)
            await nursery.start(work, endpoint, "echo", worker_b)
            await first.line("WorkerRegistered(")
            async with Client(endpoint, timeout=0.5, retries=30) as client:
                assert await client.request("echo", b"before") == [b"B", b"before"]
                os.kill(first.pid, stop)
                await first.process.wait()
                lost = await worker_events.wait_for(ReconnectRequired)
                expected = "broker-disconnect" if stop == signal.SIGTERM else "broker-lost"
                assert lost.reason == expected
                replies: list[list[bytes]] = []

                async def ask() -> None:
                    replies.append(await client.request("echo", b"during"))

                async with trio.open_nursery() as requests:
                    requests.start_soon(ask)
                    await trio.sleep(1.0)
                    assert not replies
                    second = await spawn("broker", endpoint, str(INTERVAL))
                    assert await second.line("bound") == f"bound {endpoint}"
                assert replies == [[b"B", b"during"]]
                await second.line("WorkerRegistered(")
                assert await client.request("echo", b"after") == [b"B", b"after"]
            nursery.cancel_scope.cancel()
