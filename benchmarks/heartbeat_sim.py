"""Past this machine's open-file limit: the broker's core with 50,000 and 100,000 virtual workers.

A real broker here holds at most ~19,900 peers (20,000 open files, ``benchmarks/scale.py``). The
sans-IO core does no I/O, so it can be driven in this process with any number of workers: each
registers (READY) at its own phase of the heartbeat interval and then sends a HEARTBEAT every
``--heartbeat`` seconds, in virtual time, in steps of ``--step`` seconds as a broker's pump would
take them (the messages due in a step, then ``tick``, then the outbox and ``flushed``). The CPU
this process spends over ``--intervals`` steady intervals, divided by the heartbeats that
crossed the core both ways (each worker's, and the broker's to each worker), is the core's cost
per heartbeat: if it stays flat from 10,000 to 100,000 workers, the core's cost grows linearly
with the workers and a real broker's can be told from its per-message cost measured below the
limit (docs/performance.md does the arithmetic). ``tracemalloc`` gives the core's bytes per
worker.

``--quick``: 1,000 and 2,000 workers (the CI smoke test).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from typing import Any

from domo.protocol import BrokerConfig
from domo.protocol.family import FamilyBroker

READY = (b"MDPW02", b"\x01", b"idle")
HEARTBEAT = (b"MDPW02", b"\x05")


def simulate(workers: int, heartbeat: float, step: float, intervals: int) -> dict[str, Any]:
    """One broker core, ``workers`` idle workers; the figures of its steady intervals."""
    broker = FamilyBroker(BrokerConfig(heartbeat_interval=heartbeat))
    peers = [b"\x00" + i.to_bytes(4, "big") for i in range(workers)]  # ZeroMQ-like routing ids
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    # Registration, spread over one interval: worker i at phase i / workers.
    now = 0.0
    for index, peer in enumerate(peers):
        now = index / workers * heartbeat
        broker.receive(peer, READY, now)
    broker.take_outgoing()
    broker.flushed()
    core_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(broker.workers()) == workers

    def run(until: float, start: float) -> tuple[int, int, float]:
        """Drive the core from ``start`` to ``until``; heartbeats in and out, and now."""
        received = sent = 0
        at = start
        next_index = int(start / heartbeat * workers)  # heartbeats sent so far, all workers
        while at < until:
            at += step
            due = int(at / heartbeat * workers)
            for n in range(next_index, due):
                broker.receive(peers[n % workers], HEARTBEAT, at)
            received += due - next_index
            next_index = due
            broker.tick(at)
            sent += len(broker.take_outgoing())
            broker.flushed()
        return received, sent, at

    # One interval to reach the steady pace, then the measured ones.
    _, _, now = run(2 * heartbeat, heartbeat)
    assert len(broker.workers()) == workers, "workers expired: the simulation is too slow"
    cpu0 = time.process_time()
    received, sent, _end = run(now + intervals * heartbeat, now)
    cpu = time.process_time() - cpu0
    assert len(broker.workers()) == workers
    per_interval = cpu / intervals
    return {
        "workers": workers,
        "heartbeats_in": received,
        "heartbeats_out": sent,
        "cpu_s": cpu,
        "us_per_heartbeat": cpu / (received + sent) * 1e6,
        "core_cpu_percent_at_heartbeat": per_interval / heartbeat * 100,
        "core_bytes_per_worker": core_bytes / workers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="10000,50000,100000")
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument("--step", type=float, default=0.01, help="virtual seconds per pump step")
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    counts = [1000, 2000] if args.quick else [int(n) for n in args.workers.split(",")]
    results = []
    for count in counts:
        result = simulate(count, args.heartbeat, args.step, 1 if args.quick else args.intervals)
        results.append(result)
        print(
            f"{count:>7} workers: {result['us_per_heartbeat']:.2f} us of CPU per heartbeat "
            f"({result['heartbeats_in']} in, {result['heartbeats_out']} out), the core alone "
            f"{result['core_cpu_percent_at_heartbeat']:.1f} % of a core, "
            f"{result['core_bytes_per_worker']:.0f} B per worker",
            flush=True,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"heartbeat": args.heartbeat, "step": args.step, "results": results},
                      out, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
