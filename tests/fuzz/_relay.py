"""The planted brokers' relay: a ROUTER for the peers, one DEALER per peer toward domo's broker.

Each peer gets a DEALER with its own routing id, so domo's broker sees it as itself. A fuzz
search makes thousands of peers (every scenario its own), so the relay closes the DEALER of a
peer silent both ways for ``IDLE`` seconds (a scenario's peers are long gone by then), and lets
its context hold more than ZeroMQ's default 1,023 sockets. Without both, a 20 s DCP search ran
the relay out of sockets ("Too many open files" from ``zmq_socket``), and every scenario after
that looked like a broker that had stopped answering: false findings in the controls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import zmq

IDLE = 10.0  # seconds a peer may be silent both ways before its DEALER is closed
MAX_SOCKETS = 16_384  # the relay's context; each DEALER also holds two or three descriptors
SWEEP = 1.0  # seconds between two looks for idle DEALERs

Inbound = Callable[[bytes, list[bytes]], bool]  # relay this peer's message to the broker?
Outbound = Callable[[bytes, list[bytes]], Iterable[tuple[bytes, Sequence[bytes]]]]


def relay(backend: str, inbound: Inbound, outbound: Outbound) -> None:
    """Bind a ROUTER on a free loopback port, print its endpoint, relay until killed.

    ``inbound(peer, frames)`` says whether a peer's message goes on to ``backend``;
    ``outbound(peer, frames)`` says what the broker's message to ``peer`` becomes: pairs of
    (peer to send it to, frames).
    """
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
    front = context.socket(zmq.ROUTER)
    front.setsockopt(zmq.LINGER, 0)
    front.bind("tcp://127.0.0.1:0")
    print(front.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    peers: dict[zmq.Socket[bytes], bytes] = {}
    dealers: dict[bytes, zmq.Socket[bytes]] = {}
    heard: dict[bytes, float] = {}
    swept = time.monotonic()
    while True:
        for sock, _ in poller.poll(int(SWEEP * 1000)):
            if sock is front:
                identity, *frames = front.recv_multipart()
                dealer = dealers.get(identity)
                if dealer is None:
                    dealer = context.socket(zmq.DEALER)
                    dealer.setsockopt(zmq.LINGER, 0)
                    dealer.setsockopt(zmq.ROUTING_ID, identity)
                    dealer.connect(backend)
                    dealers[identity] = dealer
                    peers[dealer] = identity
                    poller.register(dealer, zmq.POLLIN)
                heard[identity] = time.monotonic()
                if inbound(identity, frames):
                    dealer.send_multipart(frames)
            else:
                frames = sock.recv_multipart()
                identity = peers[sock]
                heard[identity] = time.monotonic()
                for target, altered in outbound(identity, frames):
                    front.send_multipart([target, *altered])
        now = time.monotonic()
        if now - swept < SWEEP:
            continue
        swept = now
        for identity in [peer for peer, at in heard.items() if now - at > IDLE]:
            dealer = dealers.pop(identity)
            del peers[dealer], heard[identity]
            poller.unregister(dealer)
            dealer.close(linger=0)
