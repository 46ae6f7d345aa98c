"""A worker that streams its progress: run it beside `domo broker`, then `domo call progress 3`.

    domo broker &
    python examples/progress_worker.py            # or --connect tcp://HOST:PORT
    domo call progress 3                          # prints "step 1 of 3 ...", ..., then "done"

The handler is an async generator. ``yield Partial(body)`` sends a PARTIAL at once, so the
client sees each step as it starts; the last plain ``yield`` is the FINAL. Blocking work would
go in ``trio.to_thread.run_sync`` so that the worker keeps heartbeating meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from functools import partial

import trio

from domo.trio import Partial, WorkerConfig, run_worker


async def progress(body: list[bytes]) -> AsyncIterator[bytes | Partial]:
    """Count to the number in the request's first frame (default 3), reporting each step."""
    steps = int(body[0]) if body and body[0].strip().isdigit() else 3
    for step in range(1, steps + 1):
        yield Partial(f"step {step} of {steps} ...".encode())
        await trio.sleep(0.2)  # the work of one step
    yield b"done"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", default="tcp://127.0.0.1:5555", help="the broker")
    parser.add_argument("--heartbeat-interval", type=float, default=2.5, metavar="SECONDS")
    args = parser.parse_args()
    config = WorkerConfig(heartbeat_interval=args.heartbeat_interval)
    async with trio.open_nursery() as nursery:
        serve = partial(run_worker, config=config)
        await nursery.start(serve, args.connect, "progress", progress)
        print(f"serving 'progress' at {args.connect} (Ctrl-C stops)", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: run_worker said DISCONNECT
        trio.run(main)
