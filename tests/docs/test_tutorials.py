"""The tutorials' code runs: every file under docs/tutorials/examples/ against a real broker.

Each example is what a tutorial page includes (pymdownx.snippets), so a page cannot show code
that does not work. The broker, workers and clients are real subprocesses on 127.0.0.1, each
bounded in time and killed by PID at the end.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "examples"
BIN = Path(sys.executable).parent
DOMO = str(BIN / "domo") if (BIN / "domo").exists() else "domo"


def start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
    process.communicate(timeout=5)  # reads what is left and closes the pipes
    return process.returncode


@pytest.fixture
def broker() -> Iterator[str]:
    """A `domo broker` on a free loopback port; yields its endpoint, stops it with SIGINT."""
    process = start(DOMO, "broker", "--bind", "tcp://127.0.0.1:0")
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the broker prints this line first, then serves
        assert line.startswith("domo broker: listening on "), line
        yield line.split()[-1]
    finally:
        assert stop(process) == 0


def shell_commands(name: str, endpoint: str) -> list[list[str]]:
    """The commands of a shell example, with the tutorial's endpoint replaced by ``endpoint``."""
    commands = []
    for line in (EXAMPLES / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            line = line.replace("tcp://127.0.0.1:5555", endpoint)
            commands.append(shlex.split(line, comments=True))
    return commands


def test_first_steps_shell_block_runs(broker: str) -> None:
    commands = shell_commands("first_steps.sh", broker)
    assert [c[:2] for c in commands] == [
        ["domo", "broker"],
        ["domo", "worker"],
        ["domo", "call"],
        ["domo", "call"],
    ]
    # The broker of the first line is the fixture's (same command, a free port).
    worker = start(DOMO, *commands[1][1:])
    try:
        echo = subprocess.run(
            [DOMO, *commands[2][1:], "--connect", broker, "--timeout", "2", "--retries", "4"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (echo.returncode, echo.stdout) == (0, "hello\nworld\n"), echo.stderr
        mmi = subprocess.run(
            [DOMO, *commands[3][1:], "--connect", broker],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (mmi.returncode, mmi.stdout.strip()) == (0, "200"), mmi.stderr
    finally:
        assert stop(worker) == 0


def test_python_worker_and_client_run(broker: str) -> None:
    worker = start(sys.executable, str(EXAMPLES / "upper_worker.py"), broker)
    try:
        client = subprocess.run(
            [sys.executable, str(EXAMPLES / "upper_client.py"), broker],
            capture_output=True,
            text=True,
            timeout=30,
            env=os.environ.copy(),
        )
        assert (client.returncode, client.stdout) == (0, "HELLO\nWORLD\n"), client.stderr
    finally:
        stop(worker)


def test_fuzz_tutorial_commands_run() -> None:
    commands = shell_commands("fuzz_broker.sh", "tcp://127.0.0.1:0")
    assert [c[:2] for c in commands] == [["domo", "broker"], ["domo", "fuzz"]]
    broker = start(DOMO, *commands[0][1:])
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()
        assert line.startswith("domo broker: listening on "), line
        endpoint = line.split()[-1]
        fuzz_args = [endpoint if a == "tcp://127.0.0.1:0" else a for a in commands[1][1:]]
        fuzz = subprocess.run([DOMO, *fuzz_args], capture_output=True, text=True, timeout=60)
        assert fuzz.returncode == 0, fuzz.stdout + fuzz.stderr
    finally:
        assert stop(broker) == 0
