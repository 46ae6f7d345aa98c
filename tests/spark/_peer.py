"""A worker process for the Spark tests: ``python _peer.py ENDPOINT SERVICE KIND [HEARTBEAT]``.

KIND ``upper``: replies with the body upper-cased, except that a body starting with ``fail``
makes the handler raise (an error FINAL, ``RemoteError`` at the client) and a body starting
with ``frames`` is answered in two frames. KIND ``sleep``: sleeps the body's seconds and echoes
it (to be killed mid-request). Prints ``ready`` once the broker has heard it (the first
heartbeat the broker sends after READY: it is registered); runs until killed.
"""

from __future__ import annotations

import sys
import time

from domo.protocol import WorkerConfig
from domo.sync import run_worker


def upper(body: list[bytes]) -> list[bytes]:
    if body[0].startswith(b"fail"):
        raise ValueError(f"refused {body[0]!r}")
    if body[0].startswith(b"frames"):
        return [body[0][:3], body[0][3:]]
    return [body[0].upper()]


def sleep(body: list[bytes]) -> list[bytes]:
    time.sleep(float(body[0]))
    return body


def main() -> None:
    endpoint, service, kind = sys.argv[1:4]
    interval = float(sys.argv[4]) if len(sys.argv) > 4 else 2.5
    config = WorkerConfig(heartbeat_interval=interval, liveness=3, reconnect_initial=0.05)
    heard: list[bool] = []

    def ready() -> None:
        if not heard:
            heard.append(True)
            print("ready", flush=True)

    handler = upper if kind == "upper" else sleep
    run_worker(endpoint, service, handler, config=config, on_broker_heard=ready)


if __name__ == "__main__":
    main()
