"""Titanic through a real broker on loopback: the services, the three runtimes' clients, a
restart, a failing store. The broker and Titanic run in this process (Trio), the asyncio and
blocking clients in threads of their own, every socket on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

import domo.asyncio
import domo.sync
import domo.trio
from domo.runtime.errors import RemoteError
from domo.titanic import FetchState, TitanicError
from domo.titanic import asyncio as titanic_asyncio
from domo.titanic import sync as titanic_sync
from domo.titanic.server import serve_titanic
from domo.titanic.store import SqliteStore
from domo.titanic.trio import TitanicClient

from .conftest import WORKER_CONFIG, Rig

Handler = Callable[[list[bytes]], Awaitable[list[bytes]]]


@asynccontextmanager
async def worker(rig: Rig, service: str, handler: Handler) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: domo.trio.run_worker(
                rig.endpoint, service, handler, config=WORKER_CONFIG, task_status=task_status
            )
        )
        yield
        nursery.cancel_scope.cancel()


async def upper(body: list[bytes]) -> list[bytes]:
    return [frame.upper() for frame in body]


async def wait_done(titanic: TitanicClient, request_id: str, limit: float = 20.0) -> list[bytes]:
    with trio.fail_after(limit):
        fetched = await titanic.wait(request_id)
    assert fetched.done, fetched
    return fetched.reply()


async def test_submit_fetch_close_with_the_trio_client(rig: Rig) -> None:
    """TSP-S-01, TSP-S-04, TSP-S-07, TSP-S-09, TSP-S-11, TSP-A-01, TSP-A-02, TSP-A-03,
    TSP-R-01: stored while no worker exists, executed when one comes, kept until closed."""
    async with domo.trio.Client(rig.endpoint, timeout=2.0) as client:
        titanic = TitanicClient(client)
        first = await titanic.submit("upper", b"hello", b"", b"world")
        second = await titanic.submit(b"upper", b"two")
        assert len(first) == 32
        assert first != second
        assert (await titanic.fetch(first)).state is FetchState.PENDING  # no worker yet
        assert rig.store.record(first.encode()) is not None  # on disk already
        async with worker(rig, "upper", upper):
            assert await wait_done(titanic, first) == [b"HELLO", b"", b"WORLD"]
            assert await wait_done(titanic, second) == [b"TWO"]
            again = await titanic.fetch(first)  # reading it deletes nothing (TSP-S-09)
            assert again.done
            assert again.body == [b"HELLO", b"", b"WORLD"]
        await titanic.close(first)
        assert (await titanic.fetch(first)).state is FetchState.UNKNOWN
        await titanic.close(first)  # idempotent: 200 again
        assert (await titanic.fetch(second)).done  # the other one stays
    assert rig.titanic.counts["stored"] == 2
    assert rig.titanic.counts["answered"] == 2


async def test_malformed_tsp_requests_are_answered_not_stored(rig: Rig) -> None:
    """TSP-S-02, TSP-S-06, TSP-S-08, TSP-S-10, TSP-D-13, TSP-F-03, TSP-F-05."""
    async with domo.trio.Client(rig.endpoint, timeout=2.0) as client:
        answers = [
            await client.request("titanic.request", b"upper"),  # no body frame
            await client.request("titanic.request", b"bad\x01name", b"x"),
            await client.request("titanic.request", b"titanic.reply", b"x"),
            await client.request("titanic.reply", b"a" * 32, b"extra"),
            await client.request("titanic.reply", b"not-an-id"),
            await client.request("titanic.reply", b"f" * 32),  # well formed, unknown
            await client.request("titanic.close", b"a" * 32, b"extra"),
        ]
        for answer in answers:
            assert answer[0][:4] == b"400 ", answer
            assert len(answer) == 1
        assert await client.request("titanic.close", b"not-an-id") == [b"200"]
        assert await client.request("titanic.close", b"f" * 32) == [b"200"]
    assert rig.store.counts() == {"pending": 0, "done": 0, "failed": 0}
    assert rig.titanic.counts["refused"] == 3


async def test_a_handler_error_is_stored_as_the_reply(rig: Rig) -> None:
    """TSP-F-01, TSP-D-15: 200 and the error body; the client raises RemoteError."""

    async def fail(body: list[bytes]) -> list[bytes]:
        raise ValueError("no such thing")

    async with domo.trio.Client(rig.endpoint, timeout=2.0) as client:
        titanic = TitanicClient(client)
        request_id = await titanic.submit("fail", b"x")
        async with worker(rig, "fail", fail):
            with trio.fail_after(20):
                while not (fetched := await titanic.fetch(request_id)).done:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # 9/TSP is polled (TSP-F-02)
        with pytest.raises(RemoteError, match="ValueError: no such thing"):
            fetched.reply()


async def test_requests_survive_a_titanic_restart_and_run_after_it(rig: Rig) -> None:
    """TSP-D-04, TSP-D-02: pending requests are found in the file and dispatched again."""
    async with domo.trio.Client(rig.endpoint, timeout=2.0, retries=5) as client:
        titanic = TitanicClient(client)
        ids = [await titanic.submit("upper", b"r%d" % n) for n in range(5)]
        await rig.restart_titanic()
        assert rig.titanic.machine.pending_count() == 5
        async with worker(rig, "upper", upper):
            for n, request_id in enumerate(ids):
                assert await wait_done(titanic, request_id) == [b"R%d" % n]


async def test_a_full_database_answers_500_and_loses_nothing(rig: Rig) -> None:
    """TSP-D-08, TSP-F-04: the commit fails, the client gets TitanicError (500), the stored
    requests are still there and still served; closing makes room."""
    rig.titanic_scope.cancel()
    await trio.sleep(0.05)
    rig.store.close()
    rig.store = SqliteStore(rig.db, synchronous="normal", max_bytes=48 * 1024)
    await rig._start()
    async with domo.trio.Client(rig.endpoint, timeout=2.0) as client:
        titanic = TitanicClient(client)
        stored: list[str] = []
        refused: TitanicError | None = None
        for n in range(200):
            try:
                stored.append(await titanic.submit("upper", b"%d" % n, b"x" * 1500))
            except TitanicError as error:
                refused = error
                break
        assert refused is not None
        assert refused.status == b"500"
        assert "full" in str(refused)
        assert len(stored) > 3
        async with worker(rig, "upper", upper):
            for request_id in stored:
                reply = await wait_done(titanic, request_id)
                assert reply[1] == b"X" * 1500
                await titanic.close(request_id)
        await titanic.submit("upper", b"room again")


def _asyncio_flow(endpoint: str) -> list[object]:
    async def flow() -> list[object]:
        async with domo.asyncio.Client(endpoint, timeout=2.0) as client:
            titanic = titanic_asyncio.TitanicClient(client)
            request_id = await titanic.submit("upper", b"asyncio")
            seen: list[object] = []
            async with asyncio.timeout(20):
                fetched = await titanic.wait(request_id)
            seen.append(fetched.reply())
            await titanic.close(request_id)
            seen.append((await titanic.fetch(request_id)).state)
            return seen

    return asyncio.run(flow())


def _sync_flow(endpoint: str) -> list[object]:
    with domo.sync.Client(endpoint, timeout=2.0) as client:
        titanic = titanic_sync.TitanicClient(client)
        request_id = titanic.submit("upper", b"sync")
        seen: list[object] = []
        seen.append(titanic.wait(request_id, timeout=20).reply())
        with pytest.raises(TitanicError, match="still pending"):
            titanic.wait(titanic.submit("nobody-serves-this", b"x"), timeout=0.2)
        titanic.close(request_id)
        seen.append(titanic.fetch(request_id).state)
        return seen


@pytest.mark.parametrize("flow", [_asyncio_flow, _sync_flow], ids=["asyncio", "sync"])
async def test_the_asyncio_and_blocking_clients_do_the_same(
    rig: Rig, flow: Callable[[str], list[object]]
) -> None:
    """TSP-F-02, TSP-F-06: each runtime's TitanicClient shares domo.titanic.client's logic."""
    name = "asyncio" if flow is _asyncio_flow else "sync"
    async with worker(rig, "upper", upper):
        seen = await trio.to_thread.run_sync(flow, rig.endpoint)
    assert seen == [[name.upper().encode()], FetchState.UNKNOWN]


async def test_two_titanics_behind_one_broker_misanswer_as_the_spec_warns(
    rig: Rig, tmp_path: Path
) -> None:
    """TSP-D-17: a second Titanic on another file is not detected; half the fetches reach the
    one that does not hold the request and get 400. This documents the limit."""
    other = SqliteStore(tmp_path / "other.db", synchronous="normal")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: serve_titanic(
                    rig.endpoint, other, worker_config=WORKER_CONFIG, concurrency=2,
                    task_status=task_status,
                )
            )  # fmt: skip
            async with domo.trio.Client(rig.endpoint, timeout=2.0) as client:
                titanic = TitanicClient(client)
                ids = [await titanic.submit("nobody", b"%d" % n) for n in range(4)]
                answers = {(await titanic.fetch(i)).state for i in ids for _ in range(4)}
            nursery.cancel_scope.cancel()
    finally:
        other.close()
    assert answers == {FetchState.PENDING, FetchState.UNKNOWN}
