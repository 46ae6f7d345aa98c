"""Fixtures of the behaviour suite: ``runtime`` (each test runs over trio, asyncio and sync),
``spawn`` (subprocess peers, killed by PID), and a garbage collection after each test so that a
leaked socket fails the test that leaked it (as in tests/trio)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.trio.conftest import collect_garbage, free_tcp_port

from .drivers import LIMIT, RUNTIMES, Runtime

__all__ = ["collect_garbage", "free_tcp_port"]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=list(RUNTIMES))
def runtime(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    made = RUNTIMES[request.param]()
    try:
        yield made
    finally:
        made.close()


class Peer:
    """A subprocess of ``tests/runtimes/peer.py``; ``line`` waits for one of its lines."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []

    def line(self, prefix: str) -> str:
        assert self.process.stdout is not None
        while True:  # bounded: the peer prints or exits; the test's limit is the backstop
            text = self.process.stdout.readline()
            if not text:
                raise AssertionError(f"peer {self.process.pid} exited; it said {self.lines}")
            self.lines.append(text.rstrip("\n"))
            if text.startswith(prefix):
                return text.rstrip("\n")

    def kill(self) -> None:
        self.process.kill()  # by PID: a process this suite started
        self.process.wait(LIMIT)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Peer]]:
    peers: list[Peer] = []

    def start(*args: str) -> Peer:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.runtimes.peer", *args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        peers.append(Peer(process))
        return peers[-1]

    yield start
    for peer in peers:
        if peer.process.returncode is None:
            peer.kill()
        if peer.process.stdout is not None:
            peer.process.stdout.close()
