"""What tracing (``serve_broker(trace_dir=...)``) costs the broker's throughput, in one run.

A broker subprocess (tracing off or on, to a temp dir), two echo worker subprocesses, and in this
process 8 concurrent ``Client`` loops sending 32-byte requests back to back for a fixed time.
The off/on pair is run twice in the order off, on, on, off (``--rounds N``: N times over) so
that drift on a shared machine cancels; the ratio is on/off of the summed rates. Goal: tracing
costs at most 5 % (issue 29; 10 % in issue 15).

Beside the rates it prints the broker process's CPU time per request (user + system, all its
threads, the writer's included; from ``/proc``, so on Linux only) over the same windows: what
tracing costs the broker itself, which the other processes' share of two busy cores does not blur
as much as it blurs the rates.

Usage: ``python benchmarks/trace_overhead.py [--seconds 5] [--rounds 1] [--quick]``
(``--reps``/``--json`` are accepted for ``nox -s bench`` and ignored). Needs pyarrow
(``domo[trace]``): without it, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial

import trio

from domo.trio import Client, run_worker, serve_broker

GOAL = 0.95  # on/off throughput: tracing costs at most 5 %


async def _broker(endpoint: str, trace_dir: str) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_broker, trace_dir=trace_dir or None), endpoint)
        print("ready", flush=True)


async def _worker(endpoint: str) -> None:
    async def echo(body: list[bytes]) -> list[bytes]:
        return body

    await run_worker(endpoint, "echo", echo)


async def _timed_load(
    endpoint: str, seconds: float, broker: int
) -> tuple[float, float | None, float | None]:
    """``_load``'s rate, with the broker's CPU time read at the start and end of the window."""
    marks: list[float | None] = []
    rate = await _load(endpoint, seconds, 8, lambda: marks.append(_cpu_seconds(broker)))
    marks.append(_cpu_seconds(broker))
    return rate, marks[0], marks[1]


async def _load(
    endpoint: str, seconds: float, clients: int, on_start: Callable[[], None] = lambda: None
) -> float:
    done = [0]

    async def loop(stop: float) -> None:
        async with Client(endpoint, timeout=10.0) as client:
            while trio.current_time() < stop:
                await client.request("echo", b"x" * 32)
                done[0] += 1

    async with Client(endpoint, timeout=10.0) as client:  # warm up: the workers are there
        for _ in range(100):
            await client.request("echo", b"x" * 32)
    on_start()
    stop = trio.current_time() + seconds
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(loop, stop)
    return done[0] / seconds


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far (all threads), or None without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(endpoint: str, trace_dir: str, seconds: float) -> tuple[float, float | None]:
    """Requests per second, and the broker's CPU seconds over the timed window (or None)."""
    me = [sys.executable, __file__]
    broker = subprocess.Popen([*me, "broker", endpoint, trace_dir], stdout=subprocess.PIPE)
    peers = [broker]
    try:
        assert broker.stdout is not None
        assert broker.stdout.readline().strip() == b"ready"
        peers += [subprocess.Popen([*me, "worker", endpoint]) for _ in range(2)]
        rate, before, after = trio.run(_timed_load, endpoint, seconds, broker.pid)
        cpu = None if before is None or after is None else after - before
        return rate, cpu
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
    parser.add_argument("--rounds", type=int, default=1, help="times over off, on, on, off")
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
    cpu: dict[str, float | None] = {"off": 0.0, "on": 0.0}
    done: dict[str, float] = {"off": 0.0, "on": 0.0}
    with tempfile.TemporaryDirectory() as traces:
        for mode in ("off", "on", "on", "off") * max(1, args.rounds):
            rate, spent = _run(args.endpoint, traces if mode == "on" else "", seconds)
            rates[mode] += rate
            done[mode] += rate * seconds
            so_far = cpu[mode]
            cpu[mode] = None if so_far is None or spent is None else so_far + spent
            per = (
                ""
                if spent is None
                else f", broker CPU {spent / (rate * seconds) * 1e6:5.1f} us/req"
            )
            print(f"tracing {mode:3s}: {rate:8.0f} requests/s{per}", flush=True)
    ratio = rates["on"] / rates["off"]
    verdict = "meets" if ratio >= GOAL else "misses"
    print(f"tracing on/off throughput: {ratio:.3f} ({verdict} the goal >= {GOAL:.2f})")
    off_cpu, on_cpu = cpu["off"], cpu["on"]
    if off_cpu is not None and on_cpu is not None:
        off_per, on_per = off_cpu / done["off"] * 1e6, on_cpu / done["on"] * 1e6
        print(
            f"broker CPU per request: off {off_per:.1f} us, on {on_per:.1f} us "
            f"(on/off {on_per / off_per:.3f})"
        )


if __name__ == "__main__":
    main()
