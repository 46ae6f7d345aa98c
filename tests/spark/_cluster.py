"""A real Spark standalone cluster and a Spark Connect server, for the tests, from pyspark's own
Spark: ``bin/spark-class`` runs the standalone Master and Workers, ``sbin/start-connect-server.sh
--wait`` the Connect server. Loopback only (``SPARK_LOCAL_IP`` and ``--host 127.0.0.1``), ports
chosen by the kernel and read back from the daemons' logs, the master's REST server off (it
would take port 6066). Each daemon is a process this module started: stopped by PID (SIGTERM,
then SIGKILL), with every process below it (executors, Python workers) found in /proc first.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Final

# The daemons' JVMs: the fast-start options of domo.spark, and small heaps (they only route).
DAEMON_JAVA_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
START_TIMEOUT: Final = 180.0  # a JVM's start on a loaded 2-core machine takes 10 to 40 s


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def descendants(root: int) -> list[tuple[int, str]]:
    """(pid, command name) of every process below ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        pid = int(entry.name)
        names[pid] = stat[stat.index("(") + 1 : stat.rindex(")")]
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(pid)
    found: list[tuple[int, str]] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append((pid, names.get(pid, "")))
        stack.extend(children.get(pid, []))
    return found


def _environment(logs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(logs),
            "SPARK_PID_DIR": str(logs),
            "SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTIONS,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # The executors' Python workers: this interpreter, where domo is installed.
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    return env


class _Daemon:
    """One process started here, its output in a log file."""

    def __init__(self, command: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self._output: IO[bytes] = log.open("wb")
        self.process = subprocess.Popen(
            command,
            stdout=self._output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own group: a Ctrl-C at the terminal leaves it be
        )

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first match of ``pattern`` in the log; fails if the process dies or time runs."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if match := re.search(pattern, text):
                return match
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.log.name}: exited {self.process.returncode}:\n{text}")
            time.sleep(0.2)
        raise TimeoutError(f"{self.log.name}: no {pattern!r} in {START_TIMEOUT} s")

    def kill(self, how: int = signal.SIGKILL) -> list[int]:
        """Send ``how`` to the process and everything below it; returns their PIDs."""
        below = [pid for pid, _ in descendants(self.process.pid)]
        for pid in [self.process.pid, *below]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, how)
        return [self.process.pid, *below]

    def stop(self) -> None:
        """SIGTERM (the daemon stops its children), then SIGKILL whatever is left."""
        below = [pid for pid, _ in descendants(self.process.pid)]
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in below:  # executors and Python workers the daemon did not take with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._output.close()


def _gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        time.sleep(0.1)
    return alive


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] == "Z"


class Cluster:
    """A standalone master and ``workers`` workers of one core and 1 GiB each."""

    def __init__(self, root: Path, workers: int = 2) -> None:
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = _environment(self.logs)
        self.spark_class = str(spark_home() / "bin" / "spark-class")
        self.master = _Daemon(
            [
                self.spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            self.logs / "master.log",
            self.env,
        )
        self.workers: list[_Daemon] = []
        self.url = ""
        try:
            match = self.master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)")
            self.url = match.group(1)
            for _ in range(workers):
                self.add_worker(wait=False)
            for daemon in self.workers:
                daemon.wait_for(r"Successfully registered with master")
        except BaseException:
            self.stop()
            raise

    def add_worker(self, wait: bool = True) -> _Daemon:
        number = len(self.workers) + 1
        work = self.root / f"work-{number}"
        work.mkdir(exist_ok=True)
        daemon = _Daemon(
            [
                self.spark_class,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(work),
                self.url,
            ],
            self.logs / f"worker-{number}.log",
            self.env,
        )
        self.workers.append(daemon)
        if wait:
            daemon.wait_for(r"Successfully registered with master")
        return daemon

    def alive(self) -> list[_Daemon]:
        return [daemon for daemon in self.workers if daemon.process.poll() is None]

    def stop(self) -> None:
        """Stop every daemon and check that no process of theirs is left."""
        pids = [self.master.process.pid]
        for daemon in [*self.workers, self.master]:
            pids += [pid for pid, _ in descendants(daemon.process.pid)]
            daemon.stop()
        left = _gone(pids)
        assert not left, f"processes of the test cluster still running: {left}"


class ConnectServer:
    """A Spark Connect server on a free loopback port, its driver on ``local[2]``."""

    def __init__(self, root: Path) -> None:
        self.logs = root / "connect-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        env = _environment(self.logs)
        env["SPARK_DAEMON_MEMORY"] = "1g"  # the server is a daemon here: this is its heap
        options = f"{DAEMON_JAVA_OPTIONS} -Dlog4j2.configurationFile=file:{_connect_log4j(root)}"
        self.daemon = _Daemon(
            [
                str(spark_home() / "sbin" / "start-connect-server.sh"),
                "--wait",  # in the foreground: the process started here is the server's
                "--master",
                "local[2]",
                "--driver-memory",
                "1g",
                "--driver-java-options",
                options,
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.connect.grpc.binding.port=0",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.sql.shuffle.partitions=2",
            ],
            self.logs / "connect.log",
            env,
        )
        try:
            match = self.daemon.wait_for(r"Spark Connect server started at: ([\d.]+):(\d+)")
        except BaseException:
            self.stop()
            raise
        self.url = f"sc://{match.group(1)}:{match.group(2)}"

    def stop(self) -> None:
        pids = [self.daemon.process.pid, *(pid for pid, _ in descendants(self.daemon.process.pid))]
        # The server's process group (its own session): the shell scripts and the JVM.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.daemon.process.pid, signal.SIGTERM)
        try:
            self.daemon.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.daemon.process.pid, signal.SIGKILL)
            self.daemon.process.wait()
        self.daemon.stop()
        left = _gone(pids)
        assert not left, f"processes of the test Connect server still running: {left}"


def _connect_log4j(root: Path) -> Path:
    """INFO for the server's own start line (the port), WARN for the rest of Spark."""
    path = root / "connect-log4j2.properties"
    path.write_text(
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.stdout.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
        "logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer\n"
        "logger.connect.level = info\n"
    )
    return path
