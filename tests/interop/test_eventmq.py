"""EventMQ 0.3.13's real jobmanager and client helpers against ``domo broker`` (specs/emqp-1.0.md).

An EventMQ user points ``EVENTMQ_WORKER_ADDR`` and their clients at ``domo broker`` and keeps
their jobmanagers and job code. EventMQ runs from its own virtualenv, made here on first use
under ``tmp/cache/`` (reused by every later run) with the pins that work on Python 3.11
(docs: README, "EventMQ"); it is never a domo dependency. Its peers are
``tests/interop/emqp_peers.py``; the jobs they run are ``tests/interop/emqp_jobs.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from ..cli.conftest import StartDomo, run_domo

pytestmark = [pytest.mark.io, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PEERS = HERE / "emqp_peers.py"
# The jobmanager heartbeats every second (EVENTMQ_HEARTBEAT_INTERVAL); the broker's liveness
# span (1 s x 5) leaves room for a loaded machine. EMQP-15.
BEATS = ["--heartbeat-interval", "1", "--liveness", "5"]


class Peer:
    """One EventMQ process (and its process group: a jobmanager forks job processes)."""

    def __init__(self, process: trio.Process, out: Path, err: Path) -> None:
        self.process, self.out, self.err = process, out, err

    def kill(self) -> None:
        if self.process.returncode is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group this fixture started

    def replies(self) -> list[list[str]]:
        lines = self.out.read_text(errors="replace").splitlines()
        return [frames for frames in map(json.loads, lines) if isinstance(frames, list)]

    def log(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")[-3000:]


SpawnPeer = Callable[..., Awaitable[Peer]]


@pytest.fixture
async def eventmq(eventmq_python: Path, tmp_path: Path) -> AsyncIterator[SpawnPeer]:
    """Start ``emqp_peers.py ROLE ENDPOINT ...`` in EventMQ's virtualenv; killed at teardown."""
    started: list[Peer] = []

    async def start(role: str, endpoint: str, *args: str) -> Peer:
        name = f"eventmq-{len(started)}"
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        env = {
            **os.environ,
            "PYTHONPATH": str(HERE),
            "EVENTMQ_CONFIG_FILE": str(tmp_path / "no-such.conf"),  # read no config file
            "EVENTMQ_WORKER_ADDR": endpoint,
            "EVENTMQ_WORKER_ADDR_DEFAULT": endpoint,
            "EVENTMQ_WORKER_ADDR_FAILOVER": endpoint,
            "EVENTMQ_HEARTBEAT_INTERVAL": "1",
        }
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [str(eventmq_python), str(PEERS), role, endpoint, *args],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                start_new_session=True,
            )
        started.append(Peer(process, out, err))
        return started[-1]

    try:
        yield start
    finally:
        for peer in started:
            peer.kill()
            with trio.fail_after(10), trio.CancelScope(shield=True):
                await peer.process.wait()


async def start_broker(domo: StartDomo) -> str:
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *BEATS)
    return await broker.endpoint()


def results(peer: Peer) -> dict[str, Any]:
    """Each job's result by the msgid it answers (EMQP-12: REPLY, id, result, msgid)."""
    return {f[-1]: json.loads(f[4])["value"] for f in peer.replies() if len(f) == 6}


async def test_eventmq_jobmanager_runs_eventmq_client_jobs(
    domo: StartDomo, eventmq: SpawnPeer
) -> None:
    """EMQP-03, EMQP-06, EMQP-10, EMQP-11, EMQP-12, EMQP-15: EventMQ's client submits 12 jobs
    with reply-requested; EventMQ's jobmanager (2 slots) runs them; each result reaches the
    client after its "submitted" receipt."""
    with trio.fail_after(90):
        endpoint = await start_broker(domo)
        manager = await eventmq("jobmanager", endpoint, '[[10, "default"]]', "2")
        client = await eventmq("client", endpoint, "default", "12", "--timeout", "40")
        assert await client.process.wait() == 0, client.log() + manager.log()
        replies = client.replies()
        got = results(client)
        assert sorted(got.values()) == [2 * n for n in range(12)]
        receipts = [f for f in replies if len(f) == 5 and f[2] == "REPLY"]
        assert {f[-1] for f in receipts} == set(got)  # one receipt per job, before its result
        for msgid in got:
            kinds = [len(f) for f in replies if f[-1] == msgid]
            assert kinds == [5, 6], kinds
        assert manager.process.returncode is None, manager.log()


async def test_eventmq_jobs_without_reply_get_receipts_only(
    domo: StartDomo, eventmq: SpawnPeer
) -> None:
    """EMQP-11, EMQP-12: without reply-requested a job ends when handed to the jobmanager; the
    client gets its receipt and no result, and the jobmanager goes on to the next ones."""
    with trio.fail_after(90):
        endpoint = await start_broker(domo)
        manager = await eventmq("jobmanager", endpoint, '[[10, "default"]]', "2")
        client = await eventmq("client", endpoint, "default", "6", "--no-reply", "--timeout", "40")
        assert await client.process.wait() == 0, client.log() + manager.log()
        assert results(client) == {}
        # The slots came back (READY after each job): a job with a result still runs.
        asker = await eventmq("client", endpoint, "default", "2", "--timeout", "40")
        assert await asker.process.wait() == 0, asker.log() + manager.log()
        assert sorted(results(asker).values()) == [0, 2]


async def test_killed_jobmanager_job_is_rerouted(
    domo: StartDomo, eventmq: SpawnPeer, tmp_path: Path
) -> None:
    """EMQP-14: a jobmanager killed mid-job is taken for dead after the liveness span; its job
    (reply-requested) goes to the next jobmanager and its result reaches the client."""
    marker = tmp_path / "started"
    with trio.fail_after(120):
        endpoint = await start_broker(domo)
        first = await eventmq("jobmanager", endpoint, '[[10, "slow"]]', "1")
        args = json.dumps([str(marker), 60, "done"])
        client = await eventmq("job", endpoint, "slow", "emqp_jobs.once_slow", args)
        while not marker.exists():  # noqa: ASYNC110 (a file another process writes)
            await trio.sleep(0.1)
        first.kill()
        second = await eventmq("jobmanager", endpoint, '[[10, "slow"]]', "1")
        assert await client.process.wait() == 0, client.log() + second.log()
        assert list(results(client).values()) == ["done (again)"]


async def test_timeout_header_reaches_the_jobmanager(
    domo: StartDomo, eventmq: SpawnPeer, tmp_path: Path
) -> None:
    """EMQP-26, EMQP-10: the header timeout:1 passes the broker unchanged; EventMQ's jobmanager
    stops the 60 s job after a second and its result, "TimeoutError", reaches the client."""
    with trio.fail_after(60):
        endpoint = await start_broker(domo)
        manager = await eventmq("jobmanager", endpoint, '[[10, "default"]]', "2")
        args = json.dumps([str(tmp_path / "started"), 60, "late"])
        started = trio.current_time()
        client = await eventmq("job", endpoint, "default", "emqp_jobs.once_slow", args, "1")
        assert await client.process.wait() == 0, client.log() + manager.log()
        assert list(results(client).values()) == ["TimeoutError"]
        assert trio.current_time() - started < 30


async def test_mdp_client_calls_an_eventmq_jobmanager(domo: StartDomo, eventmq: SpawnPeer) -> None:
    """EMQP-20: `domo call` (MDP/0.2) asks queue "maths" with an EventMQ job as its body; the
    jobmanager runs it and the result is the FINAL's body."""
    with trio.fail_after(90):
        endpoint = await start_broker(domo)
        manager = await eventmq("jobmanager", endpoint, '[[10, "maths"], [5, "default"]]', "1")
        job = json.dumps(["run", {"path": "emqp_jobs", "callable": "add", "args": [20, 22]}])
        done = await run_domo("call", "maths", job, "--connect", endpoint, "--timeout", "30")
        assert (done.code, done.stdout.strip()) == (0, '{"value": 42}'), done.stderr + manager.log()
        # Not a job: refused with an answer, and the jobmanager is unharmed (EMQP-20, EMQP-09).
        bad = await run_domo("call", "maths", "not json", "--connect", endpoint, "--timeout", "30")
        assert bad.code == 0, bad.stderr
        assert '"error"' in bad.stdout, bad.stdout
        again = await run_domo("call", "default", job, "--connect", endpoint, "--timeout", "30")
        assert again.stdout.strip() == '{"value": 42}', again.stderr + manager.log()


async def test_eventmq_client_calls_an_mdp_worker(domo: StartDomo, eventmq: SpawnPeer) -> None:
    """EMQP-21: EventMQ's client asks queue "echo", served by `domo worker echo` (MDP/0.2): the
    worker gets the job as its body and its FINAL is the client's result."""
    with trio.fail_after(90):
        endpoint = await start_broker(domo)
        await domo("worker", "echo", "--connect", endpoint, *BEATS)
        client = await eventmq("job", endpoint, "echo", "emqp_jobs.add", "[1, 2]")
        assert await client.process.wait() == 0, client.log()
        [result] = [f for f in client.replies() if len(f) == 6]
        assert json.loads(result[4])[1]["args"] == [1, 2]
