"""``domo report TRACE_DIR``: what a broker's traces (``domo.trace``) say, computed with Spark.

``run()`` is the whole command: it checks the files' footers with pyarrow (``_scan``), starts a
Spark session (an embedded local one unless ``master`` names a cluster), runs the jobs of
``_analyse`` and prints, draws or writes the result (``_render``). Each expected failure is one
line on stderr and an ``EXIT_*`` code; docs/report.md has the figures' definitions.

This module imports without the ``spark`` extra, so that ``domo report`` can say how to get it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TextIO

from ._analyse import Filters, NoRequests, Report, bucket_width

__all__ = [
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_NO_DATA",
    "EXIT_NO_JAVA",
    "EXIT_NO_SERVER",
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
EXIT_NO_SERVER: Final = 18  # --remote: no Spark Connect server answers at the URL
EXIT_INTERRUPTED: Final = 130  # Ctrl-C (SIGINT): 128 + 2, the shell's convention

EXIT_CODES: Final = [
    (EXIT_OK, "the report was made; unreadable trace files are skipped and named on stderr"),
    (EXIT_USAGE, "usage error: bad options, or TRACE_DIR is not a directory"),
    (EXIT_NO_DATA, "no request records in TRACE_DIR, or none matched the filters"),
    (EXIT_SCHEMA, "a trace file has another schema version (made by another domo)"),
    (EXIT_NO_SPARK, "the spark extra is not installed: pip install 'domo[spark]'"),
    (EXIT_NO_JAVA, "no Java 17 or newer to run Spark (apt-get install openjdk-17-jre-headless)"),
    (EXIT_READ_FAILED, "Spark could not read a trace file (damaged inside)"),
    (EXIT_NO_SERVER, "--remote: no Spark Connect server answers at that URL"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C): no output file was written or changed"),
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

    def __init__(self, stream: TextIO, steps: int, enabled: bool = True) -> None:
        self.stream = stream
        self.enabled = enabled and stream.isatty()
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


def _atomic_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a temporary file beside it, renamed.

    A reader (a browser reloading a live page) sees the old page or the new one, never half.
    """
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)
        with _no_interrupt():
            os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _atomic_directory(path: Path, write: Callable[[Path], list[Path]]) -> list[Path]:
    """``write`` into a fresh directory beside ``path``, which then takes ``path``'s place.

    An earlier ``path`` is replaced only once the new one is complete; an interrupt before
    that leaves it as it was, and no half-written directory behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    try:
        files = write(temporary)
        with _no_interrupt():
            if path.exists():
                os.replace(path, old)
            os.replace(temporary, path)
        shutil.rmtree(old, ignore_errors=True)
        return [path / file.name for file in files]
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


@contextlib.contextmanager
def _no_interrupt() -> Iterator[None]:
    """SIGINT held back (on the main thread) while files are swapped into place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _Spark:
    """The session a report runs on, and how to let go of it on an interrupt.

    While a report runs, SIGINT only raises ``KeyboardInterrupt`` (pyspark's own handler would
    call into the JVM from inside the signal handler, over the connection the interrupted call
    is using, and py4j logs the clash as tracebacks). On the interrupt, a session this run
    started is stopped, and its JVM too; a session that was already running (a caller's own)
    only has this run's jobs cancelled.
    """

    GROUP: Final = "domo-report"

    def __init__(self) -> None:
        self.session: Any = None
        self.created = False
        self.remote = False
        self.stopping = False
        self.interrupt = False  # SIGINT came: whatever Spark raises next is because of it
        self._previous: Any = None
        self._quiet = _QuietPy4j()
        self._py4j_level: int | None = None

    def __enter__(self) -> _Spark:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        logging.getLogger().addFilter(self._quiet)
        return self

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger().removeFilter(self._quiet)
        if self._py4j_level is not None:
            logging.getLogger("py4j").setLevel(self._py4j_level)
            self._py4j_level = None
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.interrupt = True
        # Quiet at once: the interrupt may land inside a py4j call, which logs the connection
        # it then shuts, with tracebacks, before ``interrupted`` runs (CI saw one such line).
        self._quiet_py4j_logs()
        raise KeyboardInterrupt

    def _quiet_py4j_logs(self) -> None:
        """py4j logs nothing below CRITICAL until ``__exit__`` (the connections an interrupt
        cut, as it shuts them, with tracebacks)."""
        if self._py4j_level is None:
            self._py4j_level = logging.getLogger("py4j").level
            logging.getLogger("py4j").setLevel(logging.CRITICAL)

    def start(self, master: str | None, remote: str | None, driver_memory: str) -> Any:
        from domo.spark import local_session, remote_session

        if remote is not None:
            self.remote = True
            self.created = True
            self.session = remote_session(remote, app_name="domo report")
            return self.session
        from pyspark import SparkContext

        self.created = SparkContext._active_spark_context is None
        self.session = local_session(master, app_name="domo report", driver_memory=driver_memory)
        if self._previous is not None:  # pyspark put its own in while the context started
            signal.signal(signal.SIGINT, self._on_sigint)
        self.session.sparkContext.setJobGroup(self.GROUP, "domo report", interruptOnCancel=True)
        return self.session

    def interrupted(self) -> None:
        """Cancel this run's jobs; stop what it started (a second Ctrl-C is ignored meanwhile)."""
        self.stopping = True
        self._quiet_py4j_logs()
        if self.created and not self.remote:
            from domo.spark._session import silence_jvm

            silence_jvm()
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            if self.session is not None and not self.created:
                with contextlib.suppress(Exception):
                    self.session.sparkContext.cancelJobGroup(self.GROUP)
            if self.created:
                with contextlib.suppress(Exception), warnings.catch_warnings():
                    # pyspark warns that the JVM did not stop cleanly: it is stopped below
                    warnings.simplefilter("ignore")
                    if self.remote:
                        self.session.interruptAll()
                    if self.session is not None:
                        self.session.stop()
                if not self.remote:
                    _stop_gateway()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)


class _QuietPy4j(logging.Filter):
    """Drops py4j's tracebacks of a call cut short by Ctrl-C (logged on the root logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        # "KeyboardInterrupt while sending command." and, when pyspark's own SIGINT handler
        # ran (while the context starts), "Exception while sending command.": its call into
        # the JVM clashed with the interrupted one. A real failure of a call still raises.
        return "while sending command" not in record.getMessage()


def _stop_gateway() -> None:
    """End the JVM pyspark started for this process, if it did (also one still starting)."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return
    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if process is not None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except Exception:
            process.kill()
            process.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def run(
    trace_dir: str | Path,
    *,
    master: str | None = None,
    remote: str | None = None,
    html: str | Path | None = None,
    out: str | Path | None = None,
    filters: Filters | None = None,
    slowest: int = 10,
    driver_memory: str = "2g",
    follow: bool = False,
    interval: float = 5.0,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Make the report of ``trace_dir``; print it, and write ``html``/``out`` if given.

    ``master``: a Spark master URL (default: local, every core); ``remote``: a Spark Connect
    server (``sc://host:port``) instead. ``follow``: keep reading ``trace_dir`` as it grows and
    rewrite ``html`` every ``interval`` seconds until interrupted. Returns an ``EXIT_*`` code;
    every failure is explained in one line on ``stderr``, and so is an interrupt (Ctrl-C:
    ``EXIT_INTERRUPTED``, with the jobs cancelled, the session this run started stopped, and no
    output file left half-written).
    """
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    with _Spark() as spark:
        try:
            return _run(
                Path(trace_dir),
                spark,
                master=master,
                remote=remote,
                html=None if html is None else Path(html),
                out=None if out is None else Path(out),
                filters=filters or Filters(),
                slowest=slowest,
                driver_memory=driver_memory,
                follow=follow,
                interval=interval,
                stdout=stdout,
                stderr=stderr,
            )
        except KeyboardInterrupt:
            spark.interrupted()
            stderr.write("\r\x1b[K" if stderr.isatty() else "")
            print(
                "domo report: stopped" if follow else "domo report: interrupted, nothing written",
                file=stderr,
            )
            return EXIT_INTERRUPTED


def _run(
    directory: Path,
    spark: _Spark,
    *,
    master: str | None,
    remote: str | None,
    html: Path | None,
    out: Path | None,
    filters: Filters,
    slowest: int,
    driver_memory: str,
    follow: bool,
    interval: float,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    def fail(code: int, message: str) -> int:
        print(f"domo report: {message}", file=stderr)
        return code

    if not directory.is_dir():
        return fail(EXIT_USAGE, f"{directory} is not a directory")
    if master is not None and remote is not None:
        return fail(EXIT_USAGE, "--master and --remote name two places to run: give one")
    if follow and html is None:
        return fail(EXIT_USAGE, "--follow rewrites an HTML page: give it one with --html FILE")
    if follow and out is not None:
        return fail(EXIT_USAGE, "--follow rewrites only the --html page: run --out without it")
    # The extra is checked before any time goes into Spark (found, not imported: that costs).
    for module in ("pyspark", "pandas", "pyarrow", "matplotlib", "numpy"):
        try:
            missing = importlib.util.find_spec(module) is None
        except (ImportError, ValueError):  # a parent package that is not importable
            missing = True
        if missing:
            return fail(
                EXIT_NO_SPARK,
                f"needs the spark extra ({module} is missing): pip install 'domo[spark]'",
            )
    from domo.spark import JAVA_HINT, SparkUnavailable, java_command
    from domo.spark._session import connect_missing

    from . import _analyse, _scan

    if remote is not None and (absent := connect_missing()) is not None:
        return fail(
            EXIT_NO_SPARK,
            f"--remote needs the connect extra ({absent} is missing): pip install 'domo[connect]'",
        )
    found = _scan.scan(directory)
    if not follow:
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
    if not found.requests and not follow:
        skipped = f" ({len(found.corrupt)} unreadable, skipped)" if found.corrupt else ""
        return fail(
            EXIT_NO_DATA, f"no request trace files (requests-*.parquet) in {directory}{skipped}"
        )
    if master is None and remote is None and java_command() is None:
        return fail(EXIT_NO_JAVA, f"no Java found. {JAVA_HINT}")

    progress = _Progress(stderr, steps=_analyse.STEPS, enabled=not follow)
    try:
        try:
            session = spark.start(master, remote, driver_memory)
        except SparkUnavailable as error:
            return fail(EXIT_NO_SERVER if remote is not None else EXIT_NO_JAVA, str(error))
        if not spark.remote:
            progress.spark_context = session.sparkContext
        if follow:
            assert html is not None
            return _follow(session, directory, html, filters, slowest, interval, stderr)
        try:
            report = _analyse.analyse(
                session,
                [(path.resolve(), found.rows[path]) for path in found.requests],
                [path.resolve() for path in found.workers],
                filters,
                slowest=slowest,
                step=progress.step,
            )
        except NoRequests as error:
            return fail(EXIT_NO_DATA, f"{error} in {directory}")
        except Exception as error:
            if spark.interrupt:  # pyspark's cleanup of the interrupted call raised anew
                raise KeyboardInterrupt from error
            if _from_spark(error):
                return fail(EXIT_READ_FAILED, _read_failure(error, found))
            raise
    finally:
        progress.close()
    report.corrupt = [(str(path), why) for path, why in found.corrupt]
    report.updated = time.time()
    _write(report, html, out, stdout, stderr)
    return EXIT_OK


def _from_spark(error: BaseException) -> bool:
    return type(error).__module__.startswith(("pyspark", "py4j", "grpc"))


def _read_failure(error: BaseException, found: Any) -> str:
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    named = [p.name for p in [*found.requests, *found.workers] if p.name in text]
    if named:
        # The task's own line ("OSError: cannot read FILE: why") says more than Spark's first.
        for line in text.splitlines():
            if "cannot read " in line and named[0] in line:
                first = line.strip()
                break
    which = ", ".join(named) if named else "the traces"
    return f"Spark could not read {which}: {first}"


def _write(
    report: Report, html: Path | None, out: Path | None, stdout: TextIO, stderr: TextIO
) -> None:
    from . import _render

    # Everything is rendered before anything is written: an interrupt while drawing leaves no
    # file behind, and each file is swapped into place whole.
    text = _render.text(report)
    page = None if html is None else _render.page(report)
    stdout.write(text)
    stdout.flush()
    if html is not None and page is not None:
        _atomic_text(html, page)
        print(f"domo report: wrote {html}", file=stderr)
    if out is not None:
        files = _atomic_directory(out, lambda into: _render.write_parquet(report, into))
        print(f"domo report: wrote {len(files)} Parquet files to {out}", file=stderr)


def _follow(
    session: Any,
    directory: Path,
    html: Path,
    filters: Filters,
    slowest: int,
    interval: float,
    stderr: TextIO,
) -> int:
    """Fold each trace file once, as it becomes complete; rewrite the page after each round.

    A file is complete once its Parquet footer reads (the broker writes the footer when it
    closes the file, at rotation or stop, and never touches it again): the files being written
    are left for a later round. The partial aggregates of the files folded so far are kept and
    merged with the new ones, so each round costs what the new files cost.
    """
    from . import _analyse, _partial, _render, _scan

    folded: set[Path] = set()
    merged = _partial.empty(slowest)
    window = filters.window()
    while True:
        began = time.monotonic()
        found = _scan.scan(directory)
        if found.other_versions:
            path, version = found.other_versions[0]
            print(f"domo report: skipped {path}: schema version {version}", file=stderr)
        new = [path for path in found.requests if path not in folded]
        if new:
            fresh = _analyse.fold(
                session, [(str(path.resolve()), found.rows[path]) for path in new], window, slowest
            )
            merged = _partial.merge([merged, fresh])
            folded.update(new)
        lives = _analyse.lifetimes([path.resolve() for path in found.workers], filters.services)
        now = time.time()
        try:
            report = _analyse.finish(
                merged,
                lives,
                filters,
                slowest=slowest,
                files=len(folded) + len(found.workers),
            )
        except NoRequests:
            page = _render.waiting_page(directory, now, interval)
            requests = 0
        else:
            report.updated = now
            report.refresh = interval
            page = _render.page(report)
            requests = report.services[-1]["requests"]
        _atomic_text(html, page)
        waiting = sum(1 for path, _ in found.corrupt if path.name.startswith("requests-"))
        print(
            f"domo report: {_render.when(now)[11:19]} wrote {html}: {requests} requests from "
            f"{len(folded)} files" + (f" ({waiting} still being written)" if waiting else ""),
            file=stderr,
            flush=True,
        )
        time.sleep(max(0.0, interval - (time.monotonic() - began)))
