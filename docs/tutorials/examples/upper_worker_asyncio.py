"""The "upper" worker on asyncio: an async function, served until the task is cancelled."""

import asyncio
import sys

from domo.asyncio import run_worker


async def upper(frames: list[bytes]) -> list[bytes]:
    return [frame.upper() for frame in frames]


if __name__ == "__main__":
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    try:
        asyncio.run(run_worker(endpoint, "upper", upper))
    except KeyboardInterrupt:  # Ctrl-C cancelled run_worker, which sent DISCONNECT
        print("upper worker: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
