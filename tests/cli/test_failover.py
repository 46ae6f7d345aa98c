"""Failover (MDP-D-28): two ``domo broker`` processes, one SIGKILLed; peers move to the other.

Workers are ``domo worker --connect A --connect B`` processes, or workers of each Python API
(``domo.trio``, ``domo.asyncio``, ``domo.sync``) in threads of this process; clients are
``domo call`` with both endpoints, and the ``Client`` of each API. Every request made after
broker A died must be answered, by a worker that moved to B.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from functools import partial

import pytest
import trio

import domo.asyncio
import domo.sync
import domo.trio
from domo.cli import EXIT_UNREACHABLE
from domo.protocol import WorkerConfig

from .conftest import QUICK_BEATS, StartDomo, run_domo

# A worker loses a silent broker after liveness x interval = 0.6 s, then waits its backoff
# (0.25 s) and connects to the next: well inside a client's 3 tries of 1 s each.
TIMEOUT = 1.0
RETRIES = 3


async def _two_brokers(domo: StartDomo) -> tuple[int, str, str]:
    first = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS)
    second = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS)
    return first.pid, await first.endpoint(), await second.endpoint()


async def test_workers_and_clients_move_to_the_second_broker_when_the_first_is_killed(
    domo: StartDomo,
) -> None:
    """MDP-D-28 with every peer a ``domo`` process: a worker and ``domo call`` given A then B."""
    with trio.fail_after(60):
        first_pid, a, b = await _two_brokers(domo)
        worker = await domo("worker", "echo", "--connect", a, "--connect", b, *QUICK_BEATS)
        await worker.line("domo worker: serving")
        both = ["--connect", a, "--connect", b, "--timeout", str(TIMEOUT)]
        before = await run_domo("call", "echo", "before", *both)
        assert (before.code, before.stdout) == (0, "before\n"), before

        os.kill(first_pid, signal.SIGKILL)  # a broker this test started
        after = await run_domo("call", "echo", "after", *both, "--retries", str(RETRIES))
        assert (after.code, after.stdout) == (0, "after\n"), after
        # Its first try went to the dead broker: it was answered only after moving on.
        assert after.elapsed >= TIMEOUT
        # The worker gave A up for its silence (MDP-H-06) before it was served by B.
        await worker.line("ReconnectRequired: broker-lost", "stderr")

        # Only B: a call to A alone fails, the same call with B after it does not.
        alone = await run_domo("call", "echo", "x", "--connect", a, "--timeout", "0.3")
        assert alone.code == EXIT_UNREACHABLE, alone  # nothing listens at A: said at once


def _trio_worker(endpoints: list[str], stop: threading.Event) -> None:
    async def main() -> None:
        async def echo(body: list[bytes]) -> list[bytes]:
            return body

        config = WorkerConfig(heartbeat_interval=0.2, liveness=3)
        serve = partial(domo.trio.run_worker, config=config)
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, endpoints, "echo", echo)
            await trio.to_thread.run_sync(stop.wait)
            nursery.cancel_scope.cancel()

    trio.run(main)


def _asyncio_worker(endpoints: list[str], stop: threading.Event) -> None:
    async def main() -> None:
        async def echo(body: list[bytes]) -> list[bytes]:
            return body

        config = WorkerConfig(heartbeat_interval=0.2, liveness=3)
        task = asyncio.create_task(domo.asyncio.run_worker(endpoints, "echo", echo, config=config))
        await asyncio.to_thread(stop.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def _sync_worker(endpoints: list[str], stop: threading.Event) -> None:
    config = WorkerConfig(heartbeat_interval=0.2, liveness=3)
    domo.sync.run_worker(endpoints, "echo", lambda body: body, config=config, stop=stop)


def _trio_call(endpoints: list[str], body: bytes) -> list[bytes]:
    async def main() -> list[bytes]:
        async with domo.trio.Client(endpoints, timeout=TIMEOUT, retries=RETRIES) as client:
            return await client.request("echo", body)

    return trio.run(main)


def _asyncio_call(endpoints: list[str], body: bytes) -> list[bytes]:
    async def main() -> list[bytes]:
        async with domo.asyncio.Client(endpoints, timeout=TIMEOUT, retries=RETRIES) as client:
            return await client.request("echo", body)

    return asyncio.run(main())


def _sync_call(endpoints: list[str], body: bytes) -> list[bytes]:
    with domo.sync.Client(endpoints, timeout=TIMEOUT, retries=RETRIES) as client:
        return client.request("echo", body)


RUNTIMES = {
    "trio": (_trio_worker, _trio_call),
    "asyncio": (_asyncio_worker, _asyncio_call),
    "sync": (_sync_worker, _sync_call),
}


@pytest.mark.parametrize("runtime", list(RUNTIMES))
async def test_each_python_api_fails_over(domo: StartDomo, runtime: str) -> None:
    """MDP-D-28 through ``run_worker`` and ``Client`` of each runtime, given [A, B]."""
    serve, call = RUNTIMES[runtime]
    stop = threading.Event()
    with trio.fail_after(60):
        first_pid, a, b = await _two_brokers(domo)
        worker = threading.Thread(target=serve, args=([a, b], stop), daemon=True)
        worker.start()
        try:
            assert await trio.to_thread.run_sync(call, [a, b], b"before") == [b"before"]
            os.kill(first_pid, signal.SIGKILL)  # a broker this test started
            started = trio.current_time()
            assert await trio.to_thread.run_sync(call, [a, b], b"after") == [b"after"]
            assert trio.current_time() - started >= TIMEOUT  # the first try was lost with A
        finally:
            stop.set()
            await trio.to_thread.run_sync(worker.join, 10)
        assert not worker.is_alive()
