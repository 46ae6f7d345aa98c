"""The request load that ``domo demo`` and ``domo bench`` drive, and its report (text or JSON)."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
import zmq

from domo.trio import (
    Client,
    RequestError,
)

from ._common import EXIT_FAILED_REQUESTS, EXIT_OK
from .call import _frame_as_line


def _quiet(*_: object, **__: object) -> None:
    """``print``'s stand-in for the lines for people under ``--json``."""


def _json_load_report(
    command: str, load: DemoLoad, elapsed: float, code: int, **fields: object
) -> None:
    """What ``bench --json`` and ``demo --json`` print: one JSON object on stdout."""
    done = len(load.latencies)
    latency: dict[str, float] | None = None
    if done:
        p50, p99 = _percentiles(load.latencies)
        latency = {
            "p50": round(p50 * 1000, 3),
            "p99": round(p99 * 1000, 3),
            "max": round(max(load.latencies) * 1000, 3),
        }
    record = {
        "command": command,
        **fields,
        "requests_done": done,
        "failed": load.failed,
        "wrong": load.wrong,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(done / elapsed, 1) if done and elapsed > 0 else 0.0,
        "latency_ms": latency,
        "exit_code": code,
    }
    print(json.dumps(record), flush=True)


# --- domo demo --------------------------------------------------------------------------------


@dataclass
class DemoLoad:
    """What the demo's clients did."""

    issued: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, one per checked reply
    failed: int = 0  # no FINAL after every retry
    wrong: int = 0  # a FINAL that was not the request's body
    sample: tuple[bytes, list[bytes]] | None = None


async def _demo_load(
    endpoint: str,
    context: zmq.Context[zmq.Socket[bytes]] | None,
    clients: int,
    requests: int | None,
    duration: float | None,
    load: DemoLoad,
    *,
    service: str = "echo",
    body_for: Callable[[int], bytes] = lambda n: b"demo request %d" % n,
    reply_timeout: float = 2.5,
    retries: int = 3,
) -> None:
    """``clients`` clients, one request at a time each; replies to ``echo`` are checked."""
    stop_at = math.inf if duration is None else trio.current_time() + duration

    async def one_client() -> None:
        client = Client(endpoint, context=context, timeout=reply_timeout, retries=retries)
        async with client:
            while trio.current_time() < stop_at and (requests is None or load.issued < requests):
                load.issued += 1
                body = body_for(load.issued)
                start = time.perf_counter()
                try:
                    reply = await client.request(service, body)
                except RequestError:
                    load.failed += 1
                    continue
                load.latencies.append(time.perf_counter() - start)
                if service == "echo" and reply != [body]:
                    load.wrong += 1
                load.sample = (body, reply)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one_client)


def _demo_report(
    load: DemoLoad, requests: int | None, elapsed: float, finals: dict[bytes, int]
) -> int:
    done = len(load.latencies)
    of = f" of {requests}" if requests else ""
    per_worker = ", ".join(str(count) for count in finals.values()) or "none"
    print(
        f"requests done: {done}{of} in {elapsed:.2f} s ({load.failed} failed, {load.wrong} "
        f"wrong replies); FINALs per worker: {per_worker}"
    )
    if load.sample is not None:
        body, reply = load.sample
        shown = b" ".join(_frame_as_line(frame).rstrip(b"\n") for frame in reply).decode()
        print(f"sample reply: {body.decode()!r} -> {shown!r}")
    if done:
        print(f"throughput: {done / elapsed:.0f} requests/s")
        p50, p99 = _percentiles(load.latencies)
        print(f"latency: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms", flush=True)
    return EXIT_FAILED_REQUESTS if load.failed or load.wrong else EXIT_OK


def _percentiles(samples: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile of ``samples`` (not empty)."""
    if len(samples) < 2:
        return samples[0], samples[0]
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return statistics.median(samples), cuts[98]
