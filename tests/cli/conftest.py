"""Helpers for driving the ``domo`` command in real processes.

- ``domo`` fixture: ``await domo(*args)`` starts ``python -m domo ARGS`` with stdout and stderr
  going to files, and returns a ``DomoProcess`` to wait on lines, send signals and wait for the
  exit. Every process it started is killed by PID at teardown if it is still running.
- ``run_domo(*args)``: run a short command (``call``, ``--help``) to its end, bounded by a
  timeout (trio kills it if the timeout strikes), and return its exit code and output.
- Brokers bind ``tcp://127.0.0.1:0`` and tests read the port they print, so ports never clash.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

DOMO = [sys.executable, "-m", "domo"]
QUICK_BEATS = ["--heartbeat-interval", "0.2", "--liveness", "3"]  # a lost peer shows in 0.6 s


@dataclass
class Finished:
    """A ``domo`` process that ran to its end."""

    code: int
    stdout: str
    stderr: str
    elapsed: float


async def run_domo(*args: str, stdin: bytes = b"", time_limit: float = 20.0) -> Finished:
    """Run ``domo ARGS`` to its end (killed if it runs past ``time_limit``)."""
    started = trio.current_time()
    with trio.fail_after(time_limit):
        done = await trio.run_process(
            [*DOMO, *args], stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
        )
    return Finished(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        trio.current_time() - started,
    )


class DomoProcess:
    """A long-running ``domo`` process; its output is read from files as they grow."""

    def __init__(self, process: trio.Process, stdout: Path, stderr: Path) -> None:
        self.process = process
        self.pid = process.pid
        self._paths = {"stdout": stdout, "stderr": stderr}
        self._seen = {"stdout": 0, "stderr": 0}  # lines already returned by ``line``

    def lines(self, stream: str = "stdout") -> list[str]:
        return self._paths[stream].read_text(errors="replace").splitlines()

    async def line(self, contains: str, stream: str = "stdout", time_limit: float = 10.0) -> str:
        """The next line of ``stream`` (after the last one returned) containing ``contains``."""
        with trio.fail_after(time_limit):
            while True:
                lines = self.lines(stream)
                for index in range(self._seen[stream], len(lines)):
                    if contains in lines[index]:
                        self._seen[stream] = index + 1
                        return lines[index]
                if self.process.poll() is not None and len(self.lines(stream)) == len(lines):
                    raise AssertionError(
                        f"domo process {self.pid} exited ({self.process.returncode}) without "
                        f"printing {contains!r} on {stream}:\n" + "\n".join(lines)
                    )
                await trio.sleep(0.02)

    async def endpoint(self) -> str:
        """The endpoint a ``domo broker`` says it listens on (the first one)."""
        return (await self.line("domo broker: listening on ")).rsplit(" ", 1)[1]

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    async def exit_code(self, time_limit: float = 10.0) -> int:
        with trio.fail_after(time_limit):
            return await self.process.wait()


StartDomo = Callable[..., Awaitable[DomoProcess]]


@pytest.fixture
async def domo(tmp_path: Path) -> AsyncIterator[StartDomo]:
    started: list[DomoProcess] = []

    async def start(*args: str) -> DomoProcess:
        number = len(started)
        stdout, stderr = tmp_path / f"domo-{number}.out", tmp_path / f"domo-{number}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = await trio.lowlevel.open_process(
                [*DOMO, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )
        started.append(DomoProcess(process, stdout, stderr))
        return started[-1]

    try:
        yield start
    finally:
        for domo_process in started:
            if domo_process.process.returncode is None:
                os.kill(domo_process.pid, signal.SIGKILL)  # only processes this fixture started
            with trio.fail_after(10), trio.CancelScope(shield=True):
                await domo_process.process.wait()


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    yield
    gc.collect()  # a leaked socket's ResourceWarning fails the test that leaked it
