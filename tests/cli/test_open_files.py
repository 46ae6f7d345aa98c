"""``domo broker`` and its open files: raised as far as allowed, and the limit said when reached.

Each peer holds one of the broker's file descriptors; past the limit ZeroMQ refuses new peers
without a word, so the broker raises its soft limit to the hard one at start and, when the limit
is reached, logs it with what to change. The broker runs as a subprocess whose limits the test
sets (soft 200, hard 256), and the peers are real DEALERs from this process.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import zmq

from domo.runtime import fdlimit

ROOT = Path(__file__).resolve().parents[2]


def _limits(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_raise_open_file_limit_goes_to_the_hard_limit_and_never_lowers() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
        budget = fdlimit.raise_open_file_limit(want=600)
        assert (budget.was, budget.soft) == (min(soft, 512), min(600, budget.hard))
        assert budget.peers == budget.soft - budget.in_use - fdlimit.RESERVE
        assert fdlimit.raise_open_file_limit(want=100).soft == budget.soft  # never lowered
        assert "raised from" in budget.describe()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_broker_at_its_limit_says_so_with_what_to_change(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    with log.open("w") as sink:
        broker = subprocess.Popen(
            [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            cwd=ROOT,
            preexec_fn=lambda: _limits(200, 256),
        )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 1000)
    sockets: list[zmq.Socket[bytes]] = []
    try:
        assert broker.stdout is not None
        first = broker.stdout.readline()
        assert first.startswith("domo broker: listening on "), first
        endpoint = first.split()[-1]
        second = broker.stdout.readline()
        assert "open-file limit 256 (raised from 200), hard limit 256" in second, second
        for _ in range(300):  # more peers than the broker has descriptors
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(endpoint)
            sockets.append(socket)
        deadline = time.monotonic() + 30  # the broker looks every 5 s
        said = ""
        while not said and time.monotonic() < deadline:
            time.sleep(0.2)
            said = next((x for x in log.read_text().splitlines() if "cannot take more" in x), "")
        assert "cannot take more peers" in said, log.read_text()[-2000:]
        assert "of 256 open files in use, new connections are refused" in said
        assert "ulimit -n" in said
    finally:
        for socket in sockets:
            socket.close()
        context.term()
        broker.kill()
        broker.wait(10)
        if broker.stdout is not None:
            broker.stdout.close()
