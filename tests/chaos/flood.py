"""Fairness under a garbage flood: an honest client's throughput and p99 while junk pours in.

One ``domo broker`` and one ``domo worker echo`` run as processes on 127.0.0.1. An honest,
hand-framed MDP/0.2 client makes sequential requests for ``--seconds``, first alone, then while
``--flooders`` processes send malformed messages at the broker as fast as they can (each a mix
of the near misses a broken peer sends: unknown headers, unknown commands, truncated frames,
an empty message, a REQUEST with no service). The figures (issue 14, items 3 and 7):

- the honest client's requests per second under the flood against alone (goal: at least 0.5);
- its p99 latency under the flood against alone (goal: at most 10);
- the broker's RSS at the start, at the flood's peak and after (goal: back within 10 %);
- how many junk messages the broker took, and that it is still alive.

``python tests/chaos/flood.py --help``; ``nox -s chaos`` runs it after the kill harness;
``tests/chaos/test_chaos.py`` runs a short form. Every process it starts is killed by PID.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import zmq

DOMO = [sys.executable, "-m", "domo"]
LISTENING = re.compile(r"listening on (tcp://127\.0\.0\.1:\d+)")
JUNK: list[list[bytes]] = [
    [b"", b"MDPC02"],  # no command
    [b"", b"MDPC02", b"\x09", b"echo"],  # unknown command
    [b"", b"MDPX99", b"\x01", b"echo", b"x"],  # unknown protocol header
    [b"", b"MDPW02", b"\x03", b"not-a-client"],  # a FINAL from a peer that never sent READY
    [b"garbage"],  # no empty delimiter
    [b"", b"MDPC02", b"\x01"],  # REQUEST with no service
    [b""],
]


@dataclass
class FloodResult:
    """What one flood run measured."""

    alone_rps: float = 0.0
    flooded_rps: float = 0.0
    alone_p99_ms: float = 0.0
    flooded_p99_ms: float = 0.0
    junk_sent: int = 0
    rss_start_kib: int = 0
    rss_peak_kib: int = 0
    rss_after_kib: int = 0
    broker_alive: bool = False

    @property
    def throughput_ratio(self) -> float:
        return self.flooded_rps / self.alone_rps if self.alone_rps else 0.0

    @property
    def p99_ratio(self) -> float:
        return self.flooded_p99_ms / self.alone_p99_ms if self.alone_p99_ms else float("inf")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _honest(endpoint: str, seconds: float, context: zmq.Context[zmq.Socket[bytes]]) -> list[float]:
    """Sequential requests for ``seconds``; the latency of each, in seconds."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    latencies: list[float] = []
    try:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            body = b"%d" % n
            n += 1
            sent = time.monotonic()
            socket.send_multipart([b"", b"MDPC02", b"\x01", b"echo", body])
            if not socket.poll(10_000):
                raise RuntimeError("the honest client got no reply within 10 s")
            reply = socket.recv_multipart()
            if reply != [b"", b"MDPC02", b"\x03", b"echo", body]:
                raise RuntimeError(f"wrong reply {reply!r}")
            latencies.append(time.monotonic() - sent)
    finally:
        socket.close(linger=0)
    return latencies


def _flooder(endpoint: str, seconds: float) -> int:
    """Send junk as fast as the socket takes it for ``seconds``; the number sent."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 1000)
    socket.connect(endpoint)
    sent = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for junk in JUNK:
                try:
                    socket.send_multipart(junk, flags=zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    socket.poll(10, zmq.POLLOUT)
            while socket.poll(0):  # drain whatever the broker answers (DISCONNECTs)
                socket.recv_multipart()
    finally:
        socket.close(linger=0)
        context.term()
    return sent


def _p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] * 1000 if len(latencies) > 1 else 0.0


def run_flood(seconds: float = 3.0, flooders: int = 1, heartbeat: float = 1.0) -> FloodResult:
    """Measure the honest client alone, then under the flood (see the module docstring)."""
    result = FloodResult()
    beats = ["--heartbeat-interval", str(heartbeat)]
    started: list[subprocess.Popen[bytes]] = []
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="domo-flood-") as scratch:
        log = Path(scratch) / "broker.log"
        try:
            with log.open("wb") as out:
                broker = subprocess.Popen(
                    [*DOMO, "broker", "--bind", "tcp://127.0.0.1:0", *beats],
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
            started.append(
                subprocess.Popen(
                    [*DOMO, "worker", "echo", "--connect", endpoint, *beats],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            _honest(endpoint, 0.5, context)  # warm up: the worker is registered
            result.rss_start_kib = _rss_kib(broker.pid)
            alone = _honest(endpoint, seconds, context)
            floods = [
                subprocess.Popen(
                    [sys.executable, __file__, "--flood-only", endpoint, str(seconds + 1)],
                    stdout=subprocess.PIPE,
                )
                for _ in range(flooders)
            ]
            started.extend(floods)
            time.sleep(0.5)  # the flood is at full rate before the honest client measures
            flooded = _honest(endpoint, seconds, context)
            result.rss_peak_kib = _rss_kib(broker.pid)
            for flood in floods:
                out_text, _ = flood.communicate(timeout=seconds + 30)
                result.junk_sent += int(out_text or b"0")
            time.sleep(1.0)
            result.rss_after_kib = _rss_kib(broker.pid)
            result.broker_alive = broker.poll() is None
            result.alone_rps = len(alone) / seconds
            result.flooded_rps = len(flooded) / seconds
            result.alone_p99_ms = _p99(alone)
            result.flooded_p99_ms = _p99(flooded)
        finally:
            for process in started:
                if process.poll() is None:
                    process.kill()
                process.wait(timeout=10)
            context.destroy(linger=0)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run one flood measurement and print it as JSON (or, internally, be one flooder)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each phase's length")
    parser.add_argument("--flooders", type=int, default=1, help="junk-sending processes")
    parser.add_argument("--flood-only", nargs=2, metavar=("ENDPOINT", "SECONDS"), help="internal")
    options = parser.parse_args(argv)
    if options.flood_only:
        print(_flooder(options.flood_only[0], float(options.flood_only[1])))
        return 0
    result = run_flood(options.seconds, options.flooders)
    report = asdict(result) | {
        "throughput_ratio": round(result.throughput_ratio, 3),
        "p99_ratio": round(result.p99_ratio, 2),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
