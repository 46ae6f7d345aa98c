"""A streaming worker in blocking code: "count" replies 1, 2, ... N, one PARTIAL each."""

import signal
import sys
import time
from collections.abc import Iterator

from domo.sync import run_worker


def count(frames: list[bytes]) -> Iterator[bytes]:
    for n in range(1, int(frames[0]) + 1):
        time.sleep(0.1)  # slow work: heartbeats still go out while the handler runs
        yield str(n).encode()  # every value but the last is a PARTIAL; the last is the FINAL


if __name__ == "__main__":
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a service manager's stop: exit 0
    try:
        run_worker(endpoint, "count", count)  # says DISCONNECT on its way out, however it ends
    except KeyboardInterrupt:  # Ctrl-C
        print("count worker: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
