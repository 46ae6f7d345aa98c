"""``domo report --master spark://...`` and ``call_service`` on a real standalone cluster.

The cluster (``_cluster.Cluster``: pyspark's own Spark, a master and two one-core workers on
loopback) is shared by these tests. Each driver runs as its own process, as a user's would: this
test process already holds the local session of the other tests, and Spark keeps one per
process. What the cluster gives must be exactly what local mode gives on the same input: the
same report, table for table, and the same replies, row for row; and so after a worker is
SIGKILLed in the middle of the job (Spark runs its tasks again on the other one).
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from domo import report

from ._cluster import Cluster, descendants
from .conftest import broker, generate_traces, worker

pytestmark = [pytest.mark.spark, pytest.mark.io, pytest.mark.slow]

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: domo[spark]")
TABLES = ("services", "workers", "throughput", "drops", "slowest")
DRIVER = Path(__file__).with_name("_driver.py")


def _tables(directory: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: pq.read_table(directory / f"{name}.parquet").to_pylist() for name in TABLES}


def _local(spark: Any, traces: Path, out: Path) -> str:
    """The report in local mode (this process's session): its text; tables in ``out``."""
    stdout = io.StringIO()
    assert report.run(traces, out=out, stdout=stdout, stderr=io.StringIO()) == report.EXIT_OK
    return stdout.getvalue()


def _on_cluster(
    url: str, traces: Path, out: Path, *, timeout: float = 300
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "domo", "report", str(traces), "--master", url, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str], timeout: float = 300) -> str:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == report.EXIT_OK, stderr
    return stdout


@pytest.fixture(scope="module")
def dialects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200,000 synthetic records in 8 files, from clients of three dialects."""
    return generate_traces(
        tmp_path_factory.mktemp("dialects"),
        200_000,
        dialects=("mdp02", "mdp01", "emqp"),
        per_file=25_000,
    )


def test_report_on_the_cluster_is_the_local_report(
    spark: Any, cluster: Cluster, dialects: Path, tmp_path: Path
) -> None:
    text = _local(spark, dialects, tmp_path / "local")
    remote = _finish(_on_cluster(cluster.url, dialects, tmp_path / "cluster"))
    assert remote == text
    assert _tables(tmp_path / "cluster") == _tables(tmp_path / "local")
    assert "mdp01" in text
    assert "emqp" in text
    # the work ran on the workers: each one's executor log is there
    apps = list(cluster.root.glob("work-*/app-*"))
    assert apps


def test_a_worker_killed_mid_job_changes_nothing(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """SIGKILL a worker (and its executor) while the fold's tasks run; same report."""
    # 16 files: 8 tasks (4 per core), each of about 2 s of work on a quiet machine
    traces = generate_traces(tmp_path / "traces", 800_000, seed=11, per_file=50_000)
    text = _local(spark, traces, tmp_path / "local")
    process = _on_cluster(cluster.url, traces, tmp_path / "cluster")
    try:
        victim = cluster.workers[-1]
        deadline = time.monotonic() + 240
        # An executor runs on the worker once the driver holds it; its Python workers, once a
        # task of the fold runs there: that is mid-job.
        while time.monotonic() < deadline and process.poll() is None:
            below = descendants(victim.process.pid)
            if any(name.startswith("python") for _, name in below):
                break
            time.sleep(0.1)
        assert process.poll() is None, "the report ended before a task ran on the worker"
        assert time.monotonic() < deadline
        victim.kill()
        remote = _finish(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        if victim.process.poll() is not None:
            cluster.workers.remove(victim)
            victim.stop()
            cluster.add_worker()  # the next test has two workers again
    assert remote == text
    assert _tables(tmp_path / "cluster") == _tables(tmp_path / "local")


def test_call_service_on_the_cluster_is_call_service_local(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """The same rows through the same broker: the same replies and errors, row for row."""
    from domo.spark import call_service

    bodies = [f"row-{index:05d}" for index in range(2000)]
    bodies[11] = "fail-11"
    bodies[1999] = "fail-1999"
    rows = tmp_path / "rows.parquet"
    import pyarrow as pa

    pq.write_table(
        pa.table({"id": list(range(len(bodies))), "body": [b.encode() for b in bodies]}), rows
    )
    with (
        broker() as endpoint,
        worker(endpoint, "upper", "upper"),
        worker(endpoint, "upper", "upper"),
    ):
        local = call_service(
            spark.read.parquet(str(rows)).repartition(4), "upper", endpoint, window=8
        ).collect()
        done = subprocess.run(
            [sys.executable, str(DRIVER), cluster.url, str(rows), endpoint, str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    on_cluster = pq.read_table(tmp_path / "out").to_pylist()
    expected = sorted(({**row.asDict()} for row in local), key=lambda row: row["id"])
    assert sorted(on_cluster, key=lambda row: row["id"]) == expected
    assert [row["error"] is not None for row in expected].count(True) == 2
    assert expected[0]["reply"] == b"ROW-00000"
