"""Many peers at once over tcp loopback: every reply checked, and peers that do not read.

A client that never reads must not stall anyone: with ROUTER_MANDATORY the broker's pump gets
EAGAIN for that client alone, the core drops its request (MDP-D-15), and everyone else is served.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio
import trio.lowlevel
import zmq

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import BrokerEvent, MessageDropped, RequestDropped, WorkerRegistered
from domo.trio import Client, run_worker, serve_broker

from .conftest import Recorder

pytestmark = pytest.mark.io

Context = zmq.Context[zmq.Socket[bytes]]
BROKER = BrokerConfig(heartbeat_interval=0.5, liveness=3)
WORKER = WorkerConfig(heartbeat_interval=0.5, liveness=3)


def named_worker(service: str, name: str):  # type: ignore[no-untyped-def]
    async def handler(body: list[bytes]) -> list[bytes]:
        await trio.lowlevel.checkpoint()  # let others run, as real work would
        return [service.encode(), name.encode(), *body]

    return handler


async def test_50_clients_10_workers_2_services_every_reply_checked(zmq_context: Context) -> None:
    """MDP-A-03, MDP-A-04, MDP-A-05: 500 requests from 50 clients to 2 services with 5 workers
    each; every reply carries its own request's body from a worker of the right service, and
    least-recently-used dispatch puts every worker to work."""
    events: Recorder[BrokerEvent] = Recorder()
    services = ["alpha", "beta"]
    served: Counter[tuple[bytes, bytes]] = Counter()
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, context=zmq_context, on_event=events)
            endpoint = (await nursery.start(serve, "tcp://127.0.0.1:0"))[0]
            for index in range(10):
                service = services[index % 2]
                work = partial(run_worker, config=WORKER, context=zmq_context)
                await nursery.start(work, endpoint, service, named_worker(service, f"w{index}"))
            await events.wait_for(
                WorkerRegistered, lambda _: len(events.of_type(WorkerRegistered)) == 10
            )

            async def client_task(index: int) -> None:
                async with Client(endpoint, timeout=30.0, context=zmq_context) as client:
                    for number in range(10):
                        service = services[(index + number) % 2]
                        body = b"client %d request %d" % (index, number)
                        reply = await client.request(service, body, b"%d" % number)
                        assert reply[0] == service.encode()
                        assert reply[2:] == [body, b"%d" % number]
                        served[reply[0], reply[1]] += 1

            async with trio.open_nursery() as clients:
                for index in range(50):
                    clients.start_soon(client_task, index)
            assert sum(served.values()) == 500
            for service_name, worker_name in served:
                assert int(worker_name[1:]) % 2 == services.index(service_name.decode())
            assert len(served) == 10
            nursery.cancel_scope.cancel()


async def test_flooding_clients_that_never_read_stall_no_one(zmq_context: Context) -> None:
    """MDP-D-15, MDP-S-02: raw DEALERs flood REQUESTs and never read; the broker drops their
    extra REQUESTs, finds their pipes full and drops their requests, while well-behaved
    clients of another service keep being served promptly."""
    events: Recorder[BrokerEvent] = Recorder()
    big = b"x" * 65536
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, context=zmq_context, on_event=events)
            endpoint = (await nursery.start(partial(serve, hwm=5), "tcp://127.0.0.1:0"))[0]
            work = partial(run_worker, config=WORKER, context=zmq_context)
            await nursery.start(work, endpoint, "sink", named_worker("sink", "sink"))
            await nursery.start(work, endpoint, "echo", named_worker("echo", "echo"))
            floods = []
            for _ in range(3):
                flood = zmq_context.socket(zmq.DEALER)
                flood.setsockopt(zmq.RCVHWM, 1)
                flood.setsockopt(zmq.RCVBUF, 4096)
                flood.setsockopt(zmq.SNDHWM, 100)
                flood.connect(endpoint)
                floods.append(flood)
            stop = trio.Event()

            async def flooder(flood: zmq.Socket[bytes]) -> None:
                while not stop.is_set():
                    for _ in range(20):
                        try:
                            flood.send_multipart([b"MDPC02", b"\x01", b"sink", big], zmq.NOBLOCK)
                        except zmq.Again:
                            break
                    await trio.sleep(0.001)

            latencies: list[float] = []

            async def polite(index: int) -> None:
                async with Client(endpoint, timeout=10.0, context=zmq_context) as client:
                    for number in range(20):
                        start = trio.current_time()
                        body = b"%d-%d" % (index, number)
                        assert await client.request("echo", body) == [b"echo", b"echo", body]
                        latencies.append(trio.current_time() - start)
                        await trio.sleep(0.01)

            try:
                async with trio.open_nursery() as load:
                    for flood in floods:
                        load.start_soon(flooder, flood)
                    async with trio.open_nursery() as clients:
                        for index in range(5):
                            clients.start_soon(polite, index)
                    await events.wait_for(RequestDropped, lambda e: e.reason == "client-congested")
                    stop.set()
            finally:
                for flood in floods:
                    flood.close(linger=0)
            assert len(latencies) == 100
            assert max(latencies) < 1.0  # measured: about 0.3 s on a loaded 2-core machine
            congested = {e.client for e in events.of_type(RequestDropped)}
            assert congested  # only raw flooders are ever dropped
            async with Client(endpoint, context=zmq_context) as client:
                assert await client.request("sink", b"still") == [b"sink", b"sink", b"still"]
            nursery.cancel_scope.cancel()


async def firehose(body: list[bytes]) -> AsyncIterator[bytes]:
    chunk = b"y" * 16384
    for index in range(int(body[0])):
        yield b"%d" % index + chunk


async def test_streaming_to_a_client_that_never_reads_stalls_no_one(
    zmq_context: Context,
) -> None:
    """MDP-D-15: a worker streams PARTIALs to a client that never reads; its pipe fills, the
    broker drops the request and discards the rest of the stream; the worker ends the stream
    and serves the next request, and other clients are served all along."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, context=zmq_context, on_event=events)
            endpoint = (await nursery.start(partial(serve, hwm=100), "tcp://127.0.0.1:0"))[0]
            work = partial(run_worker, config=WORKER, context=zmq_context)
            await nursery.start(work, endpoint, "hose", firehose)
            await nursery.start(work, endpoint, "echo", named_worker("echo", "echo"))
            mute = zmq_context.socket(zmq.DEALER)
            try:
                mute.setsockopt(zmq.RCVHWM, 1)
                mute.setsockopt(zmq.RCVBUF, 4096)
                mute.connect(endpoint)
                mute.send_multipart([b"MDPC02", b"\x01", b"hose", b"3000"])
                async with Client(endpoint, timeout=10.0, context=zmq_context) as client:
                    for number in range(50):
                        body = b"%d" % number
                        assert await client.request("echo", body) == [b"echo", b"echo", body]
                    dropped = await events.wait_for(RequestDropped)
                    assert dropped.reason == "client-congested"
                    assert dropped.service == b"hose"
                    reply = await client.request("hose", b"2")
                    assert reply == [b"1" + b"y" * 16384]
            finally:
                mute.close(linger=0)
            discarded = [e for e in events.of_type(MessageDropped) if "gone" in e.reason]
            assert discarded  # the rest of the stream went nowhere
            nursery.cancel_scope.cancel()
