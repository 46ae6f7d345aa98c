"""Traces written by a real broker over loopback ZeroMQ, read back with pyarrow, counted exactly.

Load (many completed requests from concurrent clients), a worker lost mid-request (re-dispatch to
a second worker), an expiry, a dropped record under a full buffer, and an unwritable directory.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import BrokerEvent, RequestDispatched, RequestExpired, WorkerRegistered
from domo.trio import Client, RequestTimeout, run_worker, serve_broker

from ..trio.conftest import Recorder

pq = pytest.importorskip("pyarrow.parquet")
trace = pytest.importorskip("domo.trace")

pytestmark = pytest.mark.io

BROKER = BrokerConfig(heartbeat_interval=0.2, liveness=3, request_expiry=0.5)
WORKER = WorkerConfig(heartbeat_interval=0.2, liveness=3, reconnect_initial=0.05)


async def echo(body: list[bytes]) -> list[bytes]:
    return body


async def slow(body: list[bytes]) -> list[bytes]:
    await trio.sleep(float(body[0]))
    return body


def read(directory: Path, kind: str) -> list[dict[str, Any]]:
    files = sorted(directory.glob(f"{kind}-*.parquet"))
    rows: list[dict[str, Any]] = []
    for file in files:
        table = pq.read_table(file)
        assert table.schema.metadata[b"domo.trace.schema_version"] == b"1"
        rows.extend(table.to_pylist())
    return rows


async def test_broker_traces_load_redispatch_and_expiry(tmp_path: Path) -> None:
    directory = tmp_path / "traces"
    began = time.time()
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, on_event=events, trace_dir=str(directory))
            bound = (await nursery.start(serve, "tcp://127.0.0.1:0"))[0]
            work = partial(run_worker, config=WORKER)
            await nursery.start(work, bound, "echo", echo)
            await events.wait_for(WorkerRegistered)

            async def load(name: int) -> None:
                async with Client(bound) as client:
                    for index in range(50):
                        body = b"%d-%d" % (name, index)
                        assert await client.request("echo", body) == [body]

            async with trio.open_nursery() as clients:
                for name in range(4):
                    clients.start_soon(load, name)

            # a worker lost mid-request: the request goes to a second worker
            lost_scope = trio.CancelScope()

            async def first_worker() -> None:
                with lost_scope:
                    await work(bound, "slow", slow)

            nursery.start_soon(first_worker)
            await events.wait_for(WorkerRegistered, lambda e: e.service == b"slow")
            async with Client(bound, timeout=10, retries=0) as client:
                async with trio.open_nursery() as inner:
                    result: list[list[bytes]] = []

                    async def ask() -> None:
                        result.append(await client.request("slow", b"0.3"))

                    inner.start_soon(ask)
                    await events.wait_for(RequestDispatched, lambda e: e.service == b"slow")
                    lost_scope.cancel()  # the worker goes away while holding the request
                    await nursery.start(work, bound, "slow", slow)
                assert result == [[b"0.3"]]

            # an expiry: nobody serves "nobody"
            async with Client(bound, timeout=1.0, retries=0) as client:
                with pytest.raises(RequestTimeout):
                    await client.request("nobody", b"x")
            await events.wait_for(RequestExpired)
            nursery.cancel_scope.cancel()

    ended = time.time()
    requests = read(directory, "requests")
    by_service: dict[str, list[dict[str, Any]]] = {}
    for row in requests:
        by_service.setdefault(str(row["service"]), []).append(row)
    assert len(by_service["echo"]) == 200
    assert all(r["outcome"] == "completed" for r in by_service["echo"])
    assert all(r["dialect"] == "mdp02" and r["redispatches"] == 0 for r in by_service["echo"])
    assert all(len(r["workers"]) == 1 for r in by_service["echo"])
    assert all(r["reply_size"] == r["request_size"] for r in by_service["echo"])
    for r in by_service["echo"]:
        assert r["received"] <= r["dispatches"][0] <= r["finished"]
        assert began <= r["wall_anchor"] + r["finished"] <= ended
    [redone] = by_service["slow"]
    assert redone["outcome"] == "completed"
    assert redone["redispatches"] == 1
    assert len(redone["workers"]) == 2
    assert len(redone["dispatches"]) == 2
    assert redone["workers"][0] != redone["workers"][1]
    [expired] = by_service["nobody"]
    assert expired["outcome"] == "expired"
    assert expired["workers"] == []
    assert len(requests) == 202

    workers = read(directory, "workers")
    registered = [w for w in workers if w["change"] == "registered"]
    assert sorted(str(w["service"]) for w in registered) == ["echo", "slow", "slow"]
    gone = [w for w in workers if w["change"] != "registered"]
    # at shutdown every remaining worker is disconnected, plus the one lost mid-request
    assert sorted(str(w["service"]) for w in gone) == ["echo", "slow", "slow"]


def test_full_buffer_drops_and_counts(tmp_path: Path) -> None:
    """The broker never waits: with a buffer of one and no chance to drain, records are counted."""
    from domo.protocol.events import WorkerRegistered as Registered

    recorder = trace.TraceRecorder(tmp_path, wall_anchor=0.0, buffer=1, flush_interval=0.05)
    for index in range(2000):
        recorder.on_event(Registered(worker=b"w%d" % index, service=b"s", at=float(index)))
    stats = recorder.close()
    assert stats.recorded == 2000
    assert stats.dropped > 0
    assert stats.written + stats.dropped == 2000
    assert len(read(tmp_path, "workers")) == stats.written


def test_files_rotate_by_size_and_every_record_is_kept(tmp_path: Path) -> None:
    """A file that reached ``max_bytes`` is closed and the next batch starts a new one."""
    from domo.protocol.events import WorkerRegistered as Registered

    recorder = trace.TraceRecorder(tmp_path, wall_anchor=0.0, batch=100, max_bytes=1)
    for index in range(1000):
        recorder.on_event(Registered(worker=b"w%d" % index, service=b"s", at=float(index)))
    stats = recorder.close()
    assert stats.dropped == 0
    assert stats.written == 1000
    assert len(stats.files) > 1
    assert len(list(tmp_path.glob("workers-*.parquet"))) == len(stats.files)
    rows = read(tmp_path, "workers")
    assert sorted(row["at"] for row in rows) == [float(index) for index in range(1000)]


def test_a_failed_write_is_a_counted_loss_not_a_crash(tmp_path: Path) -> None:
    """The directory vanishes after start (as a disk can fill): records are lost and counted."""
    from domo.protocol.events import WorkerRegistered as Registered

    directory = tmp_path / "gone"
    recorder = trace.TraceRecorder(directory, wall_anchor=0.0)
    directory.rmdir()
    for index in range(10):
        recorder.on_event(Registered(worker=b"w%d" % index, service=b"s", at=float(index)))
    stats = recorder.close()
    assert stats.lost == 10
    assert stats.written == 0
    assert stats.dropped == 0


def test_unwritable_directory_is_an_error_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(trace.TraceDirError, match="not writable"):
        trace.TraceRecorder(blocker / "sub", wall_anchor=0.0)


def test_cli_broker_rejects_unwritable_trace_dir(tmp_path: Path) -> None:
    from domo.cli import main

    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    assert main(["broker", "--bind", "tcp://127.0.0.1:0", "--trace-dir", str(blocker)]) == 2


def test_cli_broker_writes_traces_a_newcomer_can_read(tmp_path: Path) -> None:
    """`domo broker --trace-dir`, an echo worker and `domo call`, all real processes; SIGTERM."""
    import signal
    import subprocess
    import sys

    directory = tmp_path / "traces"
    domo = [sys.executable, "-m", "domo"]
    endpoint = f"ipc://{tmp_path}/b.ipc"
    broker = subprocess.Popen(
        [*domo, "broker", "--bind", endpoint, "--trace-dir", str(directory)],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = subprocess.Popen([*domo, "worker", "echo", "--connect", endpoint])
    try:
        assert broker.stdout is not None
        assert broker.stdout.readline().startswith("domo broker: listening on")
        for index in range(3):
            call = [*domo, "call", "echo", f"hi{index}", "--connect", endpoint, "--timeout", "5"]
            done = subprocess.run(call, capture_output=True, text=True, timeout=30, check=False)
            assert done.returncode == 0, done.stderr
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=20) == 0
    finally:
        for process in (worker, broker):
            process.kill()  # by PID: the processes this test started
            process.wait()
        if broker.stdout is not None:
            broker.stdout.close()
    requests = read(directory, "requests")
    assert [(r["service"], r["outcome"], r["request_size"]) for r in requests] == [
        ("echo", "completed", 3)
    ] * 3


def test_every_event_of_a_request_lands_in_its_record(tmp_path: Path) -> None:
    """The fold, event by event: two dispatches, a re-dispatch, PARTIALs, an expiry, a drop."""
    from domo.protocol import events as ev

    recorder = trace.TraceRecorder(tmp_path, wall_anchor=100.0, dialect=None)
    for event in [
        ev.RequestQueued(1, b"c", b"sv\xff", 5, 1.0),
        ev.RequestDispatched(1, b"c", b"sv\xff", b"w1", 1, 0.5, 1.5),
        ev.RequestRedispatched(1, b"c", b"sv\xff", b"w1", 1, 2.0),
        ev.RequestDispatched(1, b"c", b"sv\xff", b"w2", 2, 0.25, 2.25),
        ev.PartialForwarded(1, b"c", b"sv\xff", b"w2", 7, 2.5),
        ev.PartialForwarded(1, b"c", b"sv\xff", b"w2", 3, 2.6),
        ev.RequestCompleted(1, b"c", b"sv\xff", b"w2", 2, 9, 1.0, 3.0),
        ev.RequestQueued(2, b"c", b"x", 1, 4.0),
        ev.RequestExpired(2, b"c", b"x", 1.0, 5.0),
        ev.RequestQueued(3, b"c", b"x", 1, 4.0),
        ev.RequestDispatched(3, b"c", b"x", b"w1", 1, 0.5, 4.5),
        ev.RequestDropped(3, b"c", b"x", "client-unreachable", b"w1", "MDP-D-24", 6.0),
    ]:
        recorder.on_event(event)
    stats = recorder.close()
    assert (stats.recorded, stats.written, stats.dropped, stats.lost) == (3, 3, 0, 0)
    shared = {"client": b"c", "dialect": None, "wall_anchor": 100.0}
    assert read(tmp_path, "requests") == [
        {
            **shared,
            "request_id": 1,
            "service": "sv\\xff",
            "workers": [b"w1", b"w2"],
            "received": 1.0,
            "dispatches": [1.5, 2.25],
            "queue_waits": [0.5, 0.25],
            "first_partial": 2.5,
            "finished": 3.0,
            "outcome": "completed",
            "redispatches": 1,
            "request_size": 5,
            "reply_size": 9,
            "partials": 2,
            "partial_bytes": 10,
            "drop_reason": None,
            "rule": None,
        },
        {
            **shared,
            "request_id": 2,
            "service": "x",
            "workers": [],
            "received": 4.0,
            "dispatches": [],
            "queue_waits": [],
            "first_partial": None,
            "finished": 5.0,
            "outcome": "expired",
            "redispatches": 0,
            "request_size": 1,
            "reply_size": None,
            "partials": 0,
            "partial_bytes": 0,
            "drop_reason": None,
            "rule": None,
        },
        {
            **shared,
            "request_id": 3,
            "service": "x",
            "workers": [b"w1"],
            "received": 4.0,
            "dispatches": [4.5],
            "queue_waits": [0.5],
            "first_partial": None,
            "finished": 6.0,
            "outcome": "dropped",
            "redispatches": 0,
            "request_size": 1,
            "reply_size": None,
            "partials": 0,
            "partial_bytes": 0,
            "drop_reason": "client-unreachable",
            "rule": "MDP-D-24",
        },
    ]


def test_each_record_names_its_clients_dialect(tmp_path: Path) -> None:
    """A record's dialect is its client's, as the broker knows it (``FamilyBroker.dialect_of``):
    an MDP/0.2 client, an MDP/0.1 REQ client and a DCP client of one MDP/0.2 worker."""
    from domo.protocol.family import FamilyBroker

    broker = FamilyBroker(BROKER)
    recorder = trace.TraceRecorder(tmp_path, wall_anchor=0.0, dialect_of=broker.dialect_of)
    now = 0.0

    def feed(peer: bytes, *frames: bytes) -> None:
        nonlocal now
        now += 0.01
        for event in broker.receive(peer, list(frames), now):
            recorder.on_event(event)

    def answer() -> None:
        for _, to, frames in broker.take_outgoing():
            assert (to, frames[1]) == (b"W", b"\x02")
            feed(b"W", b"MDPW02", b"\x04", bytes(frames[2]), b"", b"ok")
        broker.take_outgoing()
        for event in broker.flushed():
            recorder.on_event(event)

    feed(b"W", b"MDPW02", b"\x01", b"echo")
    feed(b"C2", b"MDPC02", b"\x01", b"echo", b"a")
    answer()
    feed(b"C1", b"", b"MDPC01", b"echo", b"b")
    answer()
    feed(b"D", b"", b"DGBX\x01", b"\x04", b"echo", b"", b"", b"c")
    answer()
    recorder.close()
    rows = read(tmp_path, "requests")
    assert [(r["request_id"], r["outcome"], r["dialect"]) for r in rows] == [
        (1, "completed", "mdp02"),
        (2, "completed", "mdp01"),
        (3, "completed", "dcp"),
    ]
