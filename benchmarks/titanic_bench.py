"""Durable requests (Titanic, 9/TSP) beside plain requests, through one broker, in one run.

What it measures (issue 26, item 6): requests per second and the median latency of

- *plain*: ``Client.request("echo", body)``: one MDP round trip;
- *durable*: ``submit`` (stored on disk before its id comes back), then ``wait`` (fetch until
  the reply is there), then ``close``: the whole life of a durable request, three MDP round trips
  to Titanic and one dispatch by Titanic to the echo worker.

The broker, the echo workers and Titanic are ``domo`` processes on 127.0.0.1; the clients are
``concurrency`` Trio tasks in this process. The two kinds are interleaved over ``--reps``
repetitions (plain, durable, plain, durable, ...) and their ratio is reported per repetition,
so that a loaded machine shows as spread, not as bias. ``--synchronous`` is Titanic's SQLite
setting (``normal`` by default: the goal is durable >= 0.5 x plain there). Every reply is
checked against its request.

    python benchmarks/titanic_bench.py [--quick] [--reps N] [--requests N] [--concurrency N]
                                       [--synchronous off|normal|full] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

import domo.trio
from domo.titanic.trio import TitanicClient

DOMO = [sys.executable, "-m", "domo"]
BEATS = ["--heartbeat-interval", "0.5", "--liveness", "4"]
LISTENING = re.compile(r"listening on (tcp://127\.0\.0\.1:\d+)")
POLL_MAX = 0.05  # submit now, fetch later: fetch a pending request again after 50 ms


class Processes:
    """The processes of one run, killed by PID at the end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("wb")
        process = subprocess.Popen([*DOMO, *args], stdout=log, stderr=subprocess.STDOUT)
        self.started.append(process)
        self.names.append(name)
        return process

    def wait_for(self, name: str, pattern: str, limit: float = 30.0) -> str:
        path = self.directory / f"{name}.log"
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            text = path.read_text(errors="replace") if path.exists() else ""
            found = re.search(pattern, text)
            if found:
                return found.group(1) if found.groups() else found.group(0)
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not print {pattern!r}:\n{path.read_text()}")

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) each process used so far, by name."""
        ticks = os.sysconf("SC_CLK_TCK")
        seconds: dict[str, float] = {}
        for name, process in zip(self.names, self.started, strict=True):
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds[name] = (int(fields[11]) + int(fields[12])) / ticks
        return seconds

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


async def plain(endpoint: str, requests: int, concurrency: int) -> list[float]:
    """Latencies of ``requests`` echo requests, ``concurrency`` at a time."""
    latencies: list[float] = []

    async def one(client: domo.trio.Client, n: int) -> None:
        body = b"plain %d" % n
        started = time.perf_counter()
        reply = await client.request("echo", body)
        latencies.append(time.perf_counter() - started)
        if reply != [body]:
            raise AssertionError(f"wrong reply {reply!r} to {body!r}")

    async with domo.trio.Client(endpoint, timeout=10.0, concurrency=concurrency) as client:
        await _in_parallel(requests, concurrency, lambda n: one(client, n))
    return latencies


async def durable(endpoint: str, requests: int, concurrency: int) -> list[float]:
    """Latencies (submit to reply fetched) of ``requests`` durable requests; each is closed."""
    latencies: list[float] = []

    async def one(titanic: TitanicClient, n: int) -> None:
        body = b"durable %d" % n
        started = time.perf_counter()
        request_id = await titanic.submit("echo", body)
        fetched = await titanic.wait(request_id)  # from 5 ms, doubling
        if not fetched.done:
            raise AssertionError(f"{request_id}: {fetched}")
        latencies.append(time.perf_counter() - started)
        if fetched.reply() != [body]:
            raise AssertionError(f"wrong reply {fetched.body!r} to {body!r}")
        await titanic.close(request_id)

    async with domo.trio.Client(endpoint, timeout=10.0, concurrency=concurrency) as client:
        titanic = TitanicClient(client)
        await _in_parallel(requests, concurrency, lambda n: one(titanic, n))
    return latencies


async def batch(endpoint: str, requests: int, concurrency: int) -> list[float]:
    """Submit now, fetch later: submit all ``requests``, then fetch each (polling while pending)
    and close it. Latencies are the submits' (stored on disk and acknowledged)."""
    latencies: list[float] = []
    ids: list[tuple[int, str]] = []

    async def submit(titanic: TitanicClient, n: int) -> None:
        started = time.perf_counter()
        ids.append((n, await titanic.submit("echo", b"batch %d" % n)))
        latencies.append(time.perf_counter() - started)

    async def collect(titanic: TitanicClient, index: int) -> None:
        n, request_id = ids[index]
        while not (fetched := await titanic.fetch(request_id)).done:
            if not fetched.pending:
                raise AssertionError(f"{request_id}: {fetched}")
            await trio.sleep(POLL_MAX)
        if fetched.reply() != [b"batch %d" % n]:
            raise AssertionError(f"wrong reply {fetched.body!r} to request {n}")
        await titanic.close(request_id)

    async with domo.trio.Client(endpoint, timeout=10.0, concurrency=concurrency) as client:
        titanic = TitanicClient(client)
        await _in_parallel(requests, concurrency, lambda n: submit(titanic, n))
        await _in_parallel(requests, concurrency, lambda n: collect(titanic, n))
    return latencies


async def _in_parallel(requests: int, concurrency: int, make: object) -> None:
    counter = iter(range(requests))

    async def lane() -> None:
        for n in counter:
            await make(n)  # type: ignore[operator]

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(lane)


def run(args: argparse.Namespace) -> dict[str, object]:
    directory = Path(tempfile.mkdtemp(prefix="domo-titanic-bench-"))
    processes = Processes(directory)
    rows: list[dict[str, float]] = []
    try:
        processes.start("broker", "broker", "--bind", "tcp://127.0.0.1:0", *BEATS)
        endpoint = processes.wait_for("broker", LISTENING.pattern)
        processes.start(
            "worker",
            "worker",
            "echo",
            "--connect",
            endpoint,
            "--concurrency",
            str(args.concurrency),
            *BEATS,
        )
        processes.wait_for("worker", "serving")
        processes.start(
            "titanic",
            "titanic",
            "--connect",
            endpoint,
            "--db",
            str(directory / "t.db"),
            "--synchronous",
            args.synchronous,
            "--max-in-flight",
            str(args.concurrency),
            "--concurrency",
            str(args.concurrency),
            *BEATS,
        )
        processes.wait_for("titanic", "domo titanic: serving")
        trio.run(durable, endpoint, args.concurrency, args.concurrency)  # warm up both paths
        trio.run(plain, endpoint, args.concurrency, args.concurrency)
        for rep in range(args.reps):
            row: dict[str, float] = {}
            for kind, body in (("plain", plain), ("durable", durable), ("batch", batch)):
                cpu_before, own_before = processes.cpu(), time.process_time()
                started = time.perf_counter()
                latencies = trio.run(body, endpoint, args.requests, args.concurrency)
                elapsed = time.perf_counter() - started
                cpu_after, own_after = processes.cpu(), time.process_time()
                row[f"{kind}_per_s"] = args.requests / elapsed
                row[f"{kind}_p50_ms"] = statistics.median(latencies) * 1e3
                for name in cpu_after:  # CPU microseconds per request, by role
                    used = cpu_after[name] - cpu_before[name]
                    row[f"{kind}_cpu_us_{name}"] = used / args.requests * 1e6
                row[f"{kind}_cpu_us_clients"] = (own_after - own_before) / args.requests * 1e6
            row["ratio"] = row["durable_per_s"] / row["plain_per_s"]
            row["batch_ratio"] = row["batch_per_s"] / row["plain_per_s"]
            rows.append(row)
            print(
                f"rep {rep + 1}: plain {row['plain_per_s']:7.0f}/s p50 {row['plain_p50_ms']:.2f} "
                f"ms | durable {row['durable_per_s']:7.0f}/s p50 {row['durable_p50_ms']:.2f} ms "
                f"| durable/plain {row['ratio']:.2f}",
                flush=True,
            )
            print(
                f"  submit now, fetch later: {row['batch_per_s']:7.0f}/s, submit p50 "
                f"{row['batch_p50_ms']:.2f} ms | batch/plain {row['batch_ratio']:.2f}",
                flush=True,
            )
            for kind in ("plain", "durable", "batch"):
                roles = ", ".join(
                    f"{key.rsplit('_', 1)[1]} {value:.0f}"
                    for key, value in row.items()
                    if key.startswith(f"{kind}_cpu_us_")
                )
                print(f"  {kind} CPU us per request: {roles}", flush=True)
    finally:
        processes.stop()
    ratios = [row["ratio"] for row in rows]
    batch_ratios = [row["batch_ratio"] for row in rows]
    result = {
        "batch_ratio_median": statistics.median(batch_ratios),
        "synchronous": args.synchronous,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "reps": rows,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "machine": "shared and loaded (other work ran at the same time)",
    }
    print(
        f"durable/plain requests per second at synchronous={args.synchronous}: median "
        f"{result['ratio_median']:.2f} (min {result['ratio_min']:.2f}, max "
        f"{result['ratio_max']:.2f}) over {len(rows)} repetitions (goal: >= 0.5 at normal); "
        f"submit now, fetch later: median {result['batch_ratio_median']:.2f}"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds: the smoke mode")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--synchronous", choices=("off", "normal", "full"), default="normal")
    parser.add_argument("--json", metavar="FILE", help="also write the results there")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.requests, args.concurrency = 1, 100, 4
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
