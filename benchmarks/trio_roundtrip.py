"""Round-trip latency and throughput of domo.trio through a broker on tcp loopback.

Three processes: a broker, an echo worker (``--workers`` of them, each ``concurrency`` 1) and
this one, the client side. Measures:

- ``domo.call`` p50/p90 (``domo.sync``: one context, one socket per call),
- ``await client.request`` p50/p90 on one long-lived ``Client``,
- throughput with N concurrent ``Client`` instances, each sending requests back to back.

Usage: ``python benchmarks/trio_roundtrip.py [--requests 2000] [--clients 1 4 16]
[--workers 2] [--quick]`` (``--reps`` and ``--json`` are accepted for ``nox -s bench`` and
ignored). ``brokers.py`` compares systems; this script is the quick look at domo alone.
Numbers on a shared, noisy 2-core machine vary by 2x between runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import trio

import domo
from domo.trio import Client, run_worker, serve_broker


async def _broker(endpoint: str) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_broker, endpoint)
        print("ready", flush=True)


async def _worker(endpoint: str) -> None:
    async def echo(body: list[bytes]) -> list[bytes]:
        return body

    await run_worker(endpoint, "echo", echo)


def _percentiles(samples: list[float]) -> str:
    cuts = statistics.quantiles(samples, n=10)
    return f"p50 {statistics.median(samples) * 1e6:.0f} us, p90 {cuts[8] * 1e6:.0f} us"


async def _measure(endpoint: str, requests: int, clients: list[int]) -> None:
    async with Client(endpoint) as client:
        for _ in range(200):  # warm up
            await client.request("echo", b"x" * 32)
        samples = []
        for _ in range(requests):
            start = time.perf_counter()
            await client.request("echo", b"x" * 32)
            samples.append(time.perf_counter() - start)
        print(f"await client.request, 32-byte body: {_percentiles(samples)}")

    for count in clients:
        done = [0]
        stop = trio.current_time() + 5.0
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(_client_loop, endpoint, stop, done)
        print(f"{count:3d} concurrent clients: {done[0] / 5.0:.0f} requests/s")


async def _client_loop(endpoint: str, stop: float, done: list[int]) -> None:
    async with Client(endpoint) as client:
        while trio.current_time() < stop:
            await client.request("echo", b"x" * 32)
            done[0] += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", nargs="?", default="bench")
    parser.add_argument("endpoint", nargs="?", default="tcp://127.0.0.1:5599")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, nargs="*", default=[1, 4, 16])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="200 requests, 1 and 4 clients")
    # Accepted so that ``nox -s bench -- --reps N`` reaches every script; one run here.
    parser.add_argument("--reps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.clients = 200, [1, 4]
    if args.role == "broker":
        trio.run(_broker, args.endpoint)
        return
    if args.role == "worker":
        trio.run(_worker, args.endpoint)
        return
    me = [sys.executable, __file__]
    broker = subprocess.Popen([*me, "broker", args.endpoint], stdout=subprocess.PIPE)
    peers = [broker]
    try:
        assert broker.stdout is not None
        assert broker.stdout.readline().strip() == b"ready"
        peers += [subprocess.Popen([*me, "worker", args.endpoint]) for _ in range(args.workers)]
        domo.call(args.endpoint, "echo", b"warm-up", timeout=10.0)
        samples = []
        for _ in range(200):
            start = time.perf_counter()
            domo.call(args.endpoint, "echo", b"x" * 32)
            samples.append(time.perf_counter() - start)
        print(
            f"domo.call (domo.sync: a context and a socket each), 32-byte body: "
            f"{_percentiles(samples)}"
        )
        trio.run(_measure, args.endpoint, args.requests, args.clients)
    finally:
        for peer in peers:
            peer.kill()  # by PID: the processes this script started
            peer.wait()


if __name__ == "__main__":
    main()
