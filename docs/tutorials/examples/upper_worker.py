"""A worker for the service "upper": each reply is the request's frames in upper case."""

import sys

import trio

from domo.trio import run_worker


async def upper(frames: list[bytes]) -> list[bytes]:
    return [frame.upper() for frame in frames]


if __name__ == "__main__":
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    trio.run(run_worker, endpoint, "upper", upper)
