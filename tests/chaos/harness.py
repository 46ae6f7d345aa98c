"""The chaos harness: requests through a real ``domo broker`` while workers and the broker die.

What it proves (issue 14, item 7; ``docs/reliability.md`` holds a full run's figures): while
``domo worker`` processes are SIGKILLed one after another and the broker itself is SIGKILLed
and restarted on the same endpoint, every request a client makes is answered exactly once with
its own body: 0 lost, 0 duplicate FINALs, 0 wrong bodies.

The clients are hand-framed MDP/0.2 DEALERs, one thread each, so that nothing between the
broker and the count can hide a duplicate: every FINAL that reaches a client socket is counted.
A client sends one request at a time; when no FINAL comes within ``--reply-timeout`` it closes
its socket and sends the same request from a fresh one (what domo's own clients do), so a FINAL
for the abandoned attempt can never reach it. A FINAL that arrives while no request is
outstanding, twice for one request, or with another request's body, is a failure.

Run it as ``python tests/chaos/harness.py`` (``--help``), through ``nox -s chaos`` (the long
form: 10,000 requests), or through ``tests/chaos/test_chaos.py`` (the short form CI runs).
Everything listens on 127.0.0.1, every process it starts is killed by PID at the end, every
wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq

DOMO = [sys.executable, "-m", "domo"]
CLIENT_HEADER = b"MDPC02"
FINAL = b"\x03"
PARTIAL = b"\x02"
LISTENING = re.compile(r"listening on (tcp://127\.0\.0\.1:\d+)")


@dataclass
class ChaosConfig:
    """What one run does."""

    requests: int = 1_000
    clients: int = 4
    workers: int = 4
    kill_every: float = 0.5  # seconds between worker SIGKILLs
    broker_restarts: int = 1  # SIGKILL and restart the broker this many times, spread over the run
    heartbeat: float = 0.2  # broker and workers agree on it; a dead worker shows in 3 beats
    reply_timeout: float = 2.0  # a client's wait for a FINAL before it retries on a new socket
    attempts: int = 20  # tries per request before it counts as lost
    time_limit: float = 300.0  # the whole run is stopped (and fails) past this
    seed: int = 0


@dataclass
class ChaosResult:
    """What one run observed. ``ok`` is the verdict."""

    requests: int = 0
    answered: int = 0
    lost: int = 0
    duplicates: int = 0
    wrong: int = 0
    stray: int = 0  # FINALs or PARTIALs with no request outstanding on that socket
    retries: int = 0
    worker_kills: int = 0
    broker_restarts: int = 0
    seconds: float = 0.0
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out
            and self.answered == self.requests
            and self.lost == self.duplicates == self.wrong == self.stray == 0
        )


class _Processes:
    """Every process the harness starts, so each is killed by PID at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._started: list[subprocess.Popen[bytes]] = []
        self._count = 0

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        self._count += 1
        log = (self.log_dir / f"{self._count:04d}-{name}.log").open("wb")
        process = subprocess.Popen([*DOMO, *args], stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own descriptor
        self._started.append(process)
        return process

    def kill_all(self) -> None:
        for process in self._started:
            if process.poll() is None:
                process.kill()
        for process in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):  # a stuck kernel, not domo
                process.wait(timeout=10)


def _wait_for_endpoint(log: Path, process: subprocess.Popen[bytes], time_limit: float) -> str:
    deadline = time.monotonic() + time_limit
    while time.monotonic() < deadline:
        found = LISTENING.search(log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise RuntimeError(f"domo broker exited ({process.returncode}):\n{log.read_text()}")
        time.sleep(0.02)
    raise RuntimeError(f"domo broker printed no endpoint within {time_limit} s")


class _Client(threading.Thread):
    """One hand-framed MDP/0.2 client: its requests in order, each answered exactly once."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        bodies: list[bytes],
        config: ChaosConfig,
        stop: threading.Event,
    ) -> None:
        super().__init__(daemon=True)
        self.context, self.endpoint, self.bodies, self.config = context, endpoint, bodies, config
        self.stop = stop
        self.answered = self.lost = self.duplicates = self.wrong = self.stray = self.retries = 0
        self.problems: list[str] = []
        self.previous: bytes | None = None  # the body last answered on the current socket

    def _socket(self) -> zmq.Socket[bytes]:
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.endpoint)
        return socket

    def run(self) -> None:
        socket = self._socket()
        try:
            for body in self.bodies:
                if self.stop.is_set():
                    return
                socket = self._one(socket, body)
            # Anything still arriving on the last socket after its last FINAL is a duplicate.
            self._drain(socket, until=time.monotonic() + self.config.heartbeat * 5, body=None)
        finally:
            socket.close(linger=0)

    def _one(self, socket: zmq.Socket[bytes], body: bytes) -> zmq.Socket[bytes]:
        for attempt in range(self.config.attempts):
            if self.stop.is_set():
                return socket
            if attempt:
                self.retries += 1
                socket.close(linger=0)
                socket = self._socket()
                self.previous = None
            socket.send_multipart([b"", CLIENT_HEADER, b"\x01", b"echo", body])
            if self._drain(socket, until=time.monotonic() + self.config.reply_timeout, body=body):
                self.answered += 1
                self.previous = body
                return socket
        self.lost += 1
        self.problems.append(f"lost after {self.config.attempts} attempts: {body!r}")
        return socket

    def _drain(self, socket: zmq.Socket[bytes], until: float, body: bytes | None) -> bool:
        """Read until ``body``'s FINAL (True) or ``until`` (False); judge every message read."""
        while (left := until - time.monotonic()) > 0:
            if not socket.poll(int(left * 1000) + 1):
                continue
            frames = socket.recv_multipart()
            if len(frames) < 4 or frames[:2] != [b"", CLIENT_HEADER]:
                self.wrong += 1
                self.problems.append(f"malformed reply {frames!r}")
                continue
            command, payload = frames[2], frames[4:]
            if command == FINAL and self.previous is not None and payload == [self.previous]:
                self.duplicates += 1
                self.problems.append(f"second FINAL for {self.previous!r}")
                continue
            if command not in (FINAL, PARTIAL) or body is None:
                self.stray += 1
                self.problems.append(f"message with no request outstanding: {frames!r}")
                continue
            if command == PARTIAL:
                self.stray += 1  # echo never streams
                self.problems.append(f"unexpected PARTIAL {frames!r}")
                continue
            if payload != [body]:
                self.wrong += 1
                self.problems.append(f"FINAL {payload!r} for request {body!r}")
                continue
            return True
        return False


def run_chaos(config: ChaosConfig, log_dir: Path | None = None) -> ChaosResult:
    """Run one chaos round and return what it observed (see the module's docstring)."""
    result = ChaosResult(requests=config.requests)
    chooser = random.Random(config.seed)
    beats = ["--heartbeat-interval", str(config.heartbeat), "--liveness", "3"]
    with tempfile.TemporaryDirectory(prefix="domo-chaos-") as scratch:
        logs = log_dir or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        processes = _Processes(logs)
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        stop = threading.Event()
        clients: list[_Client] = []
        started = time.monotonic()
        try:
            broker = processes.start(
                "broker", "broker", "--bind", "tcp://127.0.0.1:0", *beats, "--log-level", "warning"
            )
            endpoint = _wait_for_endpoint(processes.log_dir / "0001-broker.log", broker, 20)
            broker_args = ["broker", "--bind", endpoint, *beats, "--log-level", "warning"]
            worker_args = ["worker", "echo", "--connect", endpoint, *beats, "--log-level", "error"]
            workers = [processes.start("worker", *worker_args) for _ in range(config.workers)]

            bodies = [
                f"{n:06d}-{chooser.getrandbits(32):08x}".encode() for n in range(config.requests)
            ]
            clients.extend(
                _Client(context, endpoint, bodies[n :: config.clients], config, stop)
                for n in range(config.clients)
            )
            for client in clients:
                client.start()

            # Broker restarts are spread evenly over the requests, by progress, so each one
            # lands while requests are in flight whatever the machine's speed.
            restart_marks = [
                config.requests * (n + 1) // (config.broker_restarts + 1)
                for n in range(config.broker_restarts)
            ]
            deadline = started + config.time_limit
            next_kill = time.monotonic() + config.kill_every
            while any(client.is_alive() for client in clients):
                now = time.monotonic()
                if now > deadline:
                    result.timed_out = True
                    result.problems.append(f"stopped after {config.time_limit} s")
                    break
                done = sum(client.answered + client.lost for client in clients)
                if restart_marks and done >= restart_marks[0]:
                    restart_marks.pop(0)
                    broker.kill()
                    broker.wait(timeout=10)
                    broker = processes.start("broker", *broker_args)
                    result.broker_restarts += 1
                if now >= next_kill:
                    victim = chooser.randrange(len(workers))
                    workers[victim].kill()
                    workers[victim].wait(timeout=10)
                    workers[victim] = processes.start("worker", *worker_args)
                    result.worker_kills += 1
                    next_kill = now + config.kill_every * chooser.uniform(0.5, 1.5)
                time.sleep(0.02)
        finally:
            stop.set()
            for client in clients:
                client.join(timeout=config.reply_timeout + 5)
            processes.kill_all()
            context.term()
        result.seconds = time.monotonic() - started
        for client in clients:
            result.answered += client.answered
            result.lost += client.lost
            result.duplicates += client.duplicates
            result.wrong += client.wrong
            result.stray += client.stray
            result.retries += client.retries
            result.problems.extend(client.problems)
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: run one round, print the result as JSON, exit 0 when nothing went wrong."""
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--kill-every", type=float, default=defaults.kill_every)
    parser.add_argument("--broker-restarts", type=int, default=defaults.broker_restarts)
    parser.add_argument("--heartbeat", type=float, default=defaults.heartbeat)
    parser.add_argument("--reply-timeout", type=float, default=defaults.reply_timeout)
    parser.add_argument("--time-limit", type=float, default=defaults.time_limit)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--logs", type=Path, help="keep every process's log in this directory")
    options = parser.parse_args(argv)
    config = ChaosConfig(
        requests=options.requests,
        clients=options.clients,
        workers=options.workers,
        kill_every=options.kill_every,
        broker_restarts=options.broker_restarts,
        heartbeat=options.heartbeat,
        reply_timeout=options.reply_timeout,
        time_limit=options.time_limit,
        seed=options.seed,
    )
    result = run_chaos(config, options.logs)
    report = asdict(result) | {"ok": result.ok, "problems": result.problems[:20]}
    print(json.dumps(report, indent=2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
