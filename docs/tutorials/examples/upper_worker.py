"""A worker for the service "upper": each reply is the request's frames in upper case."""

import sys

import trio

from domo.trio import run_worker


async def upper(frames: list[bytes]) -> list[bytes]:
    return [frame.upper() for frame in frames]


if __name__ == "__main__":
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    try:
        trio.run(run_worker, endpoint, "upper", upper)
    except* KeyboardInterrupt:  # Ctrl-C cancelled run_worker, which sent DISCONNECT; except*:
        # Trio raises what ends a nursery's tasks in an exception group
        print("upper worker: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
