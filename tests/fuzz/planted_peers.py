"""A deliberately wrong MDP/0.2 worker or client, written by hand on blocking pyzmq.

``python planted_peers.py worker FLAW ENDPOINT INTERVAL LIVENESS`` serves the service ``echo``;
``python planted_peers.py client FLAW ENDPOINT`` sends requests to ``echo`` one after another
for ever. Each runs until killed. With FLAW ``none`` each follows the spec (a control, so that a
flaw alone is what the fuzzer finds); the worker's flaws:

- ``final-without-request``: after each FINAL it sends a second one (breaks MDP-R-01);
- ``no-heartbeat``: never sends HEARTBEAT (MDP-H-04);
- ``ignore-disconnect``: on DISCONNECT it sends READY again on the same socket (MDP-W-17);
- ``wrong-address``: answers to a client address other than the request's (MDP-R-03);
- ``die-on-garbage``: exits on the first malformed message (MDP-W-08);
- ``delimiter-first``: frames every message as a REQ socket would, an empty frame first
  (MDP-W-08: the broker cannot parse any of it, so the worker never serves).

The client's flaws:

- ``ignore-service``: takes any FINAL as its reply, whatever service it names (MDP-D-20);
- ``partial-is-final``: takes a PARTIAL as the end of its request (MDP-C-05).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Sequence

import zmq

from domo.protocol import mdp
from domo.protocol.errors import MalformedMessage

Socket = zmq.Socket[bytes]
SERVICE = b"echo"


def worker(flaw: str, endpoint: str, interval: float, liveness: int) -> None:
    context: zmq.Context[Socket] = zmq.Context()

    first = [b""] if flaw == "delimiter-first" else []

    def send(sock: Socket, frames: Sequence[bytes]) -> None:
        sock.send_multipart([*first, *frames])

    def connect() -> Socket:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        send(sock, mdp.worker_ready_frames(SERVICE))
        return sock

    sock = connect()
    last_sent = last_heard = time.monotonic()
    while True:
        now = time.monotonic()
        if now - last_heard >= liveness * interval:  # the broker is gone: start again
            sock.close()
            sock = connect()
            last_sent = last_heard = time.monotonic()
            continue
        if now - last_sent >= interval and flaw != "no-heartbeat":
            send(sock, mdp.HEARTBEAT_FRAMES)
            last_sent = now
        wait = min(last_sent + interval, last_heard + liveness * interval) - time.monotonic()
        if not sock.poll(max(0, int(wait * 1000)) + 1):
            continue
        frames = sock.recv_multipart()
        try:
            command = mdp.parse_worker(frames)
        except MalformedMessage:
            if flaw == "die-on-garbage":
                sys.exit(3)
            continue
        if isinstance(command, mdp.WorkerDisconnect):
            if flaw == "ignore-disconnect":
                send(sock, mdp.worker_ready_frames(SERVICE))
                last_sent = last_heard = time.monotonic()
                continue
            sock.close()
            sock = connect()
            last_sent = last_heard = time.monotonic()
            continue
        last_heard = time.monotonic()
        if isinstance(command, mdp.WorkerRequest):
            client = b"someone-else" if flaw == "wrong-address" else command.client
            send(sock, mdp.worker_final_frames(client, command.body))
            if flaw == "final-without-request":
                send(sock, mdp.worker_final_frames(client, command.body))
            last_sent = time.monotonic()
        # READY, PARTIAL or FINAL from a broker: the spec asks nothing of a worker; ignore them.


def client(flaw: str, endpoint: str, timeout: float = 1.0) -> None:
    context: zmq.Context[Socket] = zmq.Context()

    def connect() -> Socket:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return sock

    sock = connect()
    for n in itertools.count():
        request = mdp.client_request_frames(SERVICE, [b"request %d" % n])
        sock.send_multipart(request)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:  # no reply: resend on a new socket (MDP-C-08)
                sock.close()
                sock = connect()
                sock.send_multipart(request)
                deadline = time.monotonic() + timeout
                continue
            if not sock.poll(int(left * 1000) + 1):
                continue
            try:
                reply = mdp.parse_client(sock.recv_multipart())
            except MalformedMessage:
                continue
            if isinstance(reply, mdp.ClientRequest):
                continue
            if reply.service != SERVICE and flaw != "ignore-service":
                continue
            if isinstance(reply, mdp.ClientPartial):
                if flaw == "partial-is-final":
                    break
                deadline = time.monotonic() + timeout
                continue
            break


def main() -> None:
    role, flaw, endpoint = sys.argv[1:4]
    if role == "worker":
        worker(flaw, endpoint, float(sys.argv[4]), int(sys.argv[5]))
    else:
        client(flaw, endpoint)


if __name__ == "__main__":
    main()
