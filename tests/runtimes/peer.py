"""Subprocess peers of the behaviour suite: ``python -m tests.runtimes.peer ROLE RUNTIME ...``.

- ``worker RUNTIME ENDPOINT SERVICE INTERVAL``: a worker whose handler prints ``busy <body>``
  and then sleeps for a minute (a test kills it mid-request).
- ``stalling-worker RUNTIME ENDPOINT SERVICE INTERVAL STALL``: a worker whose handler holds
  up the whole worker for STALL seconds (the event loop, or with ``sync`` every thread: it keeps
  the GIL), as a starved process would be, then echoes; prints ``stalled`` then ``answered``.
- ``broker RUNTIME ENDPOINT INTERVAL``: a broker (Trio's for ``sync``); prints ``bound``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import trio

import domo.asyncio
import domo.sync
import domo.trio
from domo.protocol import BrokerConfig, WorkerConfig


def say(line: str) -> None:
    print(line, flush=True)


def worker(runtime: str, endpoint: str, service: str, interval: float) -> None:
    config = WorkerConfig(heartbeat_interval=interval)
    if runtime == "sync":

        def blocking(body: list[bytes]) -> Iterator[bytes]:
            say(f"busy {body[0].decode()}")
            time.sleep(60)
            yield b"late"

        domo.sync.run_worker(endpoint, service, blocking, config=config)
        return

    async def handler(body: list[bytes]) -> AsyncIterator[bytes]:
        say(f"busy {body[0].decode()}")
        if runtime == "trio":
            await trio.sleep(60)
        else:
            await asyncio.sleep(60)
        yield b"late"

    if runtime == "trio":
        trio.run(lambda: domo.trio.run_worker(endpoint, service, handler, config=config))
    else:
        asyncio.run(domo.asyncio.run_worker(endpoint, service, handler, config=config))


def stalling_worker(
    runtime: str, endpoint: str, service: str, interval: float, stall: float
) -> None:
    config = WorkerConfig(heartbeat_interval=interval)

    def hold_up() -> None:
        say("stalled")
        until = time.monotonic() + stall
        while time.monotonic() < until:  # pure Python: the GIL is kept (switch interval)
            pass

    if runtime == "sync":
        sys.setswitchinterval(stall + 1.0)  # the heartbeat thread cannot run meanwhile

        def blocking(body: list[bytes]) -> list[bytes]:
            hold_up()
            return body

        domo.sync.run_worker(endpoint, service, blocking, config=config)
        return

    async def blocks_the_loop(body: list[bytes]) -> list[bytes]:
        hold_up()
        return body

    if runtime == "trio":
        trio.run(lambda: domo.trio.run_worker(endpoint, service, blocks_the_loop, config=config))
    else:
        asyncio.run(domo.asyncio.run_worker(endpoint, service, blocks_the_loop, config=config))


def broker(runtime: str, endpoint: str, interval: float) -> None:
    config = BrokerConfig(heartbeat_interval=interval)
    if runtime == "asyncio":

        async def serve_asyncio() -> None:
            started: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
            started.add_done_callback(lambda f: say(f"bound {f.result()[0]}"))
            await domo.asyncio.serve_broker(endpoint, config=config, started=started)

        asyncio.run(serve_asyncio())
        return

    async def serve_trio() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(lambda task_status: domo.trio.serve_broker(
                endpoint, config=config, task_status=task_status))  # fmt: skip
            say(f"bound {bound[0]}")

    trio.run(serve_trio)


if __name__ == "__main__":
    role, runtime, *rest = sys.argv[1:]
    assert threading.current_thread() is threading.main_thread()
    if role == "worker":
        worker(runtime, rest[0], rest[1], float(rest[2]))
    elif role == "stalling-worker":
        stalling_worker(runtime, rest[0], rest[1], float(rest[2]), float(rest[3]))
    else:
        broker(runtime, rest[0], float(rest[1]))
