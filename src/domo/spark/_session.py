"""A local SparkSession started the fast and quiet way measured on our machines.

The settings and why (``shared/reference/pyspark-on-this-machine.md``): the JVM's C1-only JIT
and serial GC about halve its start-up CPU; no UI (it would listen on port 4040 of the public
interface and parallel sessions collide there); few shuffle partitions on a small machine; log4j
at WARN so that a report's output is not buried under INFO lines; ``SPARK_LOCAL_IP`` so that
Spark binds to loopback rather than guessing an interface; the Python workers run this very
interpreter (``PYSPARK_PYTHON``), the one domo and pyarrow are installed in.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import urllib.parse
from pathlib import Path
from typing import IO, Any, Final

__all__ = [
    "CONNECT_HINT",
    "INSTALL_HINT",
    "JAVA_HINT",
    "SparkUnavailable",
    "java_command",
    "local_session",
    "remote_session",
    "silence_jvm",
]

INSTALL_HINT: Final = "this needs the spark extra: pip install 'domo[spark]'"
CONNECT_HINT: Final = "Spark Connect needs the connect extra: pip install 'domo[connect]'"
# What pyspark's own Spark Connect client imports (pyspark[connect] of pyspark 4), by module.
CONNECT_MODULES: Final = ("grpc", "grpc_status", "google.rpc", "zstandard")
JAVA_HINT: Final = (
    "Spark needs Java 17 or newer on PATH (or JAVA_HOME pointing at it): on Debian or Ubuntu "
    "`apt-get install openjdk-17-jre-headless`, elsewhere a JDK from https://adoptium.net"
)
FAST_JVM_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
# For long jobs: the full JIT (C2) runs Spark's generated code about twice as fast, once warm.
BIG_JVM_OPTIONS: Final = "-XX:+UseParallelGC -XX:-UsePerfData"
_LOG4J: Final = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.shutdown.name = org.apache.spark.util.ShutdownHookManager
logger.shutdown.level = error
"""


# The one line the JVM prints itself at start (pyspark adds the module), which log4j cannot stop.
_INCUBATOR_LINE: Final = b"WARNING: Using incubator modules: jdk.incubator.vector"
_quiet = threading.Event()  # set: the JVM's stderr is dropped (the report was interrupted)


def silence_jvm() -> None:
    """Drop what the JVM this module started writes to stderr from now on.

    After an interrupt the JVM logs the sockets and tasks it lost as warnings with stack
    traces: nothing a user who pressed Ctrl-C needs to read.
    """
    _quiet.set()


def _relay(source: IO[bytes], into: Any) -> None:
    """Copy the JVM's stderr to ours, line by line, minus the incubator line and, once
    silenced, everything."""
    with source:
        for line in iter(source.readline, b""):
            if _quiet.is_set() or line.rstrip() == _INCUBATOR_LINE:
                continue
            try:
                into.buffer.write(line) if hasattr(into, "buffer") else into.write(
                    line.decode("utf-8", "replace")
                )
                into.flush()
            except (OSError, ValueError):  # our stderr is closed: nothing to copy to
                pass


def _launch_jvm(master: str, app_name: str, settings: dict[str, str]) -> None:
    """Start pyspark's JVM gateway with its stderr through ``_relay`` (if none runs yet).

    pyspark would start it itself inside ``getOrCreate``, with the same settings, but with
    its stderr straight on ours.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        _quiet.clear()
        conf = SparkConf(loadDefaults=False).setMaster(master).setAppName(app_name)
        conf.setAll(list(settings.items()))
        # The relay reads from the start: if the JVM fails to start, its reasons get through.
        reader, writer = os.pipe()
        relay = threading.Thread(
            target=_relay, args=(os.fdopen(reader, "rb"), sys.stderr), name="domo-jvm-stderr"
        )
        relay.daemon = True
        relay.start()
        # SIGINT waits until the gateway is recorded: pyspark, interrupted while the JVM starts,
        # deletes the file the JVM is about to write its port to, and that JVM then never
        # exits (its main thread dies, its server thread does not; seen here). Once recorded,
        # an interrupt can stop it. (A handler that only takes note, not a signal mask: the
        # signal may land on another thread, and Python runs handlers on the main one anyway.)
        main = threading.current_thread() is threading.main_thread()
        pending: list[int] = []
        previous = (
            signal.signal(signal.SIGINT, lambda number, _: pending.append(number)) if main else None
        )
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stderr": writer})
            SparkContext._gateway = gateway
            SparkContext._jvm = gateway.jvm
        finally:
            os.close(writer)
            if main:
                signal.signal(signal.SIGINT, previous)
        if pending:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


class SparkUnavailable(Exception):
    """pyspark is not installed, or no Java to run it; the message says how to get it."""


def java_command() -> str | None:
    """The ``java`` Spark would run: ``$JAVA_HOME/bin/java`` if JAVA_HOME is set, else PATH's."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        return str(java) if java.is_file() and os.access(java, os.X_OK) else None
    return shutil.which("java")


def _log4j_file() -> Path:
    directory = Path(tempfile.gettempdir()) / f"domo-spark-{os.getuid()}"
    directory.mkdir(exist_ok=True)
    path = directory / "log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J:
        path.write_text(_LOG4J)
    return path


def connect_missing() -> str | None:
    """The first module the Spark Connect client needs that is not installed, or None."""
    import importlib.util

    for module in CONNECT_MODULES:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):  # a parent package that is not importable
            return module
    return None


def remote_session(url: str, *, app_name: str = "domo") -> Any:
    """A Spark Connect session to the server at ``url`` (``sc://host:port``).

    No JVM runs in this process: the server runs every job, and reads the files a job names from
    its own file system. Raises ``SparkUnavailable`` without pyspark or the Connect client's
    modules (the ``connect`` extra), or if the server cannot be reached.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as error:
        raise SparkUnavailable(f"{INSTALL_HINT} ({error})") from error
    missing = connect_missing()
    if missing is not None:
        raise SparkUnavailable(f"{CONNECT_HINT} ({missing} is missing)")
    # pyspark's client retries an unreachable server for minutes; a TCP connect says at once.
    place = urllib.parse.urlsplit(url)
    if place.scheme != "sc" or not place.hostname:
        raise SparkUnavailable(f"not a Spark Connect URL: {url!r} (sc://HOST:PORT)")
    try:
        with socket.create_connection((place.hostname, place.port or 15002), timeout=10):
            pass
    except OSError as error:
        raise SparkUnavailable(f"cannot reach Spark Connect at {url}: {error}") from error
    try:
        session = SparkSession.builder.remote(url).appName(app_name).getOrCreate()
        session.range(1).collect()  # the first call is the one that reaches the server
    except Exception as error:  # SparkConnectGrpcException, a bad URL (PySparkValueError)...
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SparkUnavailable(f"cannot reach Spark Connect at {url}: {first}") from error
    return session


def local_session(
    master: str | None = None,
    *,
    app_name: str = "domo",
    driver_memory: str = "2g",
    config: dict[str, str] | None = None,
    big: bool = False,
) -> Any:
    """A ``pyspark.sql.SparkSession``: ``local[*]`` unless ``master`` names a cluster.

    Raises ``SparkUnavailable`` without pyspark or without Java. An already running session of
    this process is returned as is (Spark keeps one per process); its settings stay as they were.
    ``config`` adds or overrides Spark settings. ``big``: tune the JVM for long jobs (the full
    JIT compiler, a parallel GC) rather than for a fast start (the C1 compiler only, which about
    halves the CPU of start-up and of small jobs, measured on our machines).
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as error:
        raise SparkUnavailable(f"{INSTALL_HINT} ({error})") from error
    if java_command() is None:
        raise SparkUnavailable(f"no Java found. {JAVA_HINT}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    jvm = BIG_JVM_OPTIONS if big else FAST_JVM_OPTIONS
    java_options = f"{jvm} -Dlog4j2.configurationFile=file:{_log4j_file()}"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
        "spark.default.parallelism": str(max(2, os.cpu_count() or 2)),
        "spark.driver.memory": driver_memory,
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    settings.update(config or {})
    builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        _launch_jvm(master or "local[*]", app_name, settings)
        session = builder.getOrCreate()
    except Exception as error:  # PySparkRuntimeError [JAVA_GATEWAY_EXITED] and the like
        if "JAVA_GATEWAY_EXITED" in str(error) or "Java gateway" in str(error):
            raise SparkUnavailable(f"Spark's JVM did not start ({error}). {JAVA_HINT}") from error
        raise
    session.sparkContext.setLogLevel("WARN")
    return session
