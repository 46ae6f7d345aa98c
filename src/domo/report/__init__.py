"""``domo report TRACE_DIR``: what a broker's traces (``domo.trace``) say, computed with Spark.

``run()`` is the whole command: it checks the files' footers with pyarrow (``_scan``), starts a
Spark session (an embedded local one unless ``master`` names a cluster), runs the jobs of
``_analyse`` and prints, draws or writes the result (``_render``). Each expected failure is one
line on stderr and an ``EXIT_*`` code; docs/report.md has the figures' definitions.

This module imports without the ``spark`` extra, so that ``domo report`` can say how to get it.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TextIO

from ._analyse import Filters, NoRequests, Report, bucket_width

__all__ = [
    "EXIT_CODES",
    "EXIT_NO_DATA",
    "EXIT_NO_JAVA",
    "EXIT_NO_SPARK",
    "EXIT_OK",
    "EXIT_READ_FAILED",
    "EXIT_SCHEMA",
    "EXIT_USAGE",
    "Filters",
    "Report",
    "bucket_width",
    "parse_time",
    "run",
]

EXIT_OK: Final = 0  # the report was made (unreadable files, if any, were skipped and named)
EXIT_USAGE: Final = 2  # bad options, or TRACE_DIR is not a directory
EXIT_NO_DATA: Final = 10  # no request record: an empty directory, or the filters matched none
EXIT_SCHEMA: Final = 11  # a file of another trace schema version
EXIT_NO_SPARK: Final = 12  # the spark extra (pyspark, pandas, matplotlib) is not installed
EXIT_NO_JAVA: Final = 13  # no Java 17+ to run Spark
EXIT_READ_FAILED: Final = 14  # Spark failed reading a file whose footer looked fine

# From this many request records on, the JVM is tuned for long jobs rather than a fast start:
# on 1 M records the fast start won (22 against 34 CPU-s in all), on 20 M the full JIT halved
# the time of the first job (measured here, issue 15).
BIG_TRACE: Final = 4_000_000

EXIT_CODES: Final = [
    (EXIT_OK, "the report was made; unreadable trace files are skipped and named on stderr"),
    (EXIT_USAGE, "usage error: bad options, or TRACE_DIR is not a directory"),
    (EXIT_NO_DATA, "no request records in TRACE_DIR, or none matched the filters"),
    (EXIT_SCHEMA, "a trace file has another schema version (made by another domo)"),
    (EXIT_NO_SPARK, "the spark extra is not installed: pip install 'domo[spark]'"),
    (EXIT_NO_JAVA, "no Java 17 or newer to run Spark (apt-get install openjdk-17-jre-headless)"),
    (EXIT_READ_FAILED, "Spark could not read a trace file (damaged inside)"),
]


def parse_time(text: str) -> float:
    """``--since``/``--until``: Unix seconds, or ISO 8601 (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))  # ValueError if not ISO
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


class _Progress:
    """One self-rewriting line on stderr while Spark works, on a terminal only.

    A thread asks Spark's status tracker twice a second how many tasks of the running stages
    are done; on anything but a tty it prints nothing (logs and CI output stay clean).
    """

    def __init__(self, stream: TextIO, steps: int) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.steps = steps
        self.number = 0
        self.name = "starting Spark"
        self.began = time.monotonic()
        self.spark_context: object | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the step and the ticking thread both draw
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="domo-report-progress")
            self._thread.daemon = True
            self._thread.start()

    def step(self, name: str) -> None:
        self.number += 1
        self.name = name
        if self.enabled:
            self._draw()  # at once: a step may end before the next tick

    def _tasks(self) -> str:
        context = self.spark_context
        if context is None:
            return ""
        try:
            tracker = context.statusTracker()  # type: ignore[attr-defined]
            done = total = 0
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
        except Exception:  # the session is stopping: no figure this time
            return ""
        return f", tasks {done}/{total}" if total else ""

    def _draw(self) -> None:
        elapsed = time.monotonic() - self.began
        line = f"domo report: [{self.number}/{self.steps}] {self.name}{self._tasks()}"
        with self._lock:
            self.stream.write(f"\r\x1b[K{line} ({elapsed:.0f} s)")
            self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def run(
    trace_dir: str | Path,
    *,
    master: str | None = None,
    html: str | Path | None = None,
    out: str | Path | None = None,
    filters: Filters | None = None,
    slowest: int = 10,
    driver_memory: str = "2g",
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Make the report of ``trace_dir``; print it, and write ``html``/``out`` if given.

    Returns an ``EXIT_*`` code; every failure is explained in one line on ``stderr``.
    """
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    filters = filters or Filters()

    def fail(code: int, message: str) -> int:
        print(f"domo report: {message}", file=stderr)
        return code

    directory = Path(trace_dir)
    if not directory.is_dir():
        return fail(EXIT_USAGE, f"{directory} is not a directory")
    # The extra is checked before any time goes into Spark (found, not imported: that costs).
    for module in ("pyspark", "pandas", "pyarrow", "matplotlib"):
        try:
            missing = importlib.util.find_spec(module) is None
        except (ImportError, ValueError):  # a parent package that is not importable
            missing = True
        if missing:
            return fail(
                EXIT_NO_SPARK,
                f"needs the spark extra ({module} is missing): pip install 'domo[spark]'",
            )
    from domo.spark import JAVA_HINT, SparkUnavailable, java_command, local_session

    from . import _analyse, _render, _scan

    found = _scan.scan(directory)
    for path, why in found.corrupt:
        print(f"domo report: skipped {path}: {why}", file=stderr)
    if found.other_versions:
        names = ", ".join(
            f"{path.name} (version {version})" for path, version in found.other_versions
        )
        return fail(
            EXIT_SCHEMA,
            f"trace schema version {_scan.SCHEMA_VERSION} is the one this domo reads; "
            f"{names} {'is' if len(found.other_versions) == 1 else 'are'} of another: "
            "report them with the domo that wrote them",
        )
    if not found.requests:
        skipped = f" ({len(found.corrupt)} unreadable, skipped)" if found.corrupt else ""
        return fail(
            EXIT_NO_DATA, f"no request trace files (requests-*.parquet) in {directory}{skipped}"
        )
    if master is None and java_command() is None:
        return fail(EXIT_NO_JAVA, f"no Java found. {JAVA_HINT}")

    progress = _Progress(stderr, steps=_analyse.STEPS)
    try:
        try:
            spark = local_session(
                master,
                app_name="domo report",
                driver_memory=driver_memory,
                big=found.request_rows >= BIG_TRACE,
            )
        except SparkUnavailable as error:
            return fail(EXIT_NO_JAVA, str(error))
        progress.spark_context = spark.sparkContext
        try:
            report = _analyse.analyse(
                spark,
                found.requests,
                found.workers,
                filters,
                slowest=slowest,
                step=progress.step,
            )
        except NoRequests as error:
            return fail(EXIT_NO_DATA, f"{error} in {directory}")
        except Exception as error:
            if type(error).__module__.startswith(("pyspark", "py4j")):
                text = str(error)
                first = text.strip().splitlines()[0] if text.strip() else ""
                named = [p.name for p in [*found.requests, *found.workers] if p.name in text]
                which = ", ".join(named) if named else "the traces"
                return fail(EXIT_READ_FAILED, f"Spark could not read {which}: {first}")
            raise
    finally:
        progress.close()
    report.corrupt = [(str(path), why) for path, why in found.corrupt]
    stdout.write(_render.text(report))
    if html is not None:
        Path(html).write_text(_render.page(report), encoding="utf-8")
        print(f"domo report: wrote {html}", file=stderr)
    if out is not None:
        files = _render.write_parquet(report, Path(out))
        print(f"domo report: wrote {len(files)} Parquet files to {out}", file=stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m domo.report``: the same as ``domo report``."""
    from domo.cli import main as cli_main

    return cli_main(["report", *(sys.argv[1:] if argv is None else argv)])
