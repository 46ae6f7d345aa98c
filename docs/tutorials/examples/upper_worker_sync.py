"""The "upper" worker in blocking code: a plain function, run in the calling thread."""

import contextlib
import signal
import sys

from domo.sync import run_worker


def upper(frames: list[bytes]) -> list[bytes]:
    return [frame.upper() for frame in frames]


if __name__ == "__main__":
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    with contextlib.suppress(KeyboardInterrupt):  # run_worker says DISCONNECT on its way out
        run_worker(endpoint, "upper", upper)
