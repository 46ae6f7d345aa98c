"""The programs in examples/ run as their docstrings say, against a real `domo broker`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from domo.cli import EXIT_OK

from .conftest import StartDomo, run_domo

pytestmark = pytest.mark.io

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_progress_worker_streams_each_step_as_it_starts(
    domo: StartDomo, tmp_path: Path
) -> None:
    """examples/progress_worker.py: `domo call progress 3` prints three steps, then done."""
    with trio.fail_after(30):
        broker = await domo("broker", "--bind", "tcp://127.0.0.1:0")
        endpoint = await broker.endpoint()
        out = tmp_path / "example.out"
        with out.open("wb") as stdout:
            worker = await trio.lowlevel.open_process(
                [sys.executable, str(EXAMPLES / "progress_worker.py"), "--connect", endpoint],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
            )
        try:
            while "serving 'progress'" not in out.read_text():
                assert worker.poll() is None, out.read_text()
                await trio.sleep(0.05)
            done = await run_domo("call", "progress", "3", "--connect", endpoint, "--timeout", "5")
            assert (done.code, done.stdout.splitlines()) == (
                EXIT_OK,
                ["step 1 of 3 ...", "step 2 of 3 ...", "step 3 of 3 ...", "done"],
            ), done.stderr
        finally:
            if worker.returncode is None:
                os.kill(worker.pid, signal.SIGKILL)  # only the process this test started
            with trio.CancelScope(shield=True):
                await worker.wait()


async def test_memo01_worker_serves_an_mdp_client_through_one_broker(
    domo: StartDomo, tmp_path: Path
) -> None:
    """examples/memo01_worker.py (README): one broker, ZeroMQ and NNG endpoints (MEMO-21), an
    MDP client's request served by a memo01 worker (MEMO-20)."""
    pytest.importorskip("pynng")
    pytest.importorskip("cbor2")
    with trio.fail_after(30):
        nng = f"nng+ipc://{tmp_path}/memo.ipc"
        broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", "--bind", nng)
        endpoint = await broker.endpoint()
        assert await broker.line(f"listening on {nng}")
        out = tmp_path / "example.out"
        with out.open("wb") as stdout:
            worker = await trio.lowlevel.open_process(
                [sys.executable, str(EXAMPLES / "memo01_worker.py"), nng.removeprefix("nng+")],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
            )
        try:
            while True:  # READY gets no answer: the broker's mmi.service says when it counts
                found = await run_domo("call", "mmi.service", "reverse", "--connect", endpoint)
                if found.stdout.strip() == "200":
                    break
                assert worker.poll() is None, out.read_text()
                await trio.sleep(0.05)
            done = await run_domo("call", "reverse", "hello", "--connect", endpoint)
            assert (done.code, done.stdout.splitlines()) == (EXIT_OK, ["olleh"]), done.stderr
        finally:
            if worker.returncode is None:
                os.kill(worker.pid, signal.SIGKILL)  # only the process this test started
            with trio.CancelScope(shield=True):
                await worker.wait()


async def test_broker_refuses_an_nng_endpoint_it_cannot_bind_clearly(domo: StartDomo) -> None:
    """MEMO-21: a malformed nng+ endpoint is a usage error naming it."""
    done = await run_domo("broker", "--bind", "nng+udp://127.0.0.1:1")
    assert done.code == 2
    assert "nng+udp://127.0.0.1:1" in done.stderr
