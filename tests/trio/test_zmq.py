"""The runtime over real ZeroMQ sockets on loopback: tcp://127.0.0.1, ipc:// in a temp dir, inproc.

Each test runs broker, workers and clients in this process (with the real clock and short
heartbeat intervals) and checks every reply and the broker's events.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
from collections.abc import AsyncIterator, Mapping
from functools import partial
from pathlib import Path
from typing import cast

import pytest
import trio
import zmq

import domo
from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import (
    BrokerEvent,
    ReconnectRequired,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestQueued,
    WorkerEvent,
    WorkerRegistered,
)
from domo.trio import (
    SENT,
    Client,
    ClientClosed,
    Handler,
    RequestTimeout,
    ZmqTransport,
    run_worker,
    serve_broker,
)

from .conftest import Recorder

pytestmark = pytest.mark.io

Context = zmq.Context[zmq.Socket[bytes]]
BROKER = BrokerConfig(heartbeat_interval=0.5, liveness=3)
WORKER = WorkerConfig(heartbeat_interval=0.5, liveness=3, reconnect_initial=0.05)


async def echo(body: list[bytes]) -> list[bytes]:
    return body


async def count(body: list[bytes]) -> AsyncIterator[bytes]:
    for index in range(int(body[0])):
        yield b"part %d" % index


async def slow(body: list[bytes]) -> list[bytes]:
    await trio.sleep(float(body[0]))
    return body


def endpoint_for(kind: str, tmp_path: Path) -> str:
    return {
        "tcp": "tcp://127.0.0.1:0",
        "ipc": f"ipc://{tmp_path}/broker.ipc",
        "inproc": "inproc://broker",
    }[kind]


async def start(
    nursery: trio.Nursery,
    endpoint: str,
    context: Context | None,
    events: Recorder[BrokerEvent],
    workers: Mapping[str, Handler],
) -> str:
    """A broker and one worker per service; returns the bound endpoint once all registered."""
    serve = partial(serve_broker, config=BROKER, context=context, on_event=events)
    bound: list[str] = await nursery.start(serve, endpoint)
    for service, handler in workers.items():
        work = partial(run_worker, config=WORKER, context=context)
        await nursery.start(work, bound[0], service, handler)
    await events.wait_for(
        WorkerRegistered, lambda _: len(events.of_type(WorkerRegistered)) == len(workers)
    )
    return bound[0]


@pytest.mark.parametrize("kind", ["tcp", "ipc", "inproc"])
async def test_request_partials_and_final_on_every_transport(
    kind: str, tmp_path: Path, zmq_context: Context
) -> None:
    """MDP-A-01, MDP-C-04, MDP-W-07: one ROUTER, DEALER clients and workers; MDP-R-01,
    MDP-C-05: a request gets PARTIAL*, then one FINAL; MDP-M-01: mmi.service is answered."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            workers: dict[str, Handler] = {"echo": echo, "count": count}
            endpoint = await start(
                nursery, endpoint_for(kind, tmp_path), zmq_context, events, workers
            )
            if kind == "tcp":
                assert endpoint.startswith("tcp://127.0.0.1:")
                assert not endpoint.endswith(":0")
            async with Client(endpoint, context=zmq_context) as client:
                assert await client.request("echo", b"a", b"", b"c") == [b"a", b"", b"c"]
                replies = []
                async with client.stream("count", b"4") as stream:
                    async for reply in stream:
                        replies.append((reply.body, reply.final))
                assert replies == [
                    ([b"part 0"], False),
                    ([b"part 1"], False),
                    ([b"part 2"], False),
                    ([b"part 3"], True),
                ]
                assert await client.request("mmi.service", b"count") == [b"200"]
                assert await client.request("mmi.service", b"nothing") == [b"404"]
            completed = events.of_type(RequestCompleted)
            assert [(c.service, c.partials) for c in completed] == [(b"echo", 0), (b"count", 3)]
            nursery.cancel_scope.cancel()


async def test_tcp_and_ipc_and_inproc_on_one_broker(tmp_path: Path, zmq_context: Context) -> None:
    """MDP-A-02: one ROUTER bound to several endpoints of different transports; a worker on one
    serves clients on the others."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, context=zmq_context, on_event=events)
            ipc = f"ipc://{tmp_path}/b.ipc"
            bound = await nursery.start(serve, "tcp://127.0.0.1:0", ipc, "inproc://both")
            assert bound[1:] == [ipc, "inproc://both"]
            work = partial(run_worker, config=WORKER, context=zmq_context)
            await nursery.start(work, "inproc://both", "echo", echo)
            await events.wait_for(WorkerRegistered)
            for endpoint in bound:
                async with Client(endpoint, context=zmq_context) as client:
                    assert await client.request("echo", endpoint.encode()) == [endpoint.encode()]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("size", [1 << 20, 64 << 20], ids=["1MiB", "64MiB"])
async def test_large_bodies_arrive_intact(size: int) -> None:
    """MDP-S-03: bodies pass through the broker unchanged, up to 64 MiB, in several frames
    (with the byte bounds raised to let 64 MiB through: MDP-D-25, MDP-D-27)."""
    events: Recorder[BrokerEvent] = Recorder()
    body = [bytes(range(256)) * (size // 256), b"", b"tail"]
    digest = [hashlib.sha256(frame).digest() for frame in body]

    async def checked_echo(request: list[bytes]) -> list[bytes]:
        assert [hashlib.sha256(frame).digest() for frame in request] == digest
        return [*request, b"checked"]

    limits = {"max_message_bytes": 65 << 20, "max_peer_bytes": 260 << 20}
    slow_beat = BrokerConfig(heartbeat_interval=2.0, liveness=3, max_held_bytes=130 << 20, **limits)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=slow_beat, on_event=events)
            bound = await nursery.start(serve, "tcp://127.0.0.1:0")
            work = partial(run_worker, config=WorkerConfig(heartbeat_interval=2.0))
            await nursery.start(work, bound[0], "big", checked_echo)
            async with Client(bound[0], timeout=30.0, retries=0) as client:
                reply = await client.request("big", *body)
            assert reply[-1] == b"checked"
            assert [hashlib.sha256(frame).digest() for frame in reply[:-1]] == digest
            assert events.of_type(RequestCompleted)[0].size == size + 4 + 7
            nursery.cancel_scope.cancel()


def address(buffer: bytes | memoryview) -> int:
    """Where the bytes of ``buffer`` are in memory (bytes, or a writable view of a frame)."""
    if isinstance(buffer, bytes):
        return ctypes.cast(ctypes.c_char_p(buffer), ctypes.c_void_p).value or 0
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


async def recv_frames(socket: zmq.Socket[bytes]) -> list[zmq.Frame]:
    """The next message on a DEALER of this test, as frames (without a copy)."""
    while not cast(int, socket.get(zmq.EVENTS)) & zmq.POLLIN:  # re-arms the edge-triggered FD
        await trio.lowlevel.wait_readable(cast(int, socket.get(zmq.FD)))
    return socket.recv_multipart(copy=False)


async def test_a_large_body_crosses_the_broker_without_a_copy(zmq_context: Context) -> None:
    """MDP-S-03: over inproc://, which moves ZeroMQ's messages without copying them, a body
    frame of 64 KiB or more reaches the worker, and its reply the client, at the very address
    the client's ``bytes`` had: the broker relays it as the frame it received. A small frame is
    copied, as ``bytes``; both arrive intact."""
    events: Recorder[BrokerEvent] = Recorder()
    body = bytes(range(256)) * 400  # 100 KiB
    small = b"small frame"
    worker = zmq_context.socket(zmq.DEALER)
    client = zmq_context.socket(zmq.DEALER)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                serve = partial(serve_broker, config=BROKER, context=zmq_context, on_event=events)
                await nursery.start(serve, "inproc://zero-copy")
                worker.connect("inproc://zero-copy")
                client.connect("inproc://zero-copy")
                worker.send_multipart([b"MDPW02", b"\x01", b"big"])
                await events.wait_for(WorkerRegistered)
                client.send_multipart([b"MDPC02", b"\x01", b"big", body, small], copy=False)
                request = await recv_frames(worker)
                assert [f.bytes for f in request[:2]] == [b"MDPW02", b"\x02"]
                assert [f.bytes for f in request[3:]] == [b"", body, small]
                assert address(request[4].buffer) == address(body)
                assert address(request[5].buffer) != address(small)
                worker.send_multipart([b"MDPW02", b"\x04", *request[2:]], copy=False)
                reply = await recv_frames(client)
                assert [f.bytes for f in reply] == [b"MDPC02", b"\x03", b"big", body, small]
                assert address(reply[3].buffer) == address(body)
                nursery.cancel_scope.cancel()
    finally:
        worker.close(0)
        client.close(0)


async def test_cancelled_requests_leave_the_client_usable(zmq_context: Context) -> None:
    """MDP-C-07, MDP-C-08: requests cancelled by the caller replace their session's socket;
    the next request on the same Client gets its own reply; a request in flight when the
    Client closes raises ClientClosed; nothing leaks (ResourceWarning is an error here)."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            endpoint = await start(
                nursery, "inproc://cancel", zmq_context, events, {"slow": slow, "echo": echo}
            )
            async with Client(endpoint, timeout=5.0, context=zmq_context) as client:
                for index in range(3):
                    with trio.move_on_after(0.05) as scope:
                        await client.request("slow", b"0.2", b"%d" % index)
                    assert scope.cancelled_caught
                    assert await client.request("echo", b"next %d" % index) == [b"next %d" % index]
            queued = [(e.service, e.client) for e in events.of_type(RequestQueued)]
            assert [service for service, _ in queued] == [b"slow", b"echo"] * 3
            for (_, cancelled), (_, after) in zip(queued[0::2], queued[1::2], strict=True):
                assert cancelled != after  # a fresh socket after each cancelled request
            clients = {client for _, client in queued}

            failures: list[BaseException] = []
            async with Client(endpoint, timeout=5.0, context=zmq_context) as client:

                async def doomed() -> None:
                    try:
                        await client.request("slow", b"1.0")
                    except ClientClosed as error:
                        failures.append(error)

                nursery.start_soon(doomed)
                await events.wait_for(RequestDispatched, lambda e: e.client not in clients)
            await trio.sleep(0.01)
            assert [type(f) for f in failures] == [ClientClosed]
            nursery.cancel_scope.cancel()


async def drip(body: list[bytes]) -> AsyncIterator[bytes]:
    for part in body:
        await trio.sleep(0.2)
        yield part


async def test_reply_to_a_vanished_client_is_reported_unreachable(zmq_context: Context) -> None:
    """MDP-D-15: a client that closed its socket is unreachable (EHOSTUNREACH with
    ROUTER_MANDATORY); the pump tells the core, which drops the request; the worker carries on
    and serves the next client."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            workers = {"drip": drip}
            endpoint = await start(nursery, "tcp://127.0.0.1:0", zmq_context, events, workers)
            raw = zmq_context.socket(zmq.DEALER)
            raw.connect(endpoint)
            raw.send_multipart([b"MDPC02", b"\x01", b"drip", b"a", b"b", b"c"])
            dispatched = await events.wait_for(RequestDispatched)
            raw.close(linger=0)
            dropped = await events.wait_for(RequestDropped)
            assert (dropped.client, dropped.reason) == (dispatched.client, "client-unreachable")
            async with Client(endpoint, context=zmq_context) as client:
                assert await client.request("drip", b"x", b"y") == [b"y"]
            nursery.cancel_scope.cancel()


async def test_worker_keeps_receiving_while_its_socket_is_full(zmq_context: Context) -> None:
    """A DEALER whose pipe is full (EAGAIN) keeps the message and waits for POLLIN|POLLOUT: the
    handler is held back, the session still hears the broker's heartbeats (no reconnect),
    and once the broker reads, every PARTIAL arrives, in order, then the FINAL."""
    total = 5000
    yielded: list[int] = []
    worker_events: Recorder[WorkerEvent] = Recorder()

    async def flood(body: list[bytes]) -> AsyncIterator[bytes]:
        for index in range(total):
            yielded.append(index)
            yield b"%d" % index

    # This test plays the broker by hand, on a ROUTER made by the runtime's own transport.
    fake_broker, _ = ZmqTransport(zmq_context).bind(["inproc://by-hand"], hwm=100)
    config = WorkerConfig(heartbeat_interval=0.1, liveness=3)

    def heartbeat(identity: bytes) -> None:
        assert fake_broker.send([identity, b"MDPW02", b"\x05"]) == SENT

    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                work = partial(run_worker, config=config, context=zmq_context)
                await nursery.start(
                    partial(work, on_event=worker_events), "inproc://by-hand", "flood", flood
                )
                await fake_broker.wait(False)
                [[identity, *ready]] = fake_broker.receive(1)
                assert isinstance(identity, bytes)  # small frames are bytes
                assert ready == [b"MDPW02", b"\x01", b"flood"]
                request = [identity, b"MDPW02", b"\x02", b"C", b"", b"go"]
                assert fake_broker.send(request) == SENT
                for _ in range(10):  # 1 s of not reading, while heartbeating to the worker
                    await trio.sleep(0.1)
                    heartbeat(identity)
                assert 100 < len(yielded) < total  # the handler is held back by the full pipe
                assert not worker_events.of_type(ReconnectRequired)
                replies: list[list[bytes | memoryview]] = []
                while not replies or replies[-1][2] != b"\x04":
                    with trio.move_on_after(0.1):
                        await fake_broker.wait(False)
                    heartbeat(identity)
                    for message in fake_broker.receive(256):
                        assert message[0] == identity
                        if message[1:3] != [b"MDPW02", b"\x05"]:
                            replies.append(message)
                assert [m[2] for m in replies] == [b"\x03"] * (total - 1) + [b"\x04"]
                assert [m[3:] for m in replies] == [[b"C", b"", b"%d" % i] for i in range(total)]
                assert not worker_events.of_type(ReconnectRequired)
                nursery.cancel_scope.cancel()
    finally:
        fake_broker.close(0)


async def test_domo_call_from_synchronous_code() -> None:
    """MDP-C-08: ``domo.call`` runs one request with Trio in its own thread here (as a script
    would run it); it returns the FINAL body or raises RequestTimeout after its retries."""
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            endpoint = await start(nursery, "tcp://127.0.0.1:0", None, events, {"echo": echo})
            call = partial(domo.call, endpoint, "echo", b"from", b"sync", timeout=2.0)
            assert await trio.to_thread.run_sync(call) == [b"from", b"sync"]
            nobody = partial(domo.call, endpoint, "nobody", b"x", timeout=0.2, retries=1)
            with pytest.raises(RequestTimeout) as failure:
                await trio.to_thread.run_sync(nobody)
            assert failure.value.attempts == 2
            nursery.cancel_scope.cancel()


async def test_cancelling_everything_at_any_point_leaks_nothing() -> None:
    """Broker, worker and client, each with its own context, cancelled together at several
    points of a request's life: every socket and context is closed (a leak would raise
    ResourceWarning, an error here) and shutdown takes well under a second."""
    for deadline in (0.0, 0.002, 0.01, 0.05, 0.15):
        with trio.fail_after(10):
            with trio.move_on_after(deadline):
                async with trio.open_nursery() as nursery:
                    bound = await nursery.start(serve_broker, "tcp://127.0.0.1:0")
                    await nursery.start(run_worker, bound[0], "slow", slow)
                    async with Client(bound[0]) as client:
                        await client.request("slow", b"0.1")
                        await trio.sleep_forever()
            stopping = trio.current_time()
        assert trio.current_time() - stopping < 1.0
        gc.collect()


async def test_context_termination_is_bounded_when_a_socket_is_left_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A socket left open makes ``context.term()`` wait forever: ``ZmqTransport.aclose`` gives
    up after ``term_timeout``, even when its caller is being cancelled, and logs an error."""
    transport = ZmqTransport()
    transport.term_timeout = 0.2
    forgotten = transport.context.socket(zmq.DEALER)
    try:
        with trio.fail_after(5):
            started = trio.current_time()
            with trio.CancelScope() as scope:
                scope.cancel()  # aclose runs shielded, as it does when its owner is cancelled
                await transport.aclose()
            assert 0.2 <= trio.current_time() - started < 2.0
        assert "not terminated after 0.2 s; abandoned" in caplog.text
        assert not transport.context.closed
    finally:
        forgotten.close(linger=0)  # lets the abandoned term() finish
    with trio.fail_after(5):
        while not transport.context.closed:  # noqa: ASYNC110 (a libzmq thread, no event to wait on)
            await trio.sleep(0.01)
