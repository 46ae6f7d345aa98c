"""A deliberately wrong broker: domo's sans-IO ``Broker`` on a ROUTER, with one behaviour altered.

``python planted_broker.py FLAW INTERVAL LIVENESS`` binds tcp://127.0.0.1 on a free port, prints
the endpoint on stdout and serves until killed. FLAW is one of:

- ``none``: domo's broker unaltered (a control);
- ``no-heartbeat``: never sends HEARTBEAT (breaks MDP-H-04);
- ``late-final``: forwards a FINAL from a worker it has already expired (MDP-D-10);
- ``ignore-disconnect``: drops DISCONNECT from workers unread (MDP-W-13);
- ``die-on-garbage``: exits on the first malformed message (MDP-W-16);
- ``busy-dispatch``: hands a new request to a worker still busy with one of its service (MDP-A-06);
- ``early-expiry``: forgets a worker silent for 1.2 intervals, not LIVENESS (MDP-H-05).
"""

from __future__ import annotations

import sys
import time

import zmq

from domo.protocol import Broker, BrokerConfig, mdp
from domo.protocol.errors import MalformedMessage


def main() -> None:
    flaw, interval, liveness = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    broker = Broker(BrokerConfig(heartbeat_interval=interval, liveness=liveness))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    print(router.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    held: dict[bytes, tuple[bytes, bytes]] = {}  # worker -> (client, service) of its request
    service_of: dict[bytes, bytes] = {}
    last_heard: dict[bytes, float] = {}
    forgotten: set[bytes] = set()

    def flush() -> None:
        for peer, frames in broker.take_outgoing():
            if peer in forgotten:
                continue
            if flaw == "no-heartbeat" and list(frames[:2]) == [mdp.WORKER_HEADER, mdp.W_HEARTBEAT]:
                continue
            if len(frames) >= 3 and frames[:2] == (mdp.WORKER_HEADER, mdp.W_REQUEST):
                held[peer] = (bytes(frames[2]), service_of.get(peer, b""))
            router.send_multipart([peer, *frames])

    while True:
        deadline = broker.next_deadline()
        timeout = 50 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        if router.poll(min(timeout, 50) + 1):
            peer, *frames = router.recv_multipart()
            now = time.monotonic()
            try:
                command = mdp.parse(frames)
            except MalformedMessage:
                if flaw == "die-on-garbage":
                    sys.exit(3)
                command = None
            if flaw == "early-expiry" and peer in broker.workers():
                if now - last_heard.get(peer, now) > 1.2 * interval:
                    forgotten.add(peer)
                last_heard[peer] = now
            if peer in forgotten:
                continue
            if flaw == "ignore-disconnect" and isinstance(command, mdp.WorkerDisconnect):
                continue
            if isinstance(command, mdp.WorkerReady):
                service_of[peer] = command.service
                last_heard[peer] = now
            if isinstance(command, mdp.WorkerFinal):
                if flaw == "late-final" and peer not in broker.workers() and peer in held:
                    client, service = held.pop(peer)
                    router.send_multipart([client, *mdp.client_final_frames(service, command.body)])
                    continue
                held.pop(peer, None)
            if flaw == "busy-dispatch" and isinstance(command, mdp.ClientRequest):
                busy = [w for w, (_, s) in held.items() if s == command.service]
                if busy:
                    router.send_multipart([busy[0], *mdp.worker_request_frames(peer, command.body)])
                    continue
            broker.receive(peer, frames, max(now, broker.now))
        broker.tick(max(time.monotonic(), broker.now))
        flush()


if __name__ == "__main__":
    main()
