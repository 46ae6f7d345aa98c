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
  (MDP-W-08: the broker cannot parse any of it, so the worker never serves);
- ``ready-twice``: sends READY again after each FINAL, to say it is free (MDP-W-10);
- ``heartbeat-before-ready``: sends a HEARTBEAT first on each new socket (MDP-W-09);
- ``no-reconnect``: on DISCONNECT closes its socket and never comes back (MDP-W-17);
- ``early-give-up``: takes one interval of broker silence for a dead broker (MDP-H-05);
- ``never-gives-up``: never notices a silent broker, so never starts again (MDP-H-06).

The client's flaws:

- ``ignore-service``: takes any FINAL as its reply, whatever service it names (MDP-D-20);
- ``partial-is-final``: takes a PARTIAL as the end of its request (MDP-C-05);
- ``resend-same-socket``: on a timeout resends on the same socket (MDP-C-07);
- ``garbage-is-final``: takes any message it cannot parse as the end of its request (MDP-W-08);
- ``request-is-reply``: takes a REQUEST from the broker as its reply (MDP-D-20);
- ``no-body-on-retry``: resends without its body frame (MDP-C-01).
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
        if flaw == "heartbeat-before-ready":
            send(sock, mdp.HEARTBEAT_FRAMES)
        send(sock, mdp.worker_ready_frames(SERVICE))
        return sock

    patience = {"early-give-up": 1.0, "never-gives-up": float("inf")}.get(flaw, liveness)
    sock = connect()
    last_sent = last_heard = time.monotonic()
    while True:
        now = time.monotonic()
        if now - last_heard >= patience * interval:  # the broker is gone: start again
            sock.close()
            sock = connect()
            last_sent = last_heard = time.monotonic()
            continue
        if now - last_sent >= interval and flaw != "no-heartbeat":
            send(sock, mdp.HEARTBEAT_FRAMES)
            last_sent = now
        wait = min(last_sent + interval, last_heard + patience * interval) - time.monotonic()
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
            if flaw == "no-reconnect":
                while True:
                    time.sleep(1)
            sock = connect()
            last_sent = last_heard = time.monotonic()
            continue
        last_heard = time.monotonic()
        if isinstance(command, mdp.WorkerRequest):
            client = b"someone-else" if flaw == "wrong-address" else command.client
            send(sock, mdp.worker_final_frames(client, command.body))
            if flaw == "final-without-request":
                send(sock, mdp.worker_final_frames(client, command.body))
            if flaw == "ready-twice":
                send(sock, mdp.worker_ready_frames(SERVICE))
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
                if flaw != "resend-same-socket":
                    sock.close()
                    sock = connect()
                if flaw == "no-body-on-retry":
                    request = request[:3]
                sock.send_multipart(request)
                deadline = time.monotonic() + timeout
                continue
            if not sock.poll(int(left * 1000) + 1):
                continue
            try:
                reply = mdp.parse_client(sock.recv_multipart())
            except MalformedMessage:
                if flaw == "garbage-is-final":
                    break
                continue
            if isinstance(reply, mdp.ClientRequest):
                if flaw == "request-is-reply":
                    break
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
