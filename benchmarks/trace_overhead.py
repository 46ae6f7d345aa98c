"""What tracing (``serve_broker(trace_dir=...)``) costs the broker's throughput, in one run.

A broker subprocess (tracing off or on, to a temp dir), two echo worker subprocesses, and in this
process 8 concurrent ``Client`` loops sending 32-byte requests back to back for a fixed time.
The off/on pair is run twice in the order off, on, on, off so that drift on a shared machine
cancels; the ratio is on/off of the summed rates. Goal (issue 15): tracing costs at most 10 %.

Usage: ``python benchmarks/trace_overhead.py [--seconds 5] [--quick]`` (``--reps``/``--json``
are accepted for ``nox -s bench`` and ignored). Needs pyarrow (``domo[trace]``): without it, it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from functools import partial

import trio

from domo.trio import Client, run_worker, serve_broker


async def _broker(endpoint: str, trace_dir: str) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_broker, trace_dir=trace_dir or None), endpoint)
        print("ready", flush=True)


async def _worker(endpoint: str) -> None:
    async def echo(body: list[bytes]) -> list[bytes]:
        return body

    await run_worker(endpoint, "echo", echo)


async def _load(endpoint: str, seconds: float, clients: int) -> float:
    done = [0]

    async def loop(stop: float) -> None:
        async with Client(endpoint, timeout=10.0) as client:
            while trio.current_time() < stop:
                await client.request("echo", b"x" * 32)
                done[0] += 1

    async with Client(endpoint, timeout=10.0) as client:  # warm up: the workers are there
        for _ in range(100):
            await client.request("echo", b"x" * 32)
    stop = trio.current_time() + seconds
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(loop, stop)
    return done[0] / seconds


def _run(endpoint: str, trace_dir: str, seconds: float) -> float:
    me = [sys.executable, __file__]
    broker = subprocess.Popen([*me, "broker", endpoint, trace_dir], stdout=subprocess.PIPE)
    peers = [broker]
    try:
        assert broker.stdout is not None
        assert broker.stdout.readline().strip() == b"ready"
        peers += [subprocess.Popen([*me, "worker", endpoint]) for _ in range(2)]
        return trio.run(_load, endpoint, seconds, 8)
    finally:
        for peer in peers:
            peer.kill()  # by PID: the processes this script started
            peer.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", nargs="?", default="bench")
    parser.add_argument("endpoint", nargs="?", default="tcp://127.0.0.1:5597")
    parser.add_argument("trace_dir", nargs="?", default="")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="1 s per run")
    parser.add_argument("--reps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "broker":
        trio.run(_broker, args.endpoint, args.trace_dir)
        return
    if args.role == "worker":
        trio.run(_worker, args.endpoint)
        return
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("trace_overhead: skipped, needs pyarrow (pip install 'domo[trace]')")
        return
    seconds = 1.0 if args.quick else args.seconds
    rates: dict[str, float] = {"off": 0.0, "on": 0.0}
    with tempfile.TemporaryDirectory() as traces:
        for mode in ("off", "on", "on", "off"):
            rate = _run(args.endpoint, traces if mode == "on" else "", seconds)
            rates[mode] += rate
            print(f"tracing {mode:3s}: {rate:8.0f} requests/s")
    ratio = rates["on"] / rates["off"]
    verdict = "meets" if ratio >= 0.9 else "misses"
    print(f"tracing on/off throughput: {ratio:.3f} ({verdict} the goal >= 0.90)")


if __name__ == "__main__":
    main()
