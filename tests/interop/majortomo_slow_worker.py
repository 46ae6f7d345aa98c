"""A majortomo 0.2.0 worker whose every job takes ``--work`` seconds; run in majortomo's venv.

majortomo's ``Worker`` heartbeats only inside ``wait_for_request``, so while the job sleeps it
is silent, as a real majortomo user's long job is (MAJ-08). Each job it starts is written to
stderr as ``job <body>``, so a test can count how many times a request ran. No domo import.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType

import majortomo
from majortomo import error as mt_error


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint")
    parser.add_argument("--service", default="slow")
    parser.add_argument("--work", type=float, required=True, metavar="SECONDS")
    parser.add_argument("--heartbeat-interval", type=float, default=2.5, metavar="SECONDS")
    parser.add_argument("--liveness", type=int, default=3, metavar="N")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    worker = majortomo.Worker(
        args.endpoint,
        args.service.encode(),
        heartbeat_interval=args.heartbeat_interval,
        heartbeat_timeout=args.liveness * args.heartbeat_interval,
    )
    worker.connect()
    try:
        while True:
            try:
                client, body = worker.wait_for_request()
            except mt_error.Disconnected:
                print("disconnected by the broker", file=sys.stderr, flush=True)
                worker.connect(reconnect=True)
                continue
            print("job " + b"".join(body).decode(), file=sys.stderr, flush=True)
            time.sleep(args.work)  # silent, as majortomo is while a handler runs
            worker.send_reply_final(client, body)
    finally:
        worker.close()


if __name__ == "__main__":
    main()
