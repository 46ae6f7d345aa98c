"""Fixtures for the fuzzer tests: brokers in subprocesses, started and killed by PID."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

PLANTED = Path(__file__).with_name("planted_broker.py")
INTERVAL = 0.1  # heartbeat interval agreed between the fuzzer and the brokers under test
LIVENESS = 3


@pytest.fixture
def start_broker() -> Iterator[Callable[[list[str]], str]]:
    """Start a broker that prints its endpoint as its first stdout line; killed at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(argv: list[str]) -> str:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # EOF (empty) if it crashed
        assert line, f"{argv} printed no endpoint (exit code {proc.poll()})"
        return line.split()[-1]

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def planted(start_broker: Callable[[list[str]], str]) -> Callable[..., str]:
    """Start tests/fuzz/planted_broker.py with one flaw (and a dialect); its endpoint."""

    def start(flaw: str, dialect: str = "mdp02") -> str:
        argv = [sys.executable, str(PLANTED), flaw, str(INTERVAL), str(LIVENESS), dialect]
        return start_broker(argv)

    return start
