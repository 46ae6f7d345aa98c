"""A worker for the durable chaos runs: answers ``body + b"!"`` and appends each body it runs to
a log (one ``write`` per line on an O_APPEND descriptor, so concurrent workers and a SIGKILL leave
whole lines), so the run can count how often a request was executed.

    python tests/chaos/recording_worker.py SERVICE LOG ENDPOINT [ENDPOINT ...] [--beat S]
"""

from __future__ import annotations

import argparse
import os
import sys

import trio

import domo.trio
from domo.protocol import WorkerConfig


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("service")
    parser.add_argument("log")
    parser.add_argument("endpoints", nargs="+")
    parser.add_argument("--beat", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def handler(body: list[bytes]) -> list[bytes]:
        os.write(fd, body[0] + b"\n")  # recorded before the reply can leave
        return [body[0] + b"!"]

    async def serve() -> None:
        config = WorkerConfig(heartbeat_interval=args.beat, liveness=3)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: domo.trio.run_worker(
                    args.endpoints, args.service, handler, config=config,
                    concurrency=args.concurrency, task_status=task_status,
                )
            )  # fmt: skip
            print("recording worker: serving", flush=True)

    trio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
