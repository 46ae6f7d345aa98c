"""A deliberately wrong broker: domo's sans-IO ``Broker`` on a ROUTER, with one behaviour altered.

``python planted_broker.py FLAW INTERVAL LIVENESS [DIALECT]`` binds tcp://127.0.0.1 on a free
port, prints the endpoint on stdout and serves until killed. DIALECT (``mdp02``, the default,
``mdp01`` or ``majortomo``) is the framing its peers speak: each message is put into MDP/0.2's
frames on the way in and back into the peer's on the way out (written here from
specs/mdp-0.1.md and specs/majortomo.md), so that every flaw below can be planted in every
dialect. FLAW is one of:

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
- ``forward-stray-reply``: forwards a reply to the client it names, whoever sent it (MDP-W-15,
  MDP-D-13, MDP-D-10);
- ``heartbeat-expired``: keeps heartbeating workers it has expired (MDP-H-07);
- ``mmi-404-for-busy``: ``mmi.service`` says 404 while every worker of the service is busy
  (MDP-M-01);
- ``mmi-unknown-404``: an unknown ``mmi.*`` service gets 404, not 501 (MDP-M-02);
- ``register-mmi-ready``: registers a worker's READY for a reserved ``mmi.*`` name (MDP-D-14);
- ``mmi-stale-200``: ``mmi.service`` says 200 for every service that ever had a worker
  (MDP-M-01);
- ``disconnect-answers-disconnect``: answers a worker's DISCONNECT with a DISCONNECT (MDP-W-13);
- ``newest-first``: a queued request waits until no newer one of its service does: the newest
  is served first (MDP-A-03);
- ``no-heartbeat-busy``: sends no HEARTBEAT to a worker while it holds a request (MDP-H-04);
- ``reply-to-other-client``: a worker's reply goes to the client that sent a request before
  its own, when there is one (MDP-R-03);
- ``partial-as-final``: forwards a PARTIAL as a FINAL (MDP-R-01);
- ``redispatch-after-partial``: a request whose worker is lost after a PARTIAL was forwarded is
  dispatched again (MDP-D-09);
- ``ready-again-ignored``: a READY from a registered worker is ignored, no DISCONNECT
  (MDP-W-10);
- ``heartbeat-first-ignored``: a HEARTBEAT before READY is ignored, no DISCONNECT (MDP-H-01);
- ``mdp01-heartbeat-no-delimiter`` (DIALECT mdp01): an MDP/0.1 worker's HEARTBEAT lacks its
  leading empty frame (MDP01-02);
- ``mdp01-reply-in-mdp02``: an MDP/0.1 client's reply goes out in MDP/0.2's client framing
  (MDP01-03);
- ``maj-final-with-service`` (DIALECT majortomo): a majortomo client's FINAL keeps the service
  frame (MAJ-04);
- ``maj-request-without-delimiter``: a majortomo worker's REQUEST lacks its leading empty frame
  (MAJ-01).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import zmq

from domo.protocol import Broker, BrokerConfig, mdp
from domo.protocol.errors import MalformedMessage

LARGE = 65536
READY_FLAWS = ("ready-again-ignored",)
_W01 = {
    b"\x01": mdp.W_READY,
    b"\x03": mdp.W_FINAL,
    b"\x04": mdp.W_HEARTBEAT,
    b"\x05": mdp.W_DISCONNECT,
}
_W02_TO_01 = {mdp.W_REQUEST: b"\x02", mdp.W_HEARTBEAT: b"\x04", mdp.W_DISCONNECT: b"\x05"}


class Framing:
    """Each peer's dialect, learnt from its messages; MDP/0.2 frames in, the peer's out."""

    def __init__(self, dialect: str, flaw: str) -> None:
        self.dialect = dialect
        self.flaw = flaw

    def inward(self, frames: list[bytes]) -> list[bytes]:
        if self.dialect == "mdp01" and frames[:2] == [b"", b"MDPW01"] and len(frames) > 2:
            return [mdp.WORKER_HEADER, _W01.get(frames[2], b"\x7f"), *frames[3:]]
        if self.dialect == "mdp01" and frames[:2] == [b"", b"MDPC01"]:
            return [mdp.CLIENT_HEADER, mdp.C_REQUEST, *frames[2:]]
        if self.dialect == "majortomo" and frames[:2] == [b"", mdp.CLIENT_HEADER]:
            if frames[2:3] == [b"\x02"]:
                return [mdp.CLIENT_HEADER, mdp.C_REQUEST, *frames[3:]]
            return frames[1:]
        if self.dialect == "majortomo" and frames[:1] == [b""]:
            return frames[1:]
        return frames  # malformed in the dialect: the core says so

    def outward(self, frames: list[bytes]) -> list[bytes] | None:
        """The peer's framing of ``frames``; None: not sent (MDP/0.1 has no PARTIAL)."""
        if self.dialect == "mdp02":
            return frames
        worker = frames[0] == mdp.WORKER_HEADER
        if self.dialect == "mdp01":
            if worker:
                out = [b"", b"MDPW01", _W02_TO_01[frames[1]], *frames[2:]]
                if self.flaw == "mdp01-heartbeat-no-delimiter" and frames[1] == mdp.W_HEARTBEAT:
                    return out[1:]
                return out
            if frames[1] == mdp.C_PARTIAL:
                return None  # MDP01-05
            if self.flaw == "mdp01-reply-in-mdp02":
                return frames
            return [b"", b"MDPC01", *frames[2:]]
        if worker:
            if self.flaw == "maj-request-without-delimiter" and frames[1] == mdp.W_REQUEST:
                return frames
            return [b"", *frames]
        code = b"\x03" if frames[1] == mdp.C_PARTIAL else b"\x04"
        if self.flaw == "maj-final-with-service" and code == b"\x04":
            return [b"", mdp.CLIENT_HEADER, code, *frames[2:]]
        return [b"", mdp.CLIENT_HEADER, code, *frames[3:]]


def main() -> None:
    flaw, interval, liveness = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    framing = Framing(sys.argv[4] if len(sys.argv) > 4 else "mdp02", flaw)
    broker = Broker(BrokerConfig(heartbeat_interval=interval, liveness=liveness))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    print(router.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    held: dict[bytes, tuple[bytes, bytes]] = {}  # worker -> (client, service) of its request
    holding: dict[bytes, tuple[bytes, bytes, tuple[bytes, ...]]] = {}  # worker -> its request
    partial_seen: set[bytes] = set()  # workers whose request had a PARTIAL forwarded
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
    ever_served: set[bytes] = set()
    waiting: dict[bytes, list[tuple[bytes, list[bytes]]]] = {}  # newest-first: service -> held
    clients_seen: list[bytes] = []  # in order of their first request
    changed: list[bool] = []  # newest-first: a worker may have become idle, or a request came

    def send(peer: bytes, frames: Sequence[bytes]) -> None:
        out = framing.outward([bytes(f) for f in frames])
        if out is not None:
            router.send_multipart([peer, *out])

    def flush() -> None:
        for peer, out in broker.take_outgoing():
            frames = [bytes(f) for f in out]
            peer = aliases.get(peer, peer)
            if peer in forgotten:
                continue
            worker_cmd = frames[:2] if frames[:1] == [mdp.WORKER_HEADER] else []
            client_cmd = frames[:2] if frames[:1] == [mdp.CLIENT_HEADER] else []
            if worker_cmd == [mdp.WORKER_HEADER, mdp.W_HEARTBEAT]:
                if flaw == "no-heartbeat" or (flaw == "no-heartbeat-busy" and peer in held):
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
                holding[peer] = (client, service_of.get(peer, b""), tuple(frames[4:]))
                partial_seen.discard(peer)
                key = (client, tuple(frames[4:]))
                if flaw == "no-redispatch" and key in dispatched:
                    continue
                dispatched.add(key)
                if peer in no_dispatch_to:
                    continue
                if flaw == "truncate-body":
                    frames = frames[:5]
            if client_cmd == [mdp.CLIENT_HEADER, mdp.C_PARTIAL]:
                if flaw == "drop-partial":
                    continue
                partial_seen.update(w for w, (c, _) in held.items() if c == peer)
                if flaw == "partial-as-final":
                    frames[1] = mdp.C_FINAL
            if client_cmd and flaw == "reply-to-other-client" and peer in clients_seen:
                before = clients_seen[: clients_seen.index(peer)]
                if before and not frames[2].startswith(b"mmi."):
                    peer = before[-1]
            if client_cmd and flaw == "strip-empty-frames":
                frames = frames[:3] + ([f for f in frames[3:] if f] or [b""])
            if flaw == "cut-large-body":
                frames = [f[:LARGE] for f in frames]
            send(peer, frames)
        broker.flushed()  # the events are not used; completed requests must not pile up

    def lost_workers(now: float) -> None:
        """redispatch-after-partial: a lost worker's request that had a PARTIAL goes back."""
        live = broker.workers()
        for peer in list(holding):
            if peer in live and live[peer].client is not None:
                continue
            client, service, body = holding.pop(peer)
            if flaw == "redispatch-after-partial" and peer in partial_seen and peer not in live:
                broker.receive(client, mdp.client_request_frames(service, list(body)), now)
            partial_seen.discard(peer)

    def release_newest(now: float) -> None:
        """newest-first: a held request goes in (newest first) once a worker is idle for it."""
        if not (waiting and changed):
            return
        changed.clear()
        idle = {v.service for v in broker.workers().values() if v.client is None}
        for service in [s for s in waiting if s in idle]:
            queue = waiting[service]
            while queue and service in idle:
                peer, frames = queue.pop()
                broker.receive(peer, frames, max(now, broker.now))
                flush()
                idle = {v.service for v in broker.workers().values() if v.client is None}
            if not queue:
                del waiting[service]

    while True:
        deadline = broker.next_deadline()
        timeout = 50 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        no_dispatch_to.clear()
        # Everything that has arrived is read before the timers run: a plant that
        # woke late (a loaded machine) would otherwise expire workers whose
        # HEARTBEATs wait unread, and the search blame the plant's harness (MDP-A-01).
        wait, batch = min(timeout, 50) + 1, 0
        while batch < 1000 and router.poll(wait):
            if batch:
                flush()  # the one before, with its no_dispatch_to
                no_dispatch_to.clear()
            wait, batch = 0, batch + 1
            peer, *wire = router.recv_multipart()
            frames = framing.inward(wire)
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
                if flaw == "disconnect-answers-disconnect":
                    send(peer, [mdp.WORKER_HEADER, mdp.W_DISCONNECT])
                gone.add(peer)
            ignored = {
                "ready-again-ignored": mdp.WorkerReady,
                "heartbeat-first-ignored": mdp.WorkerHeartbeat,
            }
            # READY again from a registered worker, HEARTBEAT from an unknown peer.
            known = peer in broker.workers()
            if isinstance(command, ignored.get(flaw, ())) and known == (flaw in READY_FLAWS):
                continue
            if isinstance(command, mdp.WorkerReady):
                if flaw == "register-mmi-ready" and command.service.startswith(b"mmi."):
                    frames = [*frames[:2], b"as-" + command.service]  # the core would refuse it
                service_of[peer] = command.service
                ever_served.add(command.service)
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
                    send(command.client, mdp.client_final_frames(svc, command.body))
            if isinstance(command, mdp.WorkerFinal):
                if flaw == "late-final" and peer not in broker.workers() and peer in held:
                    client, service = held.pop(peer)
                    send(client, mdp.client_final_frames(service, command.body))
                    continue
                held.pop(peer, None)
                holding.pop(peer, None)
                if flaw == "no-dispatch-on-final":
                    no_dispatch_to.add(peer)
            if isinstance(command, mdp.WorkerReady | mdp.WorkerFinal | mdp.ClientRequest):
                changed.append(True)
            if isinstance(command, mdp.ClientRequest) and peer not in clients_seen:
                clients_seen.append(peer)
            if flaw == "busy-dispatch" and isinstance(command, mdp.ClientRequest):
                busy = [w for w, (_, s) in held.items() if s == command.service]
                if busy:
                    send(busy[0], mdp.worker_request_frames(peer, command.body))
                    continue
            if isinstance(command, mdp.ClientRequest) and command.service.startswith(b"mmi."):
                answer = None
                if flaw == "mmi-unknown-404" and command.service != b"mmi.service":
                    answer = b"404"
                name = command.body[0] if command.body else b""
                serving = [v for v in broker.workers().values() if v.service == name]
                if flaw == "mmi-404-for-busy" and serving and all(v.client for v in serving):
                    answer = b"404"
                if flaw == "mmi-stale-200" and command.service == b"mmi.service":
                    answer = b"200" if name in ever_served else None
                if answer is not None:
                    send(peer, mdp.client_final_frames(command.service, [answer]))
                    continue
            if (
                flaw == "newest-first"
                and isinstance(command, mdp.ClientRequest)
                and not command.service.startswith(b"mmi.")
                and not any(r.client == peer for r in broker.requests())
            ):
                waiting.setdefault(command.service, []).append((peer, frames))
                release_newest(now)
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
        lost_workers(now)
        if flaw == "newest-first":
            release_newest(now)
        flush()
        if flaw == "heartbeat-expired":
            live = broker.workers()
            for peer in registered - gone - set(live):
                if now - last_beat.get(peer, 0.0) >= interval:
                    send(peer, [mdp.WORKER_HEADER, mdp.W_HEARTBEAT])
                    last_beat[peer] = now


if __name__ == "__main__":
    main()
