"""One blocking face for the three runtimes, so that each behaviour test is written once.

A test body is plain code; it asks a ``Runtime`` for a broker, workers and a client, and the
runtime runs them its own way: ``trio`` and ``asyncio`` in an event loop on a thread of their
own (a *portal* the test calls into), ``sync`` in plain threads. Handlers are given as a
``Plan``: for a request body, the steps the handler takes (sleep, yield a body, raise), which
each runtime turns into its own kind of handler (an async generator, or a generator). The last
body yielded is the FINAL, the earlier ones PARTIALs: the same convention in all three runtimes.

Every wait is bounded: a portal call fails after ``LIMIT`` seconds, ``Events.wait_for`` too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Protocol, TypeAlias

import trio

import domo.asyncio
import domo.sync
import domo.trio
from domo.protocol import BrokerConfig, WorkerConfig
from domo.runtime import Partial, Reply

LIMIT = 20.0  # seconds any one call into a runtime may take

# ("sleep", seconds) | ("yield", body) | ("partial", body): yield Partial(body) | ("raise", message)
Step: TypeAlias = tuple[str, Any]
Plan: TypeAlias = Callable[[list[bytes]], Sequence[Step]]


def echo(body: list[bytes]) -> Sequence[Step]:
    return [("yield", body)]


class Events:
    """A thread-safe recorder (an ``on_event`` hook) that a test can wait on."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._changed = threading.Condition()

    def __call__(self, event: Any) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def of_type(self, kind: type[Any]) -> list[Any]:
        with self._changed:
            return [e for e in self.events if isinstance(e, kind)]

    def wait_for(
        self, kind: type[Any], match: Callable[[Any], bool] = bool, count: int = 1
    ) -> list[Any]:
        """The first ``count`` events of ``kind`` that ``match``, waiting up to ``LIMIT``."""
        deadline = time.monotonic() + LIMIT
        with self._changed:
            while True:
                found = [e for e in self.events if isinstance(e, kind) and match(e)]
                if len(found) >= count:
                    return found[:count]
                left = deadline - time.monotonic()
                assert left > 0, f"no {count} x {kind.__name__} in {LIMIT} s: {self.events}"
                self._changed.wait(left)


class Client(Protocol):
    def request(self, service: str, *frames: bytes) -> list[bytes]: ...
    def stream(self, service: str, *frames: bytes, into: list[Reply]) -> None: ...
    def request_all(self, service: str, bodies: Sequence[bytes]) -> list[list[bytes]]:
        """One request per body, all at once (tasks, or threads for ``sync``); the replies."""


class Running:
    """Something started in the background; ``stop`` ends it and returns once it has ended."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self.stop = stop


class Runtime(Protocol):
    name: str

    def broker(
        self, endpoint: str, config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[str, Running]: ...

    def broker_on(
        self, endpoints: Sequence[str], config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[list[str], Running]: ...

    def worker(
        self,
        endpoint: str,
        service: str,
        plan: Plan,
        config: WorkerConfig,
        on_event: Events | None = None,
    ) -> Running: ...

    def client(
        self, endpoint: str, *, timeout: float, retries: int, concurrency: int = 1
    ) -> Any: ...

    def close(self) -> None: ...


# --- trio ---------------------------------------------------------------------------------------


class TrioRuntime:
    """Trio in a thread; ``domo.trio``'s broker, workers and clients run in it."""

    name = "trio"

    def __init__(self) -> None:
        ready = threading.Event()
        self._stop: trio.Event | None = None

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        self._thread = threading.Thread(target=trio.run, args=(main,), name="trio portal")
        self._thread.start()
        assert ready.wait(LIMIT)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def bounded() -> Any:
            with trio.fail_after(LIMIT):
                return await fn(*args)

        return trio.from_thread.run(bounded, trio_token=self._token)

    def spawn(self, fn: Callable[..., Any], *args: Any) -> Running:
        """Run ``fn(*args, task_status=...)`` until stopped; returns once it has started."""
        done = threading.Event()
        errors: list[BaseException] = []

        async def runner(task_status: trio.TaskStatus[Any]) -> None:
            try:
                with trio.CancelScope() as scope:
                    holder.append(scope)
                    await fn(*args, task_status=task_status)
            except BaseException as error:  # reported by stop()
                errors.append(error)
            finally:
                done.set()

        holder: list[trio.CancelScope] = []
        result = trio.from_thread.run(self._nursery.start, runner, trio_token=self._token)

        def stop() -> None:
            trio.from_thread.run_sync(holder[0].cancel, trio_token=self._token)
            assert done.wait(LIMIT)
            if errors:
                raise errors[0]

        running = Running(stop)
        running.result = result  # type: ignore[attr-defined]
        return running

    def broker(
        self, endpoint: str, config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[str, Running]:
        async def serve(task_status: trio.TaskStatus[list[str]]) -> None:
            await domo.trio.serve_broker(
                endpoint, config=config, on_event=on_event, task_status=task_status
            )

        running = self.spawn(serve)
        return running.result[0], running  # type: ignore[attr-defined]

    def broker_on(
        self, endpoints: Sequence[str], config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[list[str], Running]:
        """A broker bound to every endpoint (one ROUTER each); the endpoints as bound."""

        async def serve(task_status: trio.TaskStatus[list[str]]) -> None:
            await domo.trio.serve_broker(
                *endpoints, config=config, on_event=on_event, task_status=task_status
            )

        running = self.spawn(serve)
        return running.result, running  # type: ignore[attr-defined]

    def worker(
        self,
        endpoint: str,
        service: str,
        plan: Plan,
        config: WorkerConfig,
        on_event: Events | None = None,
    ) -> Running:
        async def handler(body: list[bytes]) -> AsyncIterator[bytes | Sequence[bytes] | Partial]:
            for kind, arg in plan(body):
                if kind == "sleep":
                    await trio.sleep(arg)
                elif kind == "yield":
                    yield arg
                elif kind == "partial":
                    yield Partial(arg)
                else:
                    raise ValueError(arg)

        async def serve(task_status: trio.TaskStatus[None]) -> None:
            await domo.trio.run_worker(
                endpoint, service, handler, config=config, on_event=on_event,
                task_status=task_status,
            )  # fmt: skip

        return self.spawn(serve)

    @contextmanager
    def client(
        self, endpoint: str, *, timeout: float, retries: int, concurrency: int = 1
    ) -> Iterator[Client]:
        async def hold(task_status: trio.TaskStatus[domo.trio.Client]) -> None:
            # Entered and left in one task, as a Trio Client (it owns a nursery) must be.
            async with domo.trio.Client(
                endpoint, timeout=timeout, retries=retries, concurrency=concurrency
            ) as client:
                task_status.started(client)
                await trio.sleep_forever()

        running = self.spawn(hold)
        try:
            yield _PortalClient(self, running.result)  # type: ignore[attr-defined]
        finally:
            running.stop()

    def close(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(LIMIT)


class _PortalClient:
    """A trio or asyncio client, called from the test's thread through its runtime's portal."""

    def __init__(self, runtime: TrioRuntime | AsyncioRuntime, client: Any) -> None:
        self._runtime = runtime
        self._client = client

    def request(self, service: str, *frames: bytes) -> list[bytes]:
        result: list[bytes] = self._runtime.call(self._client.request, service, *frames)
        return result

    def stream(self, service: str, *frames: bytes, into: list[Reply]) -> None:
        async def read() -> None:
            async with self._client.stream(service, *frames) as replies:
                async for reply in replies:
                    into.append(reply)

        self._runtime.call(read)

    def request_all(self, service: str, bodies: Sequence[bytes]) -> list[list[bytes]]:
        replies: list[list[bytes]] = [[] for _ in bodies]

        async def one(index: int) -> None:
            replies[index] = await self._client.request(service, bodies[index])

        async def all_at_once() -> None:
            if isinstance(self._runtime, TrioRuntime):
                async with trio.open_nursery() as nursery:
                    for index in range(len(bodies)):
                        nursery.start_soon(one, index)
            else:
                async with asyncio.TaskGroup() as group:
                    for index in range(len(bodies)):
                        group.create_task(one(index))

        self._runtime.call(all_at_once)
        return replies

    def request_cancelled(self, service: str, body: bytes, after: float) -> None:
        """A request whose task is cancelled after ``after`` seconds (the runtime's own way)."""

        async def cancelled() -> None:
            if isinstance(self._runtime, TrioRuntime):
                with trio.move_on_after(after) as scope:
                    await self._client.request(service, body)
                assert scope.cancelled_caught, "the request was not cancelled"
            else:
                with suppress(TimeoutError):
                    async with asyncio.timeout(after):
                        await self._client.request(service, body)
                    raise AssertionError("the request was not cancelled")

        self._runtime.call(cancelled)


# --- asyncio ------------------------------------------------------------------------------------


class AsyncioRuntime:
    """An asyncio loop in a thread; ``domo.asyncio``'s broker, workers and clients run in it."""

    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = asyncio.new_event_loop() if loop is None else loop
        self._thread = threading.Thread(target=self._loop.run_forever, name="asyncio portal")
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(LIMIT):
                return await fn(*args)

        return asyncio.run_coroutine_threadsafe(bounded(), self._loop).result(LIMIT + 5)

    def spawn(self, make: Callable[[], Any]) -> Running:
        """Run the coroutine ``make()`` returns as a task, until stopped."""

        async def create() -> asyncio.Task[Any]:
            return asyncio.get_running_loop().create_task(make())

        task: asyncio.Task[Any] = self.call(create)

        def stop() -> None:
            async def cancel() -> None:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task

            self.call(cancel)

        return Running(stop)

    def broker(
        self, endpoint: str, config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[str, Running]:
        started: concurrent.futures.Future[list[str]] = concurrent.futures.Future()

        async def serve() -> None:
            bound: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
            bound.add_done_callback(lambda f: started.set_result(f.result()))
            await domo.asyncio.serve_broker(
                endpoint, config=config, on_event=on_event, started=bound
            )

        running = self.spawn(serve)
        return started.result(LIMIT)[0], running

    def broker_on(
        self, endpoints: Sequence[str], config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[list[str], Running]:
        """A broker bound to every endpoint (one ROUTER each); the endpoints as bound."""
        started: concurrent.futures.Future[list[str]] = concurrent.futures.Future()

        async def serve() -> None:
            bound: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
            bound.add_done_callback(lambda f: started.set_result(f.result()))
            await domo.asyncio.serve_broker(
                *endpoints, config=config, on_event=on_event, started=bound
            )

        running = self.spawn(serve)
        return started.result(LIMIT), running

    def worker(
        self,
        endpoint: str,
        service: str,
        plan: Plan,
        config: WorkerConfig,
        on_event: Events | None = None,
    ) -> Running:
        async def handler(body: list[bytes]) -> AsyncIterator[bytes | Sequence[bytes] | Partial]:
            for kind, arg in plan(body):
                if kind == "sleep":
                    await asyncio.sleep(arg)
                elif kind == "yield":
                    yield arg
                elif kind == "partial":
                    yield Partial(arg)
                else:
                    raise ValueError(arg)

        return self.spawn(
            lambda: domo.asyncio.run_worker(
                endpoint, service, handler, config=config, on_event=on_event
            )
        )

    @contextmanager
    def client(
        self, endpoint: str, *, timeout: float, retries: int, concurrency: int = 1
    ) -> Iterator[Client]:
        client = domo.asyncio.Client(
            endpoint, timeout=timeout, retries=retries, concurrency=concurrency
        )
        self.call(client.__aenter__)
        try:
            yield _PortalClient(self, client)
        finally:
            self.call(client.__aexit__, None, None, None)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(LIMIT)
        self._loop.close()


# --- sync ---------------------------------------------------------------------------------------


class SyncRuntime:
    """``domo.sync``: workers in threads, clients called directly; the broker is Trio's."""

    name = "sync"

    def __init__(self) -> None:
        self._trio = TrioRuntime()

    def broker(
        self, endpoint: str, config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[str, Running]:
        return self._trio.broker(endpoint, config, on_event)

    def broker_on(
        self, endpoints: Sequence[str], config: BrokerConfig, on_event: Events | None = None
    ) -> tuple[list[str], Running]:
        return self._trio.broker_on(endpoints, config, on_event)

    def worker(
        self,
        endpoint: str,
        service: str,
        plan: Plan,
        config: WorkerConfig,
        on_event: Events | None = None,
    ) -> Running:
        def handler(body: list[bytes]) -> Iterator[bytes | Sequence[bytes] | Partial]:
            for kind, arg in plan(body):
                if kind == "sleep":
                    time.sleep(arg)
                elif kind == "yield":
                    yield arg
                elif kind == "partial":
                    yield Partial(arg)
                else:
                    raise ValueError(arg)

        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                domo.sync.run_worker(
                    endpoint, service, handler, config=config, on_event=on_event, stop=stop
                )
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=run, name=f"sync worker {service}")
        thread.start()

        def end() -> None:
            stop.set()
            thread.join(LIMIT)
            assert not thread.is_alive(), "the sync worker did not stop"
            if errors:
                raise errors[0]

        return Running(end)

    @contextmanager
    def client(
        self, endpoint: str, *, timeout: float, retries: int, concurrency: int = 1
    ) -> Iterator[Client]:
        with domo.sync.Client(
            endpoint, timeout=timeout, retries=retries, concurrency=concurrency
        ) as client:
            yield _SyncClient(client)

    def close(self) -> None:
        self._trio.close()


class _SyncClient:
    def __init__(self, client: domo.sync.Client) -> None:
        self._client = client

    def request(self, service: str, *frames: bytes) -> list[bytes]:
        return self._client.request(service, *frames)

    def stream(self, service: str, *frames: bytes, into: list[Reply]) -> None:
        with self._client.stream(service, *frames) as replies:
            for reply in replies:
                into.append(reply)

    def request_all(self, service: str, bodies: Sequence[bytes]) -> list[list[bytes]]:
        """One thread per body, all sharing this one ``Client`` (its pool of sessions)."""
        replies: list[list[bytes]] = [[] for _ in bodies]
        errors: list[BaseException] = []

        def one(index: int) -> None:
            try:
                replies[index] = self._client.request(service, bodies[index])
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LIMIT)
        if errors:
            raise errors[0]
        return replies


RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "trio": TrioRuntime,
    "asyncio": AsyncioRuntime,
    "sync": SyncRuntime,
}
