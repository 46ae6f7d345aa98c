"""What every Spark test shares: ONE local SparkSession for the whole run, and real peers.

Spark's start costs 8 to 16 s here, so the session is session-scoped and every test of this
directory that needs it takes ``spark``; tests that do not (a missing Java, a missing extra)
must not ask for it. Without pyspark (no ``domo[spark]``) those tests skip with the reason.
Peers are real processes on loopback: ``domo broker`` and ``_peer.py`` workers, killed by PID.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

PEER = Path(__file__).with_name("_peer.py")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test run (local[2], the fast settings of domo.spark)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    pytest.importorskip("pandas", reason="pandas is not installed: pip install 'domo[spark]'")
    from domo.spark import SparkUnavailable, local_session

    try:
        session = local_session("local[2]", app_name="domo tests", driver_memory="1g")
    except SparkUnavailable as error:
        pytest.skip(str(error))
    yield session
    session.stop()


@contextmanager
def broker(*options: str) -> Iterator[str]:
    """``domo broker`` on a free loopback port; yields its endpoint, kills it by PID after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0", *options],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("domo broker: listening on "), line
        yield line.rsplit(" ", 1)[-1].strip()
    finally:
        process.terminate()  # SIGTERM: the broker stops gracefully and closes its trace files
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


@contextmanager
def worker(endpoint: str, service: str, kind: str, heartbeat: float = 2.5) -> Iterator[Any]:
    """A ``_peer.py`` worker process; yields the ``Popen``; killed by PID after."""
    process = subprocess.Popen(
        [sys.executable, str(PEER), endpoint, service, kind, str(heartbeat)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
