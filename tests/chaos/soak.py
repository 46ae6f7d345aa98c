"""The soak: many clients and workers through one ``domo broker`` for a long time (issue 14).

One ``domo broker`` process; ``--workers`` echo workers as ``domo worker echo --concurrency N``
processes (each session is a worker of its own to the broker); ``--clients`` hand-framed MDP/0.2
clients, many per process, each a DEALER that sends one request, waits for its FINAL, thinks for
up to ``--think`` seconds and sends the next. A client with no FINAL within ``--reply-timeout``
resends the same request from a new socket (what domo's clients do), up to 10 times.

What it proves, for ``--minutes``: nothing lost (every request answered), nothing duplicated or
mixed up (every FINAL is the outstanding request's own body, once), and flat memory: the
broker's RSS, sampled every 5 s, is no higher in the last half of the run than at the end of
the first half plus 10 %. ``nox -s soak`` runs 30 minutes with 2,000 clients and 500 workers;
``python tests/chaos/soak.py --minutes 2`` a short form. Every process it starts is killed by PID.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq

if not __package__:  # run as a script: the repository's root on the path, for tests.chaos
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.chaos.flood import DOMO, LISTENING, _rss_kib

CLIENTS_PER_PROCESS = 500
WORKERS_PER_PROCESS = 100
ATTEMPTS = 10


@dataclass
class ClientCounts:
    """What one client process saw."""

    answered: int = 0
    lost: int = 0
    duplicates: int = 0
    wrong: int = 0
    retries: int = 0


@dataclass
class SoakResult:
    """What one soak saw; ``ok`` is the verdict."""

    minutes: float = 0.0
    clients: int = 0
    workers: int = 0
    counts: ClientCounts = field(default_factory=ClientCounts)
    rss_kib: list[int] = field(default_factory=list)  # every 5 s
    broker_alive: bool = False

    @property
    def rss_flat(self) -> bool:
        half = len(self.rss_kib) // 2
        if half < 2:
            return True
        return max(self.rss_kib[half:]) <= self.rss_kib[half - 1] * 1.10

    @property
    def ok(self) -> bool:
        counts = self.counts
        return (
            self.broker_alive
            and counts.answered > 0
            and counts.lost == counts.duplicates == counts.wrong == 0
            and self.rss_flat
        )


class _Client:
    __slots__ = ("attempts", "body", "due", "number", "sent_at", "socket")

    def __init__(self, number: int) -> None:
        self.number = number
        self.socket: zmq.Socket[bytes] | None = None
        self.body: bytes | None = None  # the outstanding request's body
        self.sent_at = 0.0
        self.attempts = 0
        self.due = 0.0  # when the next request goes


def _clients(endpoint: str, count: int, seconds: float, think: float, timeout: float) -> str:
    """Run ``count`` clients in this process for ``seconds``; their counts as JSON."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, count + 16)
    chooser = random.Random(count)
    counts = ClientCounts()
    poller = zmq.Poller()
    by_socket: dict[zmq.Socket[bytes], _Client] = {}
    clients = [_Client(n) for n in range(count)]
    serial = 0

    def open_socket(client: _Client) -> None:
        if client.socket is not None:
            poller.unregister(client.socket)
            del by_socket[client.socket]
            client.socket.close(linger=0)
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(endpoint)
        poller.register(socket, zmq.POLLIN)
        by_socket[socket] = client
        client.socket = socket

    def send(client: _Client, now: float) -> None:
        assert client.socket is not None
        assert client.body is not None
        client.socket.send_multipart([b"", b"MDPC02", b"\x01", b"echo", client.body])
        client.sent_at = now

    start = time.monotonic()
    for client in clients:
        open_socket(client)
        client.due = start + chooser.uniform(0, think)
    end = start + seconds
    try:
        while (now := time.monotonic()) < end:
            for socket, _ in poller.poll(50):
                client = by_socket[socket]
                frames = client.socket.recv_multipart() if client.socket is not None else []
                if frames[:3] != [b"", b"MDPC02", b"\x03"] or client.body is None:
                    counts.duplicates += client.body is None  # a FINAL with none outstanding
                    counts.wrong += client.body is not None
                    continue
                if frames[4:] != [client.body]:
                    counts.wrong += 1
                    continue
                counts.answered += 1
                client.body = None
                client.due = time.monotonic() + chooser.uniform(0, think)
            now = time.monotonic()
            for client in clients:
                if client.body is None and now >= client.due:
                    serial += 1
                    client.body = b"%d-%d" % (client.number, serial)
                    client.attempts = 1
                    send(client, now)
                elif client.body is not None and now - client.sent_at > timeout:
                    if client.attempts >= ATTEMPTS:
                        counts.lost += 1
                        client.body = None
                        continue
                    counts.retries += 1
                    client.attempts += 1
                    open_socket(client)  # a reply to the abandoned attempt cannot reach it
                    send(client, now)
        # The requests still outstanding get one more timeout to finish, not counted as lost.
        deadline = time.monotonic() + timeout
        while any(c.body is not None for c in clients) and time.monotonic() < deadline:
            for socket, _ in poller.poll(50):
                client = by_socket[socket]
                frames = socket.recv_multipart()
                if client.body is not None and frames[4:] == [client.body]:
                    counts.answered += 1
                    client.body = None
    finally:
        for client in clients:
            if client.socket is not None:
                client.socket.close(linger=0)
        context.term()
    return json.dumps(asdict(counts))


def _raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


def run_soak(
    minutes: float, clients: int, workers: int, think: float = 2.0, timeout: float = 5.0
) -> SoakResult:
    """One soak (the module docstring); returns what it saw."""
    result = SoakResult(minutes=minutes, clients=clients, workers=workers)
    seconds = minutes * 60
    beats = ["--heartbeat-interval", "1.0", "--liveness", "5"]
    quiet = ["--log-level", "error"]
    started: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="domo-soak-") as scratch:
        log = Path(scratch) / "broker.log"
        try:
            with log.open("wb") as out:
                broker = subprocess.Popen(
                    [*DOMO, "broker", "--bind", "tcp://127.0.0.1:0", *beats, *quiet],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_raise_file_limit,
                )
            started.append(broker)
            deadline = time.monotonic() + 20
            while not (found := LISTENING.search(log.read_text(errors="replace"))):
                if time.monotonic() > deadline or broker.poll() is not None:
                    raise RuntimeError(f"the broker did not start:\n{log.read_text()}")
                time.sleep(0.05)
            endpoint = found.group(1)
            for first in range(0, workers, WORKERS_PER_PROCESS):
                sessions = ["--concurrency", str(min(WORKERS_PER_PROCESS, workers - first))]
                started.append(
                    subprocess.Popen(
                        [*DOMO, "worker", "echo", "--connect", endpoint, *beats, *quiet, *sessions],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        preexec_fn=_raise_file_limit,
                    )
                )
            time.sleep(3.0)  # the workers register
            groups = []
            for first in range(0, clients, CLIENTS_PER_PROCESS):
                count = min(CLIENTS_PER_PROCESS, clients - first)
                arguments = [endpoint, str(count), str(seconds), str(think), str(timeout)]
                groups.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--clients-only", *arguments],
                        stdout=subprocess.PIPE,
                        preexec_fn=_raise_file_limit,
                    )
                )
            started.extend(groups)
            end = time.monotonic() + seconds
            while time.monotonic() < end and broker.poll() is None:
                result.rss_kib.append(_rss_kib(broker.pid))
                time.sleep(min(5.0, max(0.0, end - time.monotonic())))
            for group in groups:
                out_text, _ = group.communicate(timeout=timeout * 3 + 30)
                counts = ClientCounts(**json.loads(out_text))
                for name in asdict(counts):
                    setattr(
                        result.counts, name, getattr(result.counts, name) + getattr(counts, name)
                    )
            result.broker_alive = broker.poll() is None
        finally:
            for process in started:
                if process.poll() is None:
                    process.kill()
                process.wait(timeout=10)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run one soak and print it as JSON; exit 0 if nothing was lost and RSS stayed flat."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--think", type=float, default=2.0, help="a client's pause, at most")
    parser.add_argument("--reply-timeout", type=float, default=5.0)
    parser.add_argument("--clients-only", nargs=5, help="internal")
    options = parser.parse_args(argv)
    if options.clients_only:
        endpoint, count, seconds, think, timeout = options.clients_only
        print(_clients(endpoint, int(count), float(seconds), float(think), float(timeout)))
        return 0
    result = run_soak(
        options.minutes, options.clients, options.workers, options.think, options.reply_timeout
    )
    rss = result.rss_kib
    report = asdict(result) | {
        "rss_kib": " ".join(f"{kib // 1024}" for kib in rss) + " MiB, every 5 s",
        "rss_flat": result.rss_flat,
        "ok": result.ok,
    }
    print(json.dumps(report, indent=2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
