"""majortomo's broker, worker and client as the conformance run starts them.

Run with the python of majortomo's own virtualenv (majortomo 0.2.0 and six; never a dependency
of domo); it imports only majortomo and the standard library:

    python majortomo_peers.py broker ENDPOINT --heartbeat-interval S --liveness N
    python majortomo_peers.py worker ENDPOINT --heartbeat-interval S --liveness N
    python majortomo_peers.py client ENDPOINT [--service echo] [--timeout S]

The broker binds ENDPOINT; the worker serves ``echo`` (the reply is the request's body); the
client sends requests to the service one after another for ever, as ``domo fuzz --target
client`` expects, starting again on a new connection after a timeout or an error. majortomo
takes a heartbeat *timeout* in seconds rather than a liveness count: it is given
``liveness * interval``, so both sides agree on when a peer is lost.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import signal
import sys
from types import FrameType

import majortomo
from majortomo.broker import Broker


def _exit_on_signal() -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        sys.exit(0)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_broker(endpoint: str, interval: float, liveness: int) -> None:
    broker = Broker(
        bind=endpoint, heartbeat_interval=interval, heartbeat_timeout=liveness * interval
    )
    _exit_on_signal()
    broker.run()


def run_worker(endpoint: str, interval: float, liveness: int) -> None:
    worker = majortomo.Worker(
        endpoint, "echo", heartbeat_interval=interval, heartbeat_timeout=liveness * interval
    )
    _exit_on_signal()
    requests = majortomo.WorkerRequestsIterator(worker)
    for request in requests:
        requests.send_reply_final(list(request))


def run_client(endpoint: str, service: str, timeout: float) -> None:
    _exit_on_signal()
    client = majortomo.Client(endpoint)
    client.connect()
    for n in itertools.count():
        try:
            client.send(service, b"request %d" % n)
            client.recv_all_as_list(timeout=timeout)
        except Exception as error:  # a timeout or a reply it rejects: start again, keep asking
            logging.getLogger("majortomo_peers").info("request %d: %r", n, error)
            client.connect(reconnect=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["broker", "worker", "client"])
    parser.add_argument("endpoint")
    parser.add_argument("--heartbeat-interval", type=float, default=0.1)
    parser.add_argument("--liveness", type=int, default=3)
    parser.add_argument("--service", default="echo")
    parser.add_argument("--timeout", type=float, default=1.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.role == "broker":
        run_broker(args.endpoint, args.heartbeat_interval, args.liveness)
    elif args.role == "worker":
        run_worker(args.endpoint, args.heartbeat_interval, args.liveness)
    else:
        run_client(args.endpoint, args.service, args.timeout)


if __name__ == "__main__":
    main()
