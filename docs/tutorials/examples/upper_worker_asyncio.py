"""The "upper" worker on asyncio: an async function, served until the task is cancelled."""

import asyncio
import contextlib
import sys

from domo.asyncio import run_worker


async def upper(frames: list[bytes]) -> list[bytes]:
    return [frame.upper() for frame in frames]


if __name__ == "__main__":
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C cancels run_worker: DISCONNECT
        asyncio.run(run_worker(endpoint, "upper", upper))
