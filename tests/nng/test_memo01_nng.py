"""One broker, ZeroMQ and NNG endpoints, one core: memo01 peers (pynng) beside MDP/0.2 peers.

``serve_broker`` binds a ROUTER on tcp loopback and an NNG rep0 socket on ipc in a temp dir
(MEMO-21); memo01 workers and clients written from the seed (``memo01_peers``) meet domo's own
MDP/0.2 client and worker across the two transports (MEMO-20), and heartbeats, shutdown and
expiry behave on NNG as on ZeroMQ (MEMO-15, MEMO-19).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("pynng")
pytest.importorskip("cbor2")

import cbor2
import pynng
import trio

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import BrokerEvent, WorkerExpired, WorkerRegistered
from domo.trio import Client, run_worker, serve_broker

from .memo01_peers import (
    DISCONNECT,
    HEARTBEAT,
    JOB,
    WorkerLog,
    memo_call,
    memo_worker,
)

pytestmark = [pytest.mark.io]

INTERVAL = 0.2
BROKER = BrokerConfig(heartbeat_interval=INTERVAL, liveness=3)
WORKER = WorkerConfig(heartbeat_interval=INTERVAL)
LIMIT = 20  # seconds any one test may take, on a loaded machine


@asynccontextmanager
async def broker(tmp_path: Path, events: list[BrokerEvent]) -> AsyncIterator[tuple[str, str]]:
    """A broker on tcp loopback (ZeroMQ) and nng+ipc (memo01); yields (zmq, nng url)."""
    async with trio.open_nursery() as nursery:
        tcp, nng = await nursery.start(
            lambda task_status: serve_broker(
                "tcp://127.0.0.1:0",
                f"nng+ipc://{tmp_path}/memo.ipc",
                config=BROKER,
                on_event=events.append,
                task_status=task_status,
            )
        )
        assert nng.startswith("nng+ipc://")
        yield tcp, nng.removeprefix("nng+")
        nursery.cancel_scope.cancel()


async def upper(body: list[bytes]) -> bytes:
    return b"".join(body).upper()


async def reverse(service: str, payload: bytes) -> bytes:
    return payload[::-1]


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` (the caller bounds the wait with ``trio.fail_after``)."""
    while not condition():  # noqa: ASYNC110 - a condition on a list the broker appends to
        await trio.sleep(0.01)


async def wait_for(events: list[BrokerEvent], kind: type, count: int = 1) -> None:
    await until(lambda: sum(isinstance(e, kind) for e in events) >= count)


async def test_memo_20_memo01_client_to_mdp_worker_and_mdp_client_to_memo01_worker(
    tmp_path: Path,
) -> None:
    """MEMO-20."""
    events: list[BrokerEvent] = []
    log = WorkerLog()
    with trio.fail_after(LIMIT):
        async with broker(tmp_path, events) as (tcp, url), trio.open_nursery() as peers:
            await peers.start(
                lambda task_status: run_worker(
                    tcp, "upper", upper, config=WORKER, task_status=task_status
                )
            )
            with pynng.Req0(dial=url) as socket:
                peers.start_soon(memo_worker, socket, ["rev", "echo2"], reverse, log)
                await wait_for(events, WorkerRegistered, 3)  # upper, and rev + echo2 (seats)
                # A memo01 client on NNG, served by an MDP/0.2 worker on ZeroMQ.
                assert await memo_call(socket, "upper", b"hello nng") == b"HELLO NNG"
                # An MDP/0.2 client on ZeroMQ, served by the memo01 worker on NNG.
                async with Client(tcp, timeout=5, retries=0) as client:
                    assert await client.request("rev", b"abc") == [b"cba"]
                    # MEMO-20: two body frames are one payload, the CBOR array of their bytes.
                    reply = await client.request("echo2", b"x", b"yz")
                    assert reply == [cbor2.dumps([b"x", b"yz"])[::-1]]
                    assert await client.request("mmi.service", b"rev") == [b"200"]
                # memo01 to memo01, many clients multiplexed over one socket (a context each).
                async with trio.open_nursery() as calls:
                    results: dict[int, bytes] = {}

                    async def one(i: int) -> None:
                        results[i] = await memo_call(socket, "rev", b"%03d" % i)

                    for i in range(20):
                        calls.start_soon(one, i)
                assert results == {i: (b"%03d" % i)[::-1] for i in range(20)}
                assert log.jobs == 22
                assert len(log.ids) == 1
                peers.cancel_scope.cancel()


async def test_memo_15_idle_memo01_worker_heartbeats_and_memo_19_shutdown_disconnects(
    tmp_path: Path,
) -> None:
    """MEMO-15, MEMO-19."""
    events: list[BrokerEvent] = []
    log = WorkerLog()
    with trio.fail_after(LIMIT):
        with pynng.Req0() as socket:
            async with trio.open_nursery() as outer:
                async with broker(tmp_path, events) as (_, url):
                    socket.dial(url, block=False)
                    outer.start_soon(memo_worker, socket, ["svc"], reverse, log)
                    await until(lambda: log.types().count(HEARTBEAT) >= 4)
                    assert not any(isinstance(e, WorkerExpired) for e in events)
                    # The worker answers each HEARTBEAT with a new request at once: stopped now,
                    # the broker may not hold one yet, and with nothing held there is nothing
                    # to answer DISCONNECT on (under two CPU hogs, 1 run in 4). Half an interval
                    # later it holds the next (0 of 40 runs missed it so), and its next HEARTBEAT
                    # is still half an interval off.
                    await trio.sleep(INTERVAL / 2)
                # The broker stopped (MDP-W-14): the worker's held request got DISCONNECT.
                await until(lambda: DISCONNECT in log.types())
                outer.cancel_scope.cancel()


async def test_memo_15_memo01_worker_that_stops_answering_expires(tmp_path: Path) -> None:
    """MEMO-15."""
    events: list[BrokerEvent] = []
    log = WorkerLog()
    with trio.fail_after(LIMIT):
        async with broker(tmp_path, events) as (tcp, url), trio.open_nursery() as peers:
            with pynng.Req0(dial=url) as socket:
                peers.start_soon(
                    lambda: memo_worker(socket, ["svc"], reverse, log, answer_heartbeats=False)
                )
                await wait_for(events, WorkerExpired)
                async with Client(tcp, timeout=5, retries=0) as client:
                    assert await client.request("mmi.service", b"svc") == [b"404"]
                peers.cancel_scope.cancel()
        assert JOB not in log.types()


async def test_memo_11_domo_trio_memo01_worker_and_client_on_the_same_core(
    tmp_path: Path,
) -> None:
    """MEMO-11, MEMO-20: domo.trio's memo01 worker (two services, two at once) serves an MDP
    client and domo's memo01 client; the memo01 client also reaches an MDP worker. A handler
    that raises makes the worker leave (MEMO-08): the job goes to the next worker."""
    from domo.trio.memo01 import Memo01Client, Memo01Error, run_memo01_worker

    events: list[BrokerEvent] = []
    calls: list[str] = []

    async def handler(service: str, payload: bytes) -> bytes:
        calls.append(service)
        if payload == b"boom" and calls.count(service) == 1:
            raise ValueError("planted")
        return payload[::-1] if service == "rev" else payload.upper()

    with trio.fail_after(LIMIT):
        async with broker(tmp_path, events) as (tcp, url), trio.open_nursery() as peers:
            await peers.start(
                lambda task_status: run_worker(
                    tcp, "upper", upper, config=WORKER, task_status=task_status
                )
            )
            await peers.start(
                lambda task_status: run_memo01_worker(
                    url, ["up", "rev"], handler, concurrency=2, task_status=task_status
                )
            )
            await wait_for(events, WorkerRegistered, 5)  # upper, and 2 workers x 2 seats
            async with Client(tcp, timeout=5, retries=0) as client:
                assert await client.request("rev", b"abc") == [b"cba"]
                assert await client.request("up", b"abc") == [b"ABC"]
            async with Memo01Client(url) as memo:
                assert await memo.call("rev", b"xyz", timeout=5) == b"zyx"
                assert await memo.call("upper", b"mdp worker", timeout=5) == b"MDP WORKER"
                assert await memo.call("up", b"boom", timeout=5) == b"BOOM"  # second worker
                with pytest.raises(Memo01Error, match="no RESULT"):
                    await memo.call("nobody", b"", timeout=0.3)
            peers.cancel_scope.cancel()


async def test_memo_23_a_busy_worker_whose_pipe_closes_loses_its_job_at_once(
    tmp_path: Path,
) -> None:
    """MEMO-23: a memo01 worker that dies holding a JOB (its socket closes, as a SIGKILLed
    one's does) has its job re-dispatched to the other worker at once, not after the 60 s job
    timeout: the MDP/0.2 client's 5 s request is answered."""
    events: list[BrokerEvent] = []
    doomed_log, other_log = WorkerLog(), WorkerLog()
    took = trio.Event()

    async def hang(service: str, payload: bytes) -> bytes:
        took.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    with trio.fail_after(LIMIT), ExitStack() as stack:
        async with (
            broker(tmp_path, events) as (tcp, url),
            trio.open_nursery() as peers,
        ):
            doomed = stack.enter_context(pynng.Req0(dial=url))  # closed at the end either way
            scope = trio.CancelScope()

            async def doomed_worker() -> None:
                with scope:
                    await memo_worker(doomed, ["svc"], hang, doomed_log)

            peers.start_soon(doomed_worker)
            await wait_for(events, WorkerRegistered, 1)
            with pynng.Req0(dial=url) as other:
                peers.start_soon(memo_worker, other, ["svc"], reverse, other_log)
                await wait_for(events, WorkerRegistered, 2)
                async with Client(tcp, timeout=5, retries=0) as client:
                    async with trio.open_nursery() as asking:
                        reply: list[list[bytes]] = []

                        async def ask() -> None:
                            reply.append(await client.request("svc", b"abc"))

                        asking.start_soon(ask)
                        await took.wait()
                        started = trio.current_time()
                        scope.cancel()
                        doomed.close()  # its pipe closes under the broker
                    assert reply == [[b"cba"]]
                    assert trio.current_time() - started < 3 * BROKER.expiry_span + 1
                assert other_log.jobs == 1
                peers.cancel_scope.cancel()
