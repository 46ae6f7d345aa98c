"""docs/tutorials/durable-requests.md runs: every command and script it shows, for real.

A broker, Titanic and a worker are ``domo`` processes on a free loopback port, the shell
blocks run in bash with the page's endpoint replaced, Titanic and the broker are SIGKILLed by
PID between two steps as the page says, and the outputs the page shows are compared with what
the run printed (ids and numbers may differ).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.durable_procs import free_port
from tests.docs.test_tutorials import EXAMPLES, PAGE_ENDPOINT, assert_shown, shell_commands

BIN = str(Path(sys.executable).parent)


class Started:
    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        assert argv[0] == "domo", argv
        process = subprocess.Popen(
            [sys.executable, "-m", "domo", *argv[1:]],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.processes.append(process)
        return process


@pytest.fixture
def started() -> Iterator[Started]:
    run = Started()
    yield run
    for process in run.processes:
        if process.poll() is None:
            process.kill()  # only processes this test started
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def wait_line(process: subprocess.Popen[bytes], prefix: str, limit: float = 20.0) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode()
        if line.startswith(prefix):
            return line
        assert line or process.poll() is None, f"exited without printing {prefix!r}"
    raise AssertionError(f"no {prefix!r} within {limit} s")


def bash(script: str, endpoint: str, cwd: Path) -> list[str]:
    """A page's shell block run in bash, its endpoint replaced; stdout and stderr lines."""
    text = (EXAMPLES / script).read_text().replace(PAGE_ENDPOINT, endpoint)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", text],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip  (as a terminal shows it: both streams, in order)
    return done.stdout.splitlines()


def test_requests_survive_a_crash_tutorial(started: Started, tmp_path: Path) -> None:
    """TSP-D-01, TSP-D-04, TSP-F-02: the page's story, step by step."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    services = [
        [word.replace(PAGE_ENDPOINT, endpoint) for word in command]
        for command in shell_commands("durable_start.sh")
    ]
    assert [command[:2] for command in services] == [["domo", "broker"], ["domo", "titanic"]]

    def start_services() -> list[subprocess.Popen[bytes]]:
        broker = started.start(services[0], tmp_path)
        wait_line(broker, "domo broker: listening on")
        titanic = started.start(services[1], tmp_path)
        return [broker, titanic]

    running = start_services()
    wait_line(running[1], "domo titanic: serving")
    submitted = bash("durable_submit.sh", endpoint, tmp_path)
    assert_shown("durable_submit.out", submitted)
    request_id = (tmp_path / "request.id").read_text().strip()
    assert len(request_id) == 32

    for process in running:  # the page's kill -9
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    running = start_services()
    line = wait_line(running[1], "domo titanic: serving")
    assert_shown("durable_restart.out", [line.replace(endpoint, PAGE_ENDPOINT)])

    [worker] = [
        [word.replace(PAGE_ENDPOINT, endpoint) for word in command]
        for command in shell_commands("durable_worker.sh")
    ]
    started.start(worker, tmp_path)
    fetched = bash("durable_fetch.sh", endpoint, tmp_path)  # its --wait 60 covers the retries
    assert_shown("durable_fetch.out", fetched)
    again = subprocess.run(
        [sys.executable, "-m", "domo", "fetch", request_id, "--connect", endpoint],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert again.returncode == 16, again  # closed: unknown now

    client = subprocess.run(
        [sys.executable, "durable_client.py", endpoint],
        cwd=EXAMPLES, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert client.returncode == 0, client.stderr
    assert_shown("durable_client.out", client.stdout.splitlines())
