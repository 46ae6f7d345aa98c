"""majortomo 0.2.0's broker, echo worker and looping client, as conformance/run.py starts them.

Run with the python of majortomo's own virtualenv (majortomo 0.2.0 and six, never a dependency
of domo); only majortomo, pyzmq and the standard library are imported here:

    python majortomo_peers.py broker ENDPOINT --heartbeat-interval S --liveness N
    python majortomo_peers.py worker ENDPOINT --heartbeat-interval S --liveness N
    python majortomo_peers.py client ENDPOINT [--service echo] [--timeout S] [--count N]

- ``broker`` binds ENDPOINT, prints ``ready`` and serves until killed.
- ``worker`` serves ``echo`` (the reply is the request's body) until killed; when majortomo's
  worker gives its connection up (a DISCONNECT from the broker) it connects again.
- ``client`` sends requests one after another, each after the reply to the one before (the
  contract of ``domo fuzz --target client``), until killed or ``--count`` requests are done;
  after a timeout or a reply majortomo rejects it goes on with the next request on a new socket.
  Nothing is printed per request; a tally goes to stderr when it stops.

majortomo counts liveness in seconds (``heartbeat_timeout``) rather than in intervals: it is given
``liveness x interval`` so that both sides agree on when a peer is lost. Errors majortomo raises
or logs go to stderr, one line each, so that a run's log says what majortomo rejected.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections import Counter
from types import FrameType

import majortomo
from majortomo import error as mt_error
from majortomo.broker import Broker

SERVICE = "echo"


class Stop(Exception):
    """Raised by the SIGTERM/SIGINT handler: unwind, report, exit 0."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signum)


def _complain(role: str, what: object) -> None:
    print(f"majortomo {role}: {what}", file=sys.stderr, flush=True)


def run_broker(endpoint: str, interval: float, liveness: int) -> None:
    """majortomo's Broker on ``endpoint``; the same loop as its ``run()``, plus a ``ready`` line."""
    broker = Broker(
        bind=endpoint, heartbeat_interval=interval, heartbeat_timeout=liveness * interval
    )
    broker.bind()
    print("ready", flush=True)
    try:
        while True:
            message = broker.receive()
            if message is None:
                continue
            try:
                broker.handle_message(message)
            except Exception as failure:  # majortomo's run() logs these and goes on; so do we
                _complain("broker", f"handling a message failed: {failure!r}")
    finally:
        broker.close()


def run_worker(endpoint: str, interval: float, liveness: int) -> None:
    """An echo worker for ``SERVICE``, connecting again whenever majortomo gives a connection up."""
    worker = majortomo.Worker(
        endpoint, SERVICE, heartbeat_interval=interval, heartbeat_timeout=liveness * interval
    )
    worker.connect()
    try:
        while True:
            try:
                client, body = worker.wait_for_request()
            except mt_error.Disconnected:
                _complain("worker", "disconnected by the broker; connecting again")
                worker.connect(reconnect=True)
                continue
            except mt_error.ProtocolError as failure:
                _complain("worker", f"protocol error: {failure}")
                continue
            worker.send_reply_final(client, body)
    finally:
        worker.close()


def run_client(
    endpoint: str, service: str, timeout: float, count: int, tally: Counter[str]
) -> None:
    """Requests one after another, counted in ``tally``: ok, wrong reply, timeout or the error."""
    client = majortomo.Client(endpoint)
    client.connect()
    sent = 0
    try:
        while count == 0 or sent < count:
            body = b"request %d" % sent
            sent += 1
            try:
                client.send(service, body)
                reply = client.recv_all_as_list(timeout=timeout)
            except mt_error.Timeout:
                tally["timeout"] += 1
                client.connect(reconnect=True)  # a new socket: the old one may hold a late reply
                continue
            except mt_error.Error as failure:
                tally[type(failure).__name__] += 1
                client.connect(reconnect=True)
                continue
            tally["ok" if reply == [body] else "wrong reply"] += 1
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["broker", "worker", "client"])
    parser.add_argument("endpoint")
    parser.add_argument("--heartbeat-interval", type=float, default=2.5, metavar="SECONDS")
    parser.add_argument("--liveness", type=int, default=3, metavar="N")
    parser.add_argument("--service", default=SERVICE, help="client: the service to ask")
    parser.add_argument("--timeout", type=float, default=2.5, help="client: seconds per reply")
    parser.add_argument("--count", type=int, default=0, help="client: requests, 0 for ever")
    args = parser.parse_args()
    # majortomo logs what it rejects at WARNING (its broker drops malformed messages that way).
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="majortomo %(message)s")
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    tally: Counter[str] = Counter()
    try:
        if args.role == "broker":
            run_broker(args.endpoint, args.heartbeat_interval, args.liveness)
        elif args.role == "worker":
            run_worker(args.endpoint, args.heartbeat_interval, args.liveness)
        else:
            run_client(args.endpoint, args.service, args.timeout, args.count, tally)
    except Stop:
        pass
    if args.role == "client":
        _complain("client", ", ".join(f"{k}: {v}" for k, v in sorted(tally.items())) or "nothing")
        sys.exit(0 if set(tally) <= {"ok"} else 1)


if __name__ == "__main__":
    main()
