"""``domo report`` on traces a real broker wrote under load with failures, and on bad input.

The traces come from ``domo broker --trace-dir`` (a process) with ``_peer.py`` workers: 200
requests from 4 concurrent clients, a worker SIGKILLed while it holds a request (the broker
notices by heartbeat, expires the worker and re-dispatches the request), and a request that
expires unserved. The report's Parquet aggregates must give the exact counts. Bad directories
(empty, another schema version, a corrupt file, no Java) are checked without starting Spark
where the report does not need it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from domo import report
from domo.sync import Client, RequestTimeout

from .conftest import broker, worker

pytestmark = [pytest.mark.spark, pytest.mark.io, pytest.mark.slow]

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: domo[spark]")
HEARTBEAT = "0.2"


def _load(endpoint: str, name: int, errors: list[BaseException]) -> None:
    try:
        with Client(endpoint, timeout=10.0) as client:
            for index in range(50):
                body = b"c%d-%d" % (name, index)
                assert client.request("upper", body) == [body.upper()]
    except BaseException as error:
        errors.append(error)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace directory written by a real broker: load, a killed worker, an expiry."""
    directory = tmp_path_factory.mktemp("traces")
    options = ["--heartbeat-interval", HEARTBEAT, "--liveness", "3", "--request-expiry", "1"]
    with (
        broker(*options, "--trace-dir", str(directory)) as endpoint,
        worker(endpoint, "upper", "upper", 0.2),
        worker(endpoint, "upper", "upper", 0.2),
    ):
        errors: list[BaseException] = []
        clients = [
            threading.Thread(target=_load, args=(endpoint, name, errors)) for name in range(4)
        ]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(timeout=60)
        assert not errors

        with worker(endpoint, "slow", "sleep", 0.2) as doomed:
            replies: list[list[bytes]] = []

            def ask() -> None:
                with Client(endpoint, timeout=20.0, retries=0) as client:
                    replies.append(client.request("slow", b"30"))

            asking = threading.Thread(target=ask)
            asking.start()
            time.sleep(0.3)  # the only "slow" worker (registered) has the request, sleeping
            # A second worker that answers at once; then the first dies mid-request.
            with worker(endpoint, "slow", "upper", 0.2):
                doomed.kill()  # SIGKILL, by PID: no DISCONNECT; the broker finds it gone
                asking.join(timeout=30)
            assert replies == [[b"30"]]

        # A worker that stops answering heartbeats (SIGSTOP) but keeps its connection: the
        # broker expires it after 3 x 0.2 s.
        with worker(endpoint, "frozen", "upper", 0.2) as frozen:
            frozen.send_signal(signal.SIGSTOP)
            time.sleep(1.5)
            frozen.kill()

        with Client(endpoint, timeout=3.0, retries=0) as client, pytest.raises(RequestTimeout):
            client.request("nobody", b"x")  # the broker expires it after 1 s
    return directory


def _table(directory: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(directory / f"{name}.parquet").to_pylist()
    return rows


def test_report_counts_a_real_brokers_traces_exactly(
    spark: Any, traces: Path, tmp_path: Path
) -> None:
    corrupt = traces / "requests-20990101T000000Z-1-000000.parquet"
    corrupt.write_bytes(b"PAR1 this is not a Parquet file")
    out, page = tmp_path / "out", tmp_path / "report.html"
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        code = report.run(traces, out=out, html=page, stdout=stdout, stderr=stderr)
    finally:
        corrupt.unlink()
    assert code == report.EXIT_OK, stderr.getvalue()
    assert f"skipped {corrupt}" in stderr.getvalue()
    assert "Skipped 1 unreadable files" in stdout.getvalue()

    services = {row["service"]: row for row in _table(out, "services")}
    assert set(services) == {"upper", "slow", "nobody", None}  # "frozen" had no request
    counts = {
        name: (row["requests"], row["completed"], row["expired"], row["dropped"])
        for name, row in services.items()
    }
    assert counts == {
        "upper": (200, 200, 0, 0),
        "slow": (1, 1, 0, 0),
        "nobody": (1, 0, 1, 0),
        None: (202, 201, 1, 0),
    }
    assert services["slow"]["redispatches"] == 1
    assert services[None]["redispatches"] == 1
    upper = services["upper"]
    assert 0 < upper["latency_p50"] <= upper["latency_p95"] <= upper["latency_p99"]
    assert upper["service_time_p99"] <= upper["latency_p99"]
    assert services["nobody"]["queue_wait_p50"] is None  # never dispatched
    assert services["nobody"]["latency_p50"] >= 1.0  # expired after the 1 s request expiry

    workers = _table(out, "workers")
    upper_workers = [row for row in workers if row["service"] == "upper"]
    assert len(upper_workers) == 2
    assert sum(row["attempts"] for row in upper_workers) == 200
    assert sum(row["completed"] for row in upper_workers) == 200
    assert all(0 < row["utilisation"] < 1 for row in upper_workers)
    slow = sorted(
        (row["attempts"], row["completed"], row["lost"], row["disconnects"])
        for row in workers
        if row["service"] == "slow"
    )
    # The killed one lost the request (the broker found it unreachable and re-dispatched); the
    # second answered; both are gone when the test ends.
    assert slow == [(1, 0, 1, 1), (1, 1, 0, 1)]
    [frozen] = [row for row in workers if row["service"] == "frozen"]
    assert (frozen["attempts"], frozen["expiries"], frozen["utilisation"]) == (0, 1, 0.0)

    throughput = _table(out, "throughput")
    assert sum(row["completed"] for row in throughput) == 201
    assert _table(out, "drops") == []
    slowest = _table(out, "slowest")
    assert len(slowest) == 10
    assert {row["service"] for row in slowest[:2]} == {"slow", "nobody"}

    text = page.read_text()
    assert text.count("<svg") == 3
    for fetch in ("<script", "<link", "<img", "src=", "@import"):
        assert fetch not in text  # the page loads nothing: it opens offline
    assert re.search(r"url\((?!#)", text) is None  # only references inside the page
    assert re.search(r"href=.(?!#)", text) is None


def test_report_filters_by_service_and_time(spark: Any, traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = io.StringIO()
    code = report.run(
        traces, out=out, filters=report.Filters(services=["slow", "nobody"]), stdout=sink
    )
    assert code == report.EXIT_OK
    assert {row["service"]: row["requests"] for row in _table(out, "services")} == {
        "slow": 1,
        "nobody": 1,
        None: 2,
    }
    assert {row["service"] for row in _table(out, "workers")} == {"slow", "nobody"} - {"nobody"}

    code = report.run(
        traces, filters=report.Filters(since=time.time() + 3600), stdout=sink, stderr=sink
    )
    assert code == report.EXIT_NO_DATA
    assert "match the filters" in sink.getvalue()


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "domo", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_empty_directory_is_exit_7(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    result = _run_cli(str(tmp_path))
    assert result.returncode == report.EXIT_NO_DATA == 10
    assert "no request trace files" in result.stderr


def test_another_schema_version_is_exit_8(traces: Path, tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    source = sorted(traces.glob("requests-*.parquet"))[0]
    table = pq.read_table(source)
    meta = dict(table.schema.metadata)
    meta[b"domo.trace.schema_version"] = b"2"
    shutil.copy(source, tmp_path / source.name)
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "requests-x-1-000001.parquet")
    result = _run_cli(str(tmp_path))
    assert result.returncode == report.EXIT_SCHEMA == 11
    assert "requests-x-1-000001.parquet (version 2)" in result.stderr


def test_only_corrupt_files_is_exit_7_and_each_is_named(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    (tmp_path / "requests-a-1-000000.parquet").write_bytes(b"")
    (tmp_path / "requests-b-1-000000.parquet").write_bytes(b"garbage" * 100)
    result = _run_cli(str(tmp_path))
    assert result.returncode == report.EXIT_NO_DATA
    assert "requests-a-1-000000.parquet" in result.stderr
    assert "requests-b-1-000000.parquet" in result.stderr
    assert "2 unreadable, skipped" in result.stderr


def test_no_java_is_exit_10_with_how_to_get_it(traces: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    java = shutil.which("java")
    env = dict(os.environ)
    env.pop("JAVA_HOME", None)
    if java is not None:  # PATH without the directories that hold a java
        keep = [
            part
            for part in env.get("PATH", "").split(os.pathsep)
            if not (Path(part) / "java").exists()
        ]
        env["PATH"] = os.pathsep.join(keep)
    result = _run_cli(str(traces), env=env)
    assert result.returncode == report.EXIT_NO_JAVA == 13
    assert "openjdk-17-jre-headless" in result.stderr


def test_progress_line_on_a_terminal_only(spark: Any, traces: Path) -> None:
    """On a tty, stderr gets the self-rewriting step line; on anything else, nothing of it."""
    import pty

    master, slave = pty.openpty()
    received: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end is closed
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    with open(slave, "w", closefd=True) as terminal:
        code = report.run(traces, stdout=io.StringIO(), stderr=terminal)
    reader.join(timeout=10)
    os.close(master)
    assert code == report.EXIT_OK
    text = b"".join(received).decode()
    assert "domo report: [" in text
    assert "[1/3] folding 202 request records" in text

    plain = io.StringIO()
    assert report.run(traces, stdout=io.StringIO(), stderr=plain) == report.EXIT_OK
    assert "domo report: [" not in plain.getvalue()


def test_damage_inside_a_file_is_exit_11(spark: Any, traces: Path, tmp_path: Path) -> None:
    """A file whose footer reads well but whose data pages are damaged: Spark fails on it."""
    for path in traces.glob("*.parquet"):
        shutil.copy(path, tmp_path / path.name)
    [damaged] = sorted(tmp_path.glob("requests-*.parquet"))[:1]
    data = bytearray(damaged.read_bytes())
    data[8:2048] = b"\xff" * (
        2048 - 8
    )  # pages start after the 4-byte magic; the footer is at the end
    damaged.write_bytes(bytes(data))
    pq.read_metadata(damaged)  # the footer is still sound: the scan keeps the file
    stderr = io.StringIO()
    assert report.run(tmp_path, stdout=io.StringIO(), stderr=stderr) == report.EXIT_READ_FAILED
    assert f"Spark could not read {damaged.name}: " in stderr.getvalue()
