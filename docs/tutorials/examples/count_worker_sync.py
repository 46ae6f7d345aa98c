"""A streaming worker in blocking code: "count" replies 1, 2, ... N, one PARTIAL each."""

import contextlib
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
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C or SIGTERM: DISCONNECT, then out
        run_worker(endpoint, "count", count)
