"""The "upper" worker in blocking code: a plain function, run in the calling thread."""

import signal
import sys

from domo.sync import run_worker


def upper(frames: list[bytes]) -> list[bytes]:
    return [frame.upper() for frame in frames]


if __name__ == "__main__":
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a service manager's stop: exit 0
    try:
        run_worker(endpoint, "upper", upper)  # says DISCONNECT on its way out, however it ends
    except KeyboardInterrupt:  # Ctrl-C
        print("upper worker: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
