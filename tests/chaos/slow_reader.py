"""A client that never reads, sent 1 MiB bodies: the broker's memory stays bounded (issue 14).

One ``domo broker`` and two ``domo worker echo`` run as processes on 127.0.0.1. An honest,
hand-framed MDP/0.2 client makes sequential small requests, first alone, then while *slow
readers* (each its own process, receive high-water mark 10) send 1 MiB requests to the echo
service and never read a reply. Each slow reader sends a request every ``--pace`` seconds
(the broker drops a second REQUEST while one is outstanding, MDP-D-12, so this is as fast as the
broker takes them), so its replies pile up on the broker's side of its connection.

Without byte bounds the broker kept up to 10,000 of those replies per reader (issue 14: 3.0 GB).
With them, a reader's pipe holds at most ``max_peer_bytes`` (MDP-D-27); past that its requests
are dropped (``client-congested``, MDP-D-15), and the broker holds no more. The replies pending
to all readers together are at most ``max_pending_bytes`` (MDP-D-30; ``pending-full`` past it).
Reported:

- the broker's RSS at the start and its peak (sampled every 20 ms) and after the readers left;
- the bound it is checked against: ``base + readers * max_peer_bytes + min(readers *
  max_peer_bytes, max_pending_bytes) + max_held_bytes`` (each reader's pipe in, the replies
  pending to all of them, and the request bodies the broker may hold, MDP-D-26);
- the honest client's requests per second with the readers against alone;
- how many requests the readers sent.

``python tests/chaos/slow_reader.py --help``; ``nox -s chaos`` runs it; ``test_chaos.py`` runs a
short form. Every process it starts is killed by PID.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zmq

if not __package__:  # run as a script: the repository's root on the path, for tests.chaos
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.chaos.flood import DOMO, LISTENING, _honest, _rss_kib

MIB = 1024 * 1024


@dataclass
class SlowReaderConfig:
    """One run's shape; the byte bounds are the broker's options (MDP-D-25 to MDP-D-27,
    MDP-D-30)."""

    seconds: float = 3.0  # each phase: the honest client alone, then beside the readers
    readers: int = 1
    body_bytes: int = MIB
    pace: float = 0.003  # seconds between a reader's requests
    max_message_bytes: int = 2 * MIB
    max_peer_bytes: int = 16 * MIB
    max_held_bytes: int = 32 * MIB
    max_pending_bytes: int = 24 * MIB  # more than one reader's pipe, less than two
    heartbeat: float = 1.0
    # Extra options for the broker, e.g. to run it without bounds for comparison.
    broker_options: list[str] = field(default_factory=list)


@dataclass
class SlowReaderResult:
    """What one run measured."""

    alone_rps: float = 0.0
    loaded_rps: float = 0.0
    reader_requests: int = 0
    rss_start_kib: int = 0
    rss_peak_kib: int = 0
    rss_after_kib: int = 0
    bound_kib: int = 0
    broker_alive: bool = False

    @property
    def throughput_ratio(self) -> float:
        return self.loaded_rps / self.alone_rps if self.alone_rps else 0.0

    @property
    def within_bound(self) -> bool:
        return self.rss_peak_kib <= self.bound_kib


def _reader(endpoint: str, seconds: float, body_bytes: int, pace: float) -> int:
    """Send ``body_bytes`` requests every ``pace`` s for ``seconds``, never reading; how many."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVHWM, 10)
    socket.connect(endpoint)
    body = b"r" * body_bytes
    sent = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            try:
                socket.send_multipart([b"", b"MDPC02", b"\x01", b"echo", body], flags=zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass  # the broker is not reading us: that is its bound at work
            time.sleep(pace)
    finally:
        socket.close(linger=0)
        context.term()
    return sent


def _sample_peak(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], _rss_kib(pid))
        except OSError:
            return
        stop.wait(0.02)


def run_slow_reader(config: SlowReaderConfig | None = None) -> SlowReaderResult:
    """Measure the honest client alone, then beside the slow readers (module docstring)."""
    config = config if config is not None else SlowReaderConfig()
    result = SlowReaderResult()
    beats = ["--heartbeat-interval", str(config.heartbeat)]
    bounds = [
        *("--max-message-bytes", str(config.max_message_bytes)),
        *("--max-peer-bytes", str(config.max_peer_bytes)),
        *("--max-held-bytes", str(config.max_held_bytes)),
        *("--max-pending-bytes", str(config.max_pending_bytes)),
    ]
    started: list[subprocess.Popen[bytes]] = []
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="domo-slow-reader-") as scratch:
        log = Path(scratch) / "broker.log"
        try:
            with log.open("wb") as out:
                broker = subprocess.Popen(
                    [
                        *DOMO,
                        "broker",
                        "--bind",
                        "tcp://127.0.0.1:0",
                        *beats,
                        *bounds,
                        *config.broker_options,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            started.append(broker)
            deadline = time.monotonic() + 20
            while not (found := LISTENING.search(log.read_text(errors="replace"))):
                if time.monotonic() > deadline or broker.poll() is not None:
                    raise RuntimeError(f"the broker did not start:\n{log.read_text()}")
                time.sleep(0.02)
            endpoint = found.group(1)
            for _ in range(2):
                started.append(
                    subprocess.Popen(
                        [*DOMO, "worker", "echo", "--connect", endpoint, *beats],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            _honest(endpoint, 0.5, context)  # warm up: a worker is registered
            result.rss_start_kib = _rss_kib(broker.pid)
            pipes = config.readers * config.max_peer_bytes
            outbound = min(pipes, config.max_pending_bytes)
            result.bound_kib = (
                result.rss_start_kib + (pipes + outbound + config.max_held_bytes) // 1024
            )
            alone = _honest(endpoint, config.seconds, context)
            peak = [result.rss_start_kib]
            stop = threading.Event()
            sampler = threading.Thread(target=_sample_peak, args=(broker.pid, stop, peak))
            sampler.start()
            reader_args = [str(config.seconds + 1), str(config.body_bytes), str(config.pace)]
            try:
                readers = [
                    subprocess.Popen(
                        [sys.executable, __file__, "--reader-only", endpoint, *reader_args],
                        stdout=subprocess.PIPE,
                    )
                    for _ in range(config.readers)
                ]
                started.extend(readers)
                time.sleep(0.5)  # the readers' pipes are filling before the client measures
                loaded = _honest(endpoint, config.seconds, context)
                for reader in readers:
                    out_text, _ = reader.communicate(timeout=config.seconds + 30)
                    result.reader_requests += int(out_text or b"0")
            finally:
                stop.set()
                sampler.join()
            result.rss_peak_kib = peak[0]
            time.sleep(1.0)
            result.rss_after_kib = _rss_kib(broker.pid)
            result.broker_alive = broker.poll() is None
            result.alone_rps = len(alone) / config.seconds
            result.loaded_rps = len(loaded) / config.seconds
        finally:
            for process in started:
                if process.poll() is None:
                    process.kill()
                process.wait(timeout=10)
            context.destroy(linger=0)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run one measurement and print it as JSON (or, internally, be one slow reader)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    defaults = SlowReaderConfig()
    parser.add_argument("--seconds", type=float, default=defaults.seconds)
    parser.add_argument("--readers", type=int, default=defaults.readers)
    parser.add_argument("--body-bytes", type=int, default=defaults.body_bytes)
    parser.add_argument("--pace", type=float, default=defaults.pace)
    parser.add_argument("--max-peer-bytes", type=int, default=defaults.max_peer_bytes)
    parser.add_argument("--max-held-bytes", type=int, default=defaults.max_held_bytes)
    parser.add_argument("--max-message-bytes", type=int, default=defaults.max_message_bytes)
    parser.add_argument("--max-pending-bytes", type=int, default=defaults.max_pending_bytes)
    parser.add_argument("--reader-only", nargs=4, help="internal")
    options = parser.parse_args(argv)
    if options.reader_only:
        endpoint, seconds, body, pace = options.reader_only
        print(_reader(endpoint, float(seconds), int(body), float(pace)))
        return 0
    config = SlowReaderConfig(
        seconds=options.seconds,
        readers=options.readers,
        body_bytes=options.body_bytes,
        pace=options.pace,
        max_message_bytes=options.max_message_bytes,
        max_peer_bytes=options.max_peer_bytes,
        max_held_bytes=options.max_held_bytes,
        max_pending_bytes=options.max_pending_bytes,
    )
    result = run_slow_reader(config)
    report = asdict(result) | {
        "throughput_ratio": round(result.throughput_ratio, 3),
        "within_bound": result.within_bound,
    }
    print(json.dumps(report, indent=2))
    return 0 if result.within_bound and result.broker_alive else 1


if __name__ == "__main__":
    sys.exit(main())
