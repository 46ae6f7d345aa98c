"""The processes of benchmarks/brokers.py: brokers, echo workers, clients and idle-peer farms.

Run as ``python benchmarks/_peers.py ROLE SYSTEM [options]``; ``brokers.py`` starts one process
per role and talks to it over stdin/stdout. Only ``zmq`` is imported at the top: majortomo's
processes run in their own virtualenv, where neither domo nor Trio is installed, so each system's
code is imported inside the function that uses it.

Systems per role:

- broker: ``domo`` (``domo.trio.serve_broker``), ``asyncio`` (``domo.asyncio.serve_broker``),
  ``majortomo`` (its ``Broker``), ``raw`` (a ROUTER that
  forwards bodies between clients and workers with no protocol at all: the ceiling);
- worker and client: ``domo`` (``domo.trio``'s ``run_worker``, ``Client``), ``sync``
  (``domo.sync``: ``Client.map`` from one thread; ``sync-threads``: a thread per session),
  ``asyncio`` (``domo.asyncio``; ``asyncio-uvloop`` on uvloop's loop, broker too), ``hand``
  (blocking pyzmq framed by hand per RFC 18, against domo's broker), ``majortomo`` (its
  ``Worker`` and ``Client``), ``raw``.

A client process prints ``warm`` after its warm-up requests, waits for ``go`` on stdin, sends
requests back to back on each of its sessions for ``--duration`` seconds and prints one JSON line:
the count, the elapsed wall time and each request's latency. Every reply is checked against the
body sent, so a broken system fails rather than printing a fast number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from functools import partial
from typing import Any

import zmq

CLIENT = b"MDPC02"
WORKER = b"MDPW02"
C_REQUEST, C_FINAL = b"\x01", b"\x03"  # RFC 18's client commands (majortomo numbers its own)
W_READY, W_REQUEST, W_FINAL, W_HEARTBEAT = b"\x01", b"\x02", b"\x04", b"\x05"
RAW_READY = b"ready"  # the raw forwarder's only "protocol": a worker says it exists
SERVICE = b"echo"

Socket = zmq.Socket[bytes]


def _context(sockets: int = 64) -> zmq.Context[Socket]:
    context: zmq.Context[Socket] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, sockets + 64)
    return context


# --- brokers -----------------------------------------------------------------------------------


def broker(system: str, endpoint: str, heartbeat: float) -> None:
    """Serve on ``endpoint`` until killed; print ``ready`` once bound."""
    if system == "domo":
        import trio

        from domo.protocol import BrokerConfig
        from domo.trio import serve_broker

        async def serve() -> None:
            async with trio.open_nursery() as nursery:
                config = BrokerConfig(heartbeat_interval=heartbeat)
                await nursery.start(partial(serve_broker, endpoint, config=config))
                print("ready", flush=True)

        trio.run(serve)
    elif system in ("asyncio", "asyncio-uvloop"):
        import asyncio

        from domo.asyncio import serve_broker as serve_asyncio
        from domo.protocol import BrokerConfig

        async def serve_on_asyncio() -> None:
            started: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
            started.add_done_callback(lambda _: print("ready", flush=True))
            config = BrokerConfig(heartbeat_interval=heartbeat)
            await serve_asyncio(endpoint, config=config, started=started)

        asyncio.run(serve_on_asyncio())
    elif system == "majortomo":
        from majortomo.broker import Broker

        mt = Broker(bind=endpoint, heartbeat_interval=heartbeat, zmq_context=_context())
        mt.bind()
        print("ready", flush=True)
        while True:
            message = mt.receive()
            if message:
                mt.handle_message(message)
    else:
        _raw_forwarder(endpoint)


def _raw_forwarder(endpoint: str) -> None:
    """Clients send ``[body]``, workers ``[client, body]``: a queue of idle workers, no checks."""
    socket = _context().socket(zmq.ROUTER)
    socket.bind(endpoint)
    print("ready", flush=True)
    idle: deque[bytes] = deque()
    waiting: deque[list[Any]] = deque()  # zmq.Frame lists
    workers: set[bytes] = set()
    while True:
        frames = socket.recv_multipart(copy=False)
        peer = frames[0].bytes
        if peer in workers:
            socket.send_multipart(frames[1:], copy=False)  # [client, body...] -> the client
            idle.append(peer)
        elif len(frames) == 2 and frames[1].bytes == RAW_READY:
            workers.add(peer)
            idle.append(peer)
        else:
            waiting.append(frames)
        while idle and waiting:
            socket.send_multipart([idle.popleft(), *waiting.popleft()], copy=False)


# --- workers -----------------------------------------------------------------------------------


def worker(system: str, endpoint: str, heartbeat: float) -> None:
    """One echo worker for ``echo`` until killed."""
    if system == "domo":
        import trio

        from domo.protocol import WorkerConfig
        from domo.trio import run_worker

        async def echo(body: list[bytes]) -> list[bytes]:
            return body

        config = WorkerConfig(heartbeat_interval=heartbeat)
        trio.run(lambda: run_worker(endpoint, SERVICE, echo, config=config))
    elif system in ("sync", "sync-threads"):
        import domo.sync
        from domo.protocol import WorkerConfig

        def echo_blocking(body: list[bytes]) -> list[bytes]:
            return body

        config = WorkerConfig(heartbeat_interval=heartbeat)
        domo.sync.run_worker(endpoint, SERVICE, echo_blocking, config=config)
    elif system in ("asyncio", "asyncio-uvloop"):
        import asyncio

        import domo.asyncio
        from domo.protocol import WorkerConfig

        async def echo_async(body: list[bytes]) -> list[bytes]:
            return body

        config = WorkerConfig(heartbeat_interval=heartbeat)
        asyncio.run(domo.asyncio.run_worker(endpoint, SERVICE, echo_async, config=config))
    elif system == "majortomo":
        import majortomo

        mt = majortomo.Worker(endpoint, SERVICE, heartbeat_interval=heartbeat)
        mt.connect()
        while True:
            client, body = mt.wait_for_request()
            mt.send_reply_final(client, body)
    elif system == "hand":
        _hand_worker(endpoint, heartbeat)
    else:
        socket = _context().socket(zmq.DEALER)
        socket.connect(endpoint)
        socket.send(RAW_READY)
        while True:
            socket.send_multipart(socket.recv_multipart(copy=False), copy=False)


def _hand_worker(endpoint: str, heartbeat: float) -> None:
    socket = _context().socket(zmq.DEALER)
    socket.connect(endpoint)
    socket.send_multipart([WORKER, W_READY, SERVICE])
    last_sent = time.monotonic()
    while True:
        if socket.poll(int(heartbeat * 1000)):
            frames = socket.recv_multipart(copy=False)
            if frames[1].bytes == W_REQUEST:
                # [header, REQUEST, client, empty, body...] -> [header, FINAL, client, empty, body]
                socket.send_multipart([WORKER, W_FINAL, *frames[2:]], copy=False)
                last_sent = time.monotonic()
        if time.monotonic() - last_sent >= heartbeat:
            socket.send_multipart([WORKER, W_HEARTBEAT])
            last_sent = time.monotonic()


# --- clients -----------------------------------------------------------------------------------


def client(
    system: str, endpoint: str, sessions: int, size: int, duration: float, pause: float
) -> None:
    """Warm up, print ``warm``, wait for ``go``, measure, print the JSON record.

    ``pause``: seconds each session waits after a reply before its next request.
    """
    body = os.urandom(size)
    if system == "domo":
        record = _domo_client(endpoint, sessions, body, duration, pause)
    elif system == "sync":
        record = _sync_map_client(endpoint, sessions, body, duration, pause)
    elif system == "sync-threads":
        record = _sync_client(endpoint, sessions, body, duration, pause)
    elif system in ("asyncio", "asyncio-uvloop"):
        record = _asyncio_client(endpoint, sessions, body, duration, pause)
    else:
        record = _blocking_client(system, endpoint, sessions, body, duration, pause)
    print(json.dumps(record | {"threads": _THREADS}), flush=True)


_THREADS: dict[str, float] = {}  # this process's threads at the end of the measured window


def _window_end() -> None:
    """Note the CPU and context switches of this process's threads (``brokers.thread_stats``)
    while they all run: the record carries them, read before the client's context ends."""
    from brokers import thread_stats

    _THREADS.update(thread_stats([os.getpid()]))


def _wait_for_go() -> None:
    print("warm", flush=True)
    line = sys.stdin.readline()
    assert line.strip() == "go", line


def _domo_client(
    endpoint: str, sessions: int, body: bytes, duration: float, pause: float
) -> dict[str, Any]:
    import trio

    from domo.trio import Client

    latencies: list[float] = []

    async def loop(client: Client, stop: float) -> None:
        while time.perf_counter() < stop:
            start = time.perf_counter()
            reply = await client.request(SERVICE, body)
            latencies.append(time.perf_counter() - start)
            assert reply == [body]
            if pause:
                await trio.sleep(pause)

    async def run() -> dict[str, Any]:
        async with Client(endpoint, concurrency=sessions, timeout=30.0) as client:
            async with trio.open_nursery() as nursery:
                stop = time.perf_counter() + 0.3
                for _ in range(sessions):
                    nursery.start_soon(loop, client, stop)
            latencies.clear()
            await trio.to_thread.run_sync(_wait_for_go)
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(sessions):
                    nursery.start_soon(loop, client, start + duration)
            elapsed = time.perf_counter() - start
            _window_end()
        return {"count": len(latencies), "elapsed": elapsed, "latencies": latencies}

    return trio.run(run)


def _sync_client(
    endpoint: str, sessions: int, body: bytes, duration: float, pause: float
) -> dict[str, Any]:
    """``domo.sync.Client`` shared by one thread per session (its pool serves them)."""
    import threading

    from domo.sync import Client

    latencies: list[float] = []

    def loop(client: Client, stop: float) -> None:
        while time.perf_counter() < stop:
            start = time.perf_counter()
            reply = client.request(SERVICE, body)
            latencies.append(time.perf_counter() - start)
            assert reply == [body]
            if pause:
                time.sleep(pause)

    def run(client: Client, stop: float) -> None:
        threads = [threading.Thread(target=loop, args=(client, stop)) for _ in range(sessions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    with Client(endpoint, concurrency=sessions, timeout=30.0) as client:
        run(client, time.perf_counter() + 0.3)
        latencies.clear()
        _wait_for_go()
        start = time.perf_counter()
        run(client, start + duration)
        elapsed = time.perf_counter() - start
        _window_end()
    return {"count": len(latencies), "elapsed": elapsed, "latencies": latencies}


def _sync_map_client(
    endpoint: str, sessions: int, body: bytes, duration: float, pause: float
) -> dict[str, Any]:
    """``domo.sync.Client.map`` from one thread, ``sessions`` requests in flight."""
    from domo.sync import Client

    latencies: list[float] = []
    started: deque[float] = deque()

    def bodies(stop: float) -> Any:
        while time.perf_counter() < stop:
            started.append(time.perf_counter())
            yield body
            if pause:
                time.sleep(pause)  # only (d) pauses, with a single session

    def run(client: Client, stop: float) -> None:
        for reply in client.map(SERVICE, bodies(stop)):
            latencies.append(time.perf_counter() - started.popleft())
            assert reply == [body]

    with Client(endpoint, concurrency=sessions, timeout=30.0) as client:
        run(client, time.perf_counter() + 0.3)
        latencies.clear()
        _wait_for_go()
        start = time.perf_counter()
        run(client, start + duration)
        elapsed = time.perf_counter() - start
        _window_end()
    return {"count": len(latencies), "elapsed": elapsed, "latencies": latencies}


def _asyncio_client(
    endpoint: str, sessions: int, body: bytes, duration: float, pause: float
) -> dict[str, Any]:
    import asyncio

    from domo.asyncio import Client

    latencies: list[float] = []

    async def loop(client: Client, stop: float) -> None:
        while time.perf_counter() < stop:
            start = time.perf_counter()
            reply = await client.request(SERVICE, body)
            latencies.append(time.perf_counter() - start)
            assert reply == [body]
            if pause:
                await asyncio.sleep(pause)

    async def run() -> dict[str, Any]:
        async with Client(endpoint, concurrency=sessions, timeout=30.0) as client:
            async with asyncio.TaskGroup() as group:
                stop = time.perf_counter() + 0.3
                for _ in range(sessions):
                    group.create_task(loop(client, stop))
            latencies.clear()
            await asyncio.to_thread(_wait_for_go)
            start = time.perf_counter()
            async with asyncio.TaskGroup() as group:
                for _ in range(sessions):
                    group.create_task(loop(client, start + duration))
            elapsed = time.perf_counter() - start
            _window_end()
        return {"count": len(latencies), "elapsed": elapsed, "latencies": latencies}

    return asyncio.run(run())


class _Session:
    """One blocking request at a time on one DEALER, framed for a given system."""

    def __init__(self, system: str, context: zmq.Context[Socket], endpoint: str) -> None:
        self.system = system
        if system == "majortomo":
            import majortomo

            self.mt = majortomo.Client(endpoint, zmq_context=context)
            self.mt.connect()
            self.socket: Socket = self.mt._socket  # to poll many sessions at once
        else:
            self.socket = context.socket(zmq.DEALER)
            self.socket.connect(endpoint)
        self.started = 0.0

    def send(self, body: bytes) -> None:
        self.started = time.perf_counter()
        if self.system == "majortomo":
            self.mt.send(SERVICE, body)
        elif self.system == "hand":
            self.socket.send_multipart([CLIENT, C_REQUEST, SERVICE, body], copy=len(body) < 65536)
        else:
            self.socket.send_multipart([body], copy=len(body) < 65536)

    def receive(self, body: bytes) -> None:
        """Take the reply (the socket is readable) and check it."""
        if self.system == "majortomo":
            reply = self.mt.recv_part(timeout=1.0)
            assert reply == [body]
            assert not self.mt._expect_reply
        elif self.system == "hand":
            frames = self.socket.recv_multipart()
            assert frames == [CLIENT, C_FINAL, SERVICE, body], frames[:3]
        else:
            assert self.socket.recv() == body


def _blocking_client(
    system: str, endpoint: str, count: int, body: bytes, duration: float, pause: float
) -> dict[str, Any]:
    context = _context(count)
    sessions = [_Session(system, context, endpoint) for _ in range(count)]
    by_socket = {s.socket: s for s in sessions}
    poller = zmq.Poller()
    for s in sessions:
        poller.register(s.socket, zmq.POLLIN)
    latencies: list[float] = []

    def run(stop: float) -> None:
        for s in sessions:
            s.send(body)
        busy = len(sessions)
        while busy:
            ready = poller.poll(10_000)
            assert ready, "no reply in 10 s"
            for sock, _ in ready:
                s = by_socket[sock]
                s.receive(body)
                now = time.perf_counter()
                latencies.append(now - s.started)
                if now < stop:
                    if pause:
                        time.sleep(pause)  # only (d) pauses, with a single session
                    s.send(body)
                else:
                    busy -= 1

    run(time.perf_counter() + 0.3)
    latencies.clear()
    _wait_for_go()
    start = time.perf_counter()
    run(start + duration)
    elapsed = time.perf_counter() - start
    _window_end()
    return {"count": len(latencies), "elapsed": elapsed, "latencies": latencies}


# --- farms of idle peers -----------------------------------------------------------------------


def farm(
    framing: str, endpoint: str, count: int, kind: str, heartbeat: float, spread: bool = False
) -> None:
    """``count`` idle workers (READY for ``idle``, then heartbeats), queued requests or clients.

    ``kind`` is ``workers``, ``requests`` (each socket sends one REQUEST for a service no
    worker offers, so the broker queues it) or ``clients`` (each sends one REQUEST for ``echo``
    and waits for its FINAL). ``framing`` is ``domo`` (RFC 18), ``majortomo``
    or ``raw`` (the forwarder's: a worker says ``ready``, a request is a body). Prints ``sent``
    when every socket has spoken, then keeps heartbeating (workers) and discarding what arrives
    until killed; ``clients`` print one JSON line once every reply is in. ``spread``: each
    worker heartbeats at its own phase of the interval (as independent workers would), and the
    sockets are read in sweeps rather than polled all at once.
    """
    context = _context(count)
    sockets = []
    for _ in range(count):
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(endpoint)
        sockets.append(socket)
    delimiter = [b""] if framing == "majortomo" else []
    ready = [WORKER, W_READY, b"idle"]
    beat = [WORKER, W_HEARTBEAT]
    request = [CLIENT, b"\x02" if framing == "majortomo" else C_REQUEST, b"nobody", b"x"]
    if framing == "raw":  # the forwarder's baseline: what ZeroMQ alone holds per connection
        ready, request = [RAW_READY], [b"x"]
    if kind == "clients":  # one request each for ``echo``, every reply checked and counted
        _client_farm(sockets)
        return
    first = ready if kind == "workers" else request
    for socket in sockets:
        socket.send_multipart([*delimiter, *first])
    print("sent", flush=True)
    if spread:
        _spread_heartbeats(sockets, [*delimiter, *beat], heartbeat)
        return
    poller = zmq.Poller()
    for socket in sockets:
        poller.register(socket, zmq.POLLIN)
    next_beat = time.monotonic() + heartbeat
    while True:
        for socket, _ in poller.poll(int(max(0.0, next_beat - time.monotonic()) * 1000)):
            socket.recv_multipart()
        if kind == "workers" and framing != "raw" and time.monotonic() >= next_beat:
            next_beat += heartbeat
            for socket in sockets:
                socket.send_multipart([*delimiter, *beat])


def _drain(socket: Socket) -> list[list[bytes]]:
    messages = []
    while True:
        try:
            messages.append(socket.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return messages


def _spread_heartbeats(sockets: list[Socket], beat: list[bytes], heartbeat: float) -> None:
    """Heartbeat socket i at phase i/len of every interval; read every socket every 10 s (the
    broker's heartbeats wait in each socket's queue meanwhile: a few, where it holds 1,000), so
    that the farm spends its CPU on its own heartbeats, in time on a loaded machine."""
    count = len(sockets)
    start = time.monotonic()
    sent = 0  # heartbeats sent since ``start``
    next_sweep = start
    while True:
        now = time.monotonic()
        due = int((now - start) / heartbeat * count)  # heartbeats due since start
        for index in range(sent, due):
            sockets[index % count].send_multipart(beat)
        sent = max(sent, due)
        if now >= next_sweep:
            next_sweep = now + 10.0
            for socket in sockets:
                if int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:  # no exception when empty
                    _drain(socket)
        time.sleep(min(0.05, heartbeat / count * 64))


def _client_farm(sockets: list[Socket]) -> None:
    """One REQUEST for ``echo`` per socket (its index as the body); every FINAL checked; prints
    ``sent``, then ``{"answered": N, "seconds": S}`` once every socket has its reply."""
    start = time.perf_counter()
    for index, socket in enumerate(sockets):
        socket.send_multipart([CLIENT, C_REQUEST, SERVICE, b"%d" % index])
    print("sent", flush=True)
    waiting = dict(enumerate(sockets))
    while waiting:
        time.sleep(0.02)
        for index, socket in list(waiting.items()):
            for reply in _drain(socket):
                assert reply == [CLIENT, C_FINAL, SERVICE, b"%d" % index], reply[:3]
                del waiting[index]
    seconds = time.perf_counter() - start
    print(json.dumps({"answered": len(sockets), "seconds": seconds}), flush=True)
    while True:
        time.sleep(1)


def _use_uvloop(system: str) -> str:
    """``asyncio-uvloop``: asyncio's code on uvloop's loop (the uvloop extra); its system."""
    if system == "asyncio-uvloop":
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return system


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("role", choices=["broker", "worker", "client", "farm"])
    args.add_argument("system")
    args.add_argument("endpoint")
    args.add_argument("--heartbeat", type=float, default=2.5)
    args.add_argument("--sessions", type=int, default=1)
    args.add_argument("--size", type=int, default=16)
    args.add_argument("--duration", type=float, default=2.0)
    args.add_argument("--pause", type=float, default=0.0)
    args.add_argument("--count", type=int, default=1)
    args.add_argument("--kind", default="workers")
    args.add_argument("--spread", action="store_true")
    a = args.parse_args()
    _use_uvloop(a.system)
    if a.role == "broker":
        broker(a.system, a.endpoint, a.heartbeat)
    elif a.role == "worker":
        worker(a.system, a.endpoint, a.heartbeat)
    elif a.role == "client":
        client(a.system, a.endpoint, a.sessions, a.size, a.duration, a.pause)
    else:
        farm(a.system, a.endpoint, a.count, a.kind, a.heartbeat, a.spread)


if __name__ == "__main__":
    main()
