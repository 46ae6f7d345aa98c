"""What the durable chaos scripts (``titanic_chaos.py``, ``binary_star.py``) share: ``domo``
processes started, SIGKILLed and restarted by PID, their logs, free loopback ports, and the
recording worker whose log counts how often each request ran."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

DOMO = [sys.executable, "-m", "domo"]
RECORDING_WORKER = [sys.executable, str(Path(__file__).with_name("recording_worker.py"))]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick), for an endpoint reused on restart."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Processes:
    """Every process a run starts, by name; each is killed by PID at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.args: dict[str, list[str]] = {}
        self.all: list[subprocess.Popen[bytes]] = []
        self.kills: dict[str, int] = {}
        self._count = 0

    def start(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        self._count += 1
        log = (self.log_dir / f"{self._count:04d}-{name}.log").open("wb")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.running[name] = process
        self.args[name] = command
        self.all.append(process)
        return process

    def log(self, name: str) -> str:
        """Every log of ``name`` so far, oldest first."""
        return "".join(
            path.read_text(errors="replace") for path in sorted(self.log_dir.glob(f"*-{name}.log"))
        )

    def wait_for(self, name: str, pattern: str, time_limit: float = 30.0) -> str:
        """The first match of ``pattern`` in the current log of ``name``."""
        process = self.running[name]
        path = sorted(self.log_dir.glob(f"*-{name}.log"))[-1]
        deadline = time.monotonic() + time_limit
        while time.monotonic() < deadline:
            found = re.search(pattern, path.read_text(errors="replace"))
            if found:
                return found.group(0)
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}):\n{path.read_text()}")
            time.sleep(0.02)
        raise RuntimeError(f"{name} printed no {pattern!r} within {time_limit} s")

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        process = self.running[name]
        os.kill(process.pid, signum)  # a process this run started
        if signum == signal.SIGKILL:
            process.wait(10)
            self.kills[name] = self.kills.get(name, 0) + 1

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(name, self.args[name])

    def stop_all(self) -> None:
        for process in self.all:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)  # a stopped one cannot die otherwise
                process.kill()
        for process in self.all:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


def executions(log: Path) -> dict[bytes, int]:
    """How many times the recording workers ran each request body (their shared log)."""
    counts: dict[bytes, int] = {}
    if not log.exists():
        return counts
    for line in log.read_bytes().splitlines():
        counts[line] = counts.get(line, 0) + 1
    return counts


def script_main(
    description: str, config_type: type[Any], run: Callable[[Any], Any], argv: list[str] | None
) -> int:
    """A chaos script's command line: one option per field of ``config_type`` (a dataclass),
    ``--json FILE``; prints the result (with its verdict ``ok``) and exits 0 only if ok."""
    parser = argparse.ArgumentParser(description=description)
    for name, value in asdict(config_type()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--json", metavar="FILE", help="also write the result there")
    args = vars(parser.parse_args(argv))
    json_path = args.pop("json")
    result = run(config_type(**args))
    summary = {**asdict(result), "ok": result.ok}
    summary["problems"] = result.problems[:20]
    print(json.dumps(summary, indent=2))
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if result.ok else 1
