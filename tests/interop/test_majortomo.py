"""majortomo 0.2.0's real Client and Worker against ``domo broker`` (specs/majortomo.md).

A majortomo user swaps the broker for domo's and keeps their clients and workers. majortomo runs
from its own virtualenv (``.bench-venvs/majortomo``, made here on first use with pip from PyPI,
the same one ``benchmarks/brokers.py`` and ``conformance/`` use); it is never a domo dependency.
Its peers are ``conformance/majortomo_peers.py``: an echo worker, and a client that sends
``--count`` requests one after another and exits 0 only if every reply was its own body.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import trio

from ..cli.conftest import QUICK_BEATS, StartDomo, run_domo

pytestmark = [
    pytest.mark.io,
    pytest.mark.slow,
]

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".bench-venvs" / "majortomo"
PEERS = ROOT / "conformance" / "majortomo_peers.py"
SLOW_WORKER = Path(__file__).resolve().with_name("majortomo_slow_worker.py")
# FAM-09's test: a job many liveness spans long (20 s at the default beats in the long form).
SLOW_JOB = float(os.environ.get("DOMO_MAJORTOMO_JOB_SECONDS", "3"))
# majortomo's own heartbeat settings, matched to the broker's QUICK_BEATS (0.2 s, liveness 3).
MAJORTOMO_BEATS = ["--heartbeat-interval", "0.2", "--liveness", "3"]


@pytest.fixture(scope="session")
def majortomo_python() -> Path:
    """The python of a virtualenv with majortomo 0.2.0 and six, created on first use."""
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import majortomo"]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=120)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "majortomo==0.2.0", "six", "pyzmq"],
        check=True,
        timeout=300,
    )
    return python


SpawnPeer = Callable[..., Awaitable[trio.Process]]


@pytest.fixture
async def majortomo_peer(majortomo_python: Path, tmp_path: Path) -> AsyncIterator[SpawnPeer]:
    """Start ``majortomo_peers.py ROLE ...`` in majortomo's virtualenv; killed at teardown."""
    started: list[trio.Process] = []

    async def start(*args: str, script: Path = PEERS) -> trio.Process:
        err = tmp_path / f"majortomo-{len(started)}.err"
        with err.open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [str(majortomo_python), str(script), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        process.stderr_path = err  # type: ignore[attr-defined]
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.returncode is None:
                os.kill(process.pid, signal.SIGKILL)  # only processes this fixture started
            with trio.fail_after(10), trio.CancelScope(shield=True):
                await process.wait()


def stderr_of(process: trio.Process) -> str:
    path: Path = process.stderr_path  # type: ignore[attr-defined]
    return path.read_text(errors="replace")


async def test_majortomo_client_served_by_domo_worker(
    domo: StartDomo, majortomo_peer: SpawnPeer
) -> None:
    """majortomo's Client asks 20 requests of `domo worker echo` through `domo broker`."""
    with trio.fail_after(60):
        broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS)
        endpoint = await broker.endpoint()
        await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
        assert (await run_domo("call", "mmi.service", "echo", "--connect", endpoint)).stdout
        first = await majortomo_peer(
            "client", endpoint, "--count", "1", "--timeout", "5", *MAJORTOMO_BEATS
        )
        assert await first.wait() == 0, stderr_of(first)
        client = await majortomo_peer(
            "client", endpoint, "--count", "20", "--timeout", "5", *MAJORTOMO_BEATS
        )
        code = await client.wait()
        assert code == 0, stderr_of(client)
        assert "ok: 20" in stderr_of(client)


async def test_domo_client_served_by_majortomo_worker(
    domo: StartDomo, majortomo_peer: SpawnPeer
) -> None:
    """A majortomo Worker registers with `domo broker` and answers `domo call`."""
    with trio.fail_after(60):
        broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS)
        endpoint = await broker.endpoint()
        worker = await majortomo_peer("worker", endpoint, *MAJORTOMO_BEATS)
        for number in range(5):
            done = await run_domo(
                "call",
                "echo",
                f"hello {number}",
                "--connect",
                endpoint,
                "--timeout",
                "5",
                "--retries",
                "0",
            )
            assert (done.code, done.stdout.splitlines()) == (0, [f"hello {number}"]), (
                done.stderr + stderr_of(worker)
            )
        assert worker.returncode is None, stderr_of(worker)


async def test_majortomo_client_and_worker_through_domo_broker(
    domo: StartDomo, majortomo_peer: SpawnPeer
) -> None:
    """Both ends majortomo, only the broker is domo's: heartbeats at 0.2 s keep the worker on."""
    with trio.fail_after(60):
        broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS)
        endpoint = await broker.endpoint()
        worker = await majortomo_peer("worker", endpoint, *MAJORTOMO_BEATS)
        await trio.sleep(1.5)  # several heartbeat intervals: the worker must not be dropped
        first = await majortomo_peer(
            "client", endpoint, "--count", "1", "--timeout", "5", *MAJORTOMO_BEATS
        )
        assert await first.wait() == 0, stderr_of(first) + stderr_of(worker)
        client = await majortomo_peer(
            "client", endpoint, "--count", "50", "--timeout", "5", *MAJORTOMO_BEATS
        )
        assert await client.wait() == 0, stderr_of(client) + stderr_of(worker)
        assert "ok: 50" in stderr_of(client)
        assert "disconnected by the broker" not in stderr_of(worker)


async def test_maj_08_a_majortomo_job_longer_than_liveness_runs_once(
    domo: StartDomo, majortomo_peer: SpawnPeer
) -> None:
    """MAJ-08, FAM-09: majortomo's Worker is silent while its job runs; with two of them and
    a job five liveness spans long (``DOMO_MAJORTOMO_JOB_SECONDS``, 3 s by default; 20 s at
    the default beats for the long form), the request runs once and its reply comes back.
    Before FAM-09 the broker took the busy worker for dead and ran the job on the other."""
    beats = QUICK_BEATS if SLOW_JOB < 10 else []
    worker_beats = MAJORTOMO_BEATS if SLOW_JOB < 10 else []
    with trio.fail_after(SLOW_JOB * 2 + 40):
        broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *beats, "--log-level", "debug")
        endpoint = await broker.endpoint()
        workers = [
            await majortomo_peer(
                endpoint, "--work", str(SLOW_JOB), *worker_beats, script=SLOW_WORKER
            )
            for _ in range(2)
        ]
        for _ in workers:  # both registered: either may be handed the job
            assert "serves 'slow'" in await broker.line("WorkerRegistered:", "stderr")
        done = await run_domo(
            "call", "slow", "once", "--connect", endpoint,
            "--timeout", str(SLOW_JOB + 20), "--retries", "0", time_limit=SLOW_JOB + 30,
        )  # fmt: skip
        assert (done.code, done.stdout) == (0, "once\n"), done.stderr
        runs = [line for w in workers for line in stderr_of(w).splitlines() if line == "job once"]
        assert runs == ["job once"], [stderr_of(w) for w in workers]
