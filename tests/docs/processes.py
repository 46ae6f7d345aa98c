"""Processes for the docs' tests (tests/docs): real subprocesses on 127.0.0.1, each bounded in
time and stopped by PID at the end (the ``processes`` fixture of tests/docs/conftest.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "tutorials" / "examples"  # where the tutorials' commands run
BIN = Path(sys.executable).parent
DOMO = str(BIN / "domo") if (BIN / "domo").exists() else "domo"


class Process:
    """A subprocess whose stdout and stderr are read into lists by threads, as they come."""

    def __init__(self, *argv: str, cwd: Path = EXAMPLES, env: dict[str, str] | None = None):
        self.argv = argv
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.popen.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.popen.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_for(self, what: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``what()`` holds; fail the test with the output so far if it does not."""
        deadline = time.monotonic() + timeout
        while not what():
            if time.monotonic() > deadline or (self.popen.poll() is not None and not what()):
                raise AssertionError(f"{self.argv}: gave up waiting; output so far:\n{self}")
            time.sleep(0.02)

    def line(self, pattern: str, timeout: float = 10.0, stream: str = "out") -> str:
        """The first line of stdout (or stderr) that matches ``pattern``, waited for."""
        lines = self.out if stream == "out" else self.err
        found: list[str] = []

        def seen() -> bool:
            found[:] = [line for line in list(lines) if re.search(pattern, line)]
            return bool(found)

        self.wait_for(seen, timeout)
        return found[0]

    def stop(self, signum: int = signal.SIGINT, timeout: float = 10.0) -> int:
        """Send ``signum`` (if still running), wait; SIGKILL if it does not exit in time."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)
        for reader in self._readers:
            reader.join(timeout=5)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()
        return self.popen.returncode

    def __str__(self) -> str:
        return f"stdout:\n{''.join(self.out)}stderr:\n{''.join(self.err)}"


def run(
    *argv: str, timeout: float = 30, cwd: Path = EXAMPLES, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end (bounded by ``timeout``), its output captured."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def start_broker(
    start: Callable[..., Process], argv: list[str], **kwargs: object
) -> tuple[Process, str]:
    """Start a ``domo broker`` command of a page on a free port; the process and its endpoint."""
    assert argv[:2] == ["domo", "broker"], argv
    args = [re.sub(r"tcp://127\.0\.0\.1:\d+", "tcp://127.0.0.1:0", arg) for arg in argv[2:]]
    broker = start(DOMO, "broker", *args, **kwargs)
    line = broker.line("^domo broker: listening on ")  # printed first, then it serves
    return broker, line.split()[-1]


def wait_for_service(endpoint: str, service: str, timeout: float = 10.0) -> None:
    """Ask the broker (mmi.service) until a worker serves ``service``."""
    deadline = time.monotonic() + timeout
    while True:
        answer = run(DOMO, "call", "mmi.service", service, "--connect", endpoint, timeout=10)
        if answer.stdout.strip() == "200":
            return
        assert time.monotonic() < deadline, f"no worker registered for {service!r}"
        time.sleep(0.05)
