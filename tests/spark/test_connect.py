"""``domo report --remote sc://...`` and ``call_service`` over Spark Connect.

The server (``_cluster.ConnectServer``: pyspark's ``start-connect-server.sh`` on loopback, its
driver on local[2]) is shared by these tests; the clients are processes of their own, with no
JVM: Spark Connect's client is gRPC. The report and the replies must be exactly those of local
mode on the same input.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from domo import report

from ._cluster import ConnectServer
from .conftest import broker, generate_traces, worker

pytestmark = [pytest.mark.spark, pytest.mark.io, pytest.mark.slow]

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: domo[spark]")
TABLES = ("services", "workers", "throughput", "drops", "slowest")
DRIVER = Path(__file__).with_name("_driver.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "domo", "report", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_report_over_connect_is_the_local_report(
    spark: Any, connect_server: ConnectServer, tmp_path: Path
) -> None:
    traces = generate_traces(
        tmp_path / "traces", 100_000, dialects=("mdp02", "majortomo"), per_file=20_000
    )
    local = io.StringIO()
    code = report.run(traces, out=tmp_path / "local", stdout=local, stderr=io.StringIO())
    assert code == report.EXIT_OK
    done = _run(str(traces), "--remote", connect_server.url, "--out", str(tmp_path / "remote"))
    assert done.returncode == report.EXIT_OK, done.stderr
    assert done.stdout == local.getvalue()
    assert "majortomo" in done.stdout
    for name in TABLES:
        assert pq.read_table(tmp_path / "remote" / f"{name}.parquet").to_pylist() == (
            pq.read_table(tmp_path / "local" / f"{name}.parquet").to_pylist()
        ), name


def test_a_connect_url_nobody_serves_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("grpc", reason="the connect extra: pip install 'domo[connect]'")
    generate_traces(tmp_path, 1000)
    done = _run(str(tmp_path), "--remote", "sc://127.0.0.1:1")
    assert done.returncode == report.EXIT_NO_SERVER == 18
    assert done.stderr.startswith("domo report: cannot reach Spark Connect at sc://127.0.0.1:1")
    assert done.stderr.count("\n") == 1, done.stderr


def test_master_and_remote_together_is_a_usage_error(tmp_path: Path) -> None:
    stderr = io.StringIO()
    code = report.run(tmp_path, master="local[1]", remote="sc://127.0.0.1:1", stderr=stderr)
    assert code == report.EXIT_USAGE
    assert "give one" in stderr.getvalue()


def test_call_service_over_connect_is_call_service_local(
    spark: Any, connect_server: ConnectServer, tmp_path: Path
) -> None:
    from domo.spark import call_service

    bodies = [f"row-{index:05d}" for index in range(1000)]
    bodies[3] = "fail-3"
    rows = tmp_path / "rows.parquet"
    import pyarrow as pa

    pq.write_table(
        pa.table({"id": list(range(len(bodies))), "body": [b.encode() for b in bodies]}), rows
    )
    with broker() as endpoint, worker(endpoint, "upper", "upper"):
        local = call_service(
            spark.read.parquet(str(rows)).repartition(4), "upper", endpoint, window=8
        ).collect()
        done = subprocess.run(
            [
                sys.executable,
                str(DRIVER),
                connect_server.url,
                str(rows),
                endpoint,
                str(tmp_path / "out"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    remote = sorted(pq.read_table(tmp_path / "out").to_pylist(), key=lambda row: row["id"])
    assert remote == sorted((row.asDict() for row in local), key=lambda row: row["id"])
    assert remote[3]["error"].startswith("RemoteError: ")
