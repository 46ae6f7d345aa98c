"""A runtime of our own for domo's broker: one ROUTER socket, a blocking poll, no event loop.

``python embed_broker.py ENDPOINT`` serves MDP/0.2 clients and workers until SIGINT or SIGTERM,
then tells every worker DISCONNECT and exits 0. Events are logged as ``domo broker`` logs them.
"""

import logging
import math
import signal
import sys
import time

import zmq

from domo.protocol import Broker, BrokerConfig
from domo.protocol.events import BrokerEvent
from domo.runtime import log_event

logger = logging.getLogger("embed_broker")


def log(events: list[BrokerEvent]) -> None:
    for event in events:
        log_event(logger, event)  # each event at its level: workers at INFO, requests at DEBUG


def send_all(broker: Broker, router: zmq.Socket[bytes]) -> None:
    """Send the broker's outbox; tell it about each peer a send failed for (once per pass)."""
    while outgoing := broker.take_outgoing():  # telling it may queue more: loop until empty
        failed: set[bytes] = set()
        for peer, frames in outgoing:
            if peer in failed:
                continue  # the broker has given this peer up: nothing more goes to it
            try:
                router.send_multipart([peer, *frames], zmq.NOBLOCK)
            except zmq.Again:  # the peer's queue is full
                failed.add(peer)
                log(broker.peer_congested(peer, time.monotonic()))
            except zmq.ZMQError as error:
                if error.errno != zmq.EHOSTUNREACH:
                    raise
                failed.add(peer)  # gone (ROUTER_MANDATORY reports it instead of dropping)
                log(broker.peer_unreachable(peer, time.monotonic()))


def serve(endpoint: str) -> None:
    broker = Broker(BrokerConfig(heartbeat_interval=2.5, liveness=3))
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    try:
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.bind(endpoint)
        print("listening on", router.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
        while True:
            # 1. Wait for messages, never past the broker's next deadline (a heartbeat to send,
            #    a worker to expire, a request to expire).
            deadline = broker.next_deadline()
            wait_ms = None if deadline is None else math.ceil((deadline - time.monotonic()) * 1000)
            router.poll(None if wait_ms is None else max(0, wait_ms), zmq.POLLIN)
            # 2. One clock reading for the batch; every message that is waiting, up to a bound,
            #    so that timers and sends get their turn.
            now = time.monotonic()
            for _ in range(1000):
                try:
                    peer, *frames = router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                log(broker.receive(peer, frames, now))
            # 3. The time, whether or not a message came (cheap when nothing is due).
            log(broker.tick(now))
            # 4. Everything the broker queued, in order.
            send_all(broker, router)
    except KeyboardInterrupt:
        # A graceful stop: give up the requests, DISCONNECT to every worker.
        log(broker.shutdown(time.monotonic()))
        send_all(broker, router)
    finally:
        router.close(linger=500)  # milliseconds for the DISCONNECTs to leave
        context.term()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    serve(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555")
