"""What every Spark test shares: ONE local SparkSession for the whole run, ONE standalone
cluster and ONE Spark Connect server for the tests that need them, and real peers.

Spark's start costs 8 to 16 s here, so the session is session-scoped and every test of this
directory that needs it takes ``spark``; tests that do not (a missing Java, a missing extra)
must not ask for it. Without pyspark (no ``domo[spark]``) those tests skip with the reason.
The cluster (a master and two workers, ``_cluster.Cluster``) and the Connect server start on
first use, once per run, and stop at its end with every process of theirs. Peers are real
processes on loopback: ``domo broker`` and ``_peer.py`` workers, killed by PID.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ._cluster import Cluster, ConnectServer, descendants

__all__ = ["broker", "descendants", "generate_traces", "worker"]

PEER = Path(__file__).with_name("_peer.py")
GENERATOR = Path(__file__).parents[2] / "benchmarks" / "_gen_traces.py"


def generate_traces(
    directory: Path,
    rows: int,
    seed: int = 7,
    dialects: tuple[str, ...] = ("mdp02",),
    per_file: int = 1_000_000,
) -> Path:
    """Synthetic traces (``benchmarks/_gen_traces.py``) in ``directory``; returns it."""
    pytest.importorskip("numpy", reason="numpy comes with domo[spark]")
    spec = importlib.util.spec_from_file_location("_gen_traces", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(directory, rows, seed=seed, dialects=dialects, per_file=per_file)
    return directory


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone Spark cluster on loopback: a master and two one-core workers."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    from domo.spark import java_command

    if java_command() is None:
        pytest.skip("no Java 17+ to run a Spark cluster")
    started = Cluster(tmp_path_factory.mktemp("cluster"))
    yield started
    started.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server on loopback (its driver on local[2])."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    from domo.spark import java_command
    from domo.spark._session import connect_missing

    if (missing := connect_missing()) is not None:
        pytest.skip(f"the Spark Connect client needs {missing}: pip install 'domo[connect]'")
    if java_command() is None:
        pytest.skip("no Java 17+ to run a Spark Connect server")
    started = ConnectServer(tmp_path_factory.mktemp("connect"))
    yield started
    started.stop()


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
