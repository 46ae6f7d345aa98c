"""A deliberately wrong broker: domo's sans-IO ``Broker`` on a ROUTER, with one behaviour altered.

``python planted_broker.py FLAW INTERVAL LIVENESS`` binds tcp://127.0.0.1 on a free port, prints
the endpoint on stdout and serves until killed. FLAW is one of:

- ``none``: domo's broker unaltered (a control);
- ``no-heartbeat``: never sends HEARTBEAT (breaks MDP-H-04);
- ``late-final``: forwards a FINAL from a worker it has already expired (MDP-D-10);
- ``ignore-disconnect``: drops DISCONNECT from workers unread (MDP-W-13);
- ``die-on-garbage``: exits on the first malformed message (MDP-W-16);
- ``busy-dispatch``: hands a new request to a worker still busy with one of its service (MDP-A-06);
- ``early-expiry``: forgets a worker silent for 1.2 intervals, not LIVENESS (MDP-H-05);
- ``drop-partial``: never forwards a PARTIAL to the client (MDP-R-01);
- ``no-redispatch``: a request whose worker was lost is "re-dispatched" to nobody (MDP-S-01);
- ``slow-heartbeat``: heartbeats every second interval (MDP-H-04);
- ``no-dispatch-on-ready``: a worker's READY does not pick up requests already queued (MDP-C-10);
- ``no-dispatch-on-final``: a worker's FINAL does not pick up the next queued request (MDP-A-05);
- ``second-request-queued``: a second REQUEST on one client socket is queued as well (MDP-S-02);
- ``truncate-body``: forwards only the first body frame of a request (MDP-S-03);
- ``strip-empty-frames``: drops empty body frames from replies (MDP-S-03);
- ``cut-large-body``: cuts every body frame at 64 KiB (MDP-S-03);
- ``no-disconnect-on-unexpected``: never sends DISCONNECT (MDP-W-15);
- ``forward-stray-reply``: forwards a reply to the client it names, whoever sent it (MDP-D-10,
  MDP-D-13);
- ``heartbeat-expired``: keeps heartbeating workers it has expired (MDP-H-07);
- ``mmi-404-for-busy``: ``mmi.service`` says 404 while every worker of the service is busy
  (MDP-M-01);
- ``mmi-unknown-404``: an unknown ``mmi.*`` service gets 404, not 501 (MDP-M-02);
- ``register-mmi-ready``: registers a worker's READY for a reserved ``mmi.*`` name (MDP-D-14).
"""

from __future__ import annotations

import sys
import time

import zmq

from domo.protocol import Broker, BrokerConfig, mdp
from domo.protocol.errors import MalformedMessage

LARGE = 65536


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
    beats: dict[bytes, int] = {}
    dispatched: set[tuple[bytes, tuple[bytes, ...]]] = set()
    no_dispatch_to: set[bytes] = set()  # the worker whose input is being handled
    aliases: dict[bytes, bytes] = {}  # a second client identity -> the real one
    registered: set[bytes] = set()
    gone: set[bytes] = set()  # disconnected or invalid: not "expired"
    last_beat: dict[bytes, float] = {}

    def flush() -> None:
        for peer, out in broker.take_outgoing():
            frames = [bytes(f) for f in out]
            peer = aliases.get(peer, peer)
            if peer in forgotten:
                continue
            worker_cmd = frames[:2] if frames[:1] == [mdp.WORKER_HEADER] else []
            client_cmd = frames[:2] if frames[:1] == [mdp.CLIENT_HEADER] else []
            if worker_cmd == [mdp.WORKER_HEADER, mdp.W_HEARTBEAT]:
                if flaw == "no-heartbeat":
                    continue
                beats[peer] = beats.get(peer, 0) + 1
                if flaw == "slow-heartbeat" and beats[peer] % 2:
                    continue
            if worker_cmd == [mdp.WORKER_HEADER, mdp.W_DISCONNECT]:
                gone.add(peer)
                if flaw == "no-disconnect-on-unexpected":
                    continue
            if worker_cmd == [mdp.WORKER_HEADER, mdp.W_REQUEST]:
                client = aliases.get(frames[2], frames[2])
                frames[2] = client
                held[peer] = (client, service_of.get(peer, b""))
                key = (client, tuple(frames[4:]))
                if flaw == "no-redispatch" and key in dispatched:
                    continue
                dispatched.add(key)
                if peer in no_dispatch_to:
                    continue
                if flaw == "truncate-body":
                    frames = frames[:5]
            if client_cmd == [mdp.CLIENT_HEADER, mdp.C_PARTIAL] and flaw == "drop-partial":
                continue
            if client_cmd and flaw == "strip-empty-frames":
                frames = frames[:3] + ([f for f in frames[3:] if f] or [b""])
            if flaw == "cut-large-body":
                frames = [f[:LARGE] for f in frames]
            router.send_multipart([peer, *frames])
        broker.flushed()  # the events are not used; completed requests must not pile up

    while True:
        deadline = broker.next_deadline()
        timeout = 50 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        no_dispatch_to.clear()
        if router.poll(min(timeout, 50) + 1):
            peer, *frames = router.recv_multipart()
            now = time.monotonic()
            try:
                command = mdp.parse(frames)
            except MalformedMessage:
                if flaw == "die-on-garbage":
                    sys.exit(3)
                command = None
                gone.add(peer)
            if flaw == "early-expiry" and peer in broker.workers():
                if now - last_heard.get(peer, now) > 1.2 * interval:
                    forgotten.add(peer)
                last_heard[peer] = now
            if peer in forgotten:
                continue
            if flaw == "ignore-disconnect" and isinstance(command, mdp.WorkerDisconnect):
                continue
            if isinstance(command, mdp.WorkerDisconnect):
                gone.add(peer)
            if isinstance(command, mdp.WorkerReady):
                if flaw == "register-mmi-ready" and command.service.startswith(b"mmi."):
                    frames = [*frames[:2], b"as-" + command.service]  # the core would refuse it
                service_of[peer] = command.service
                last_heard[peer] = now
                registered.add(peer)
                gone.discard(peer)
                if flaw == "no-dispatch-on-ready":
                    no_dispatch_to.add(peer)
            if isinstance(command, mdp.WorkerFinal | mdp.WorkerPartial):
                holder = held.get(peer)
                if flaw == "forward-stray-reply" and (
                    holder is None or holder[0] != command.client
                ):
                    svc = service_of.get(peer, b"stray")
                    router.send_multipart(
                        [command.client, *mdp.client_final_frames(svc, command.body)]
                    )
            if isinstance(command, mdp.WorkerFinal):
                if flaw == "late-final" and peer not in broker.workers() and peer in held:
                    client, service = held.pop(peer)
                    router.send_multipart([client, *mdp.client_final_frames(service, command.body)])
                    continue
                held.pop(peer, None)
                if flaw == "no-dispatch-on-final":
                    no_dispatch_to.add(peer)
            if flaw == "busy-dispatch" and isinstance(command, mdp.ClientRequest):
                busy = [w for w, (_, s) in held.items() if s == command.service]
                if busy:
                    router.send_multipart([busy[0], *mdp.worker_request_frames(peer, command.body)])
                    continue
            if isinstance(command, mdp.ClientRequest) and command.service.startswith(b"mmi."):
                answer = None
                if flaw == "mmi-unknown-404" and command.service != b"mmi.service":
                    answer = b"404"
                name = command.body[0] if command.body else b""
                serving = [v for v in broker.workers().values() if v.service == name]
                if flaw == "mmi-404-for-busy" and serving and all(v.client for v in serving):
                    answer = b"404"
                if answer is not None:
                    router.send_multipart(
                        [peer, *mdp.client_final_frames(command.service, [answer])]
                    )
                    continue
            if (
                flaw == "second-request-queued"
                and isinstance(command, mdp.ClientRequest)
                and any(r.client == peer for r in broker.requests())
            ):
                alias = peer + b"#2"
                aliases[alias] = peer
                peer = alias
            broker.receive(peer, frames, max(now, broker.now))
        now = max(time.monotonic(), broker.now)
        broker.tick(now)
        flush()
        if flaw == "heartbeat-expired":
            live = broker.workers()
            for peer in registered - gone - set(live):
                if now - last_beat.get(peer, 0.0) >= interval:
                    router.send_multipart([peer, mdp.WORKER_HEADER, mdp.W_HEARTBEAT])
                    last_beat[peer] = now


if __name__ == "__main__":
    main()
