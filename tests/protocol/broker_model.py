"""An independent model of the MDP/0.2 broker, written from ``specs/mdp-0.2.md``.

The stateful test (``test_broker_stateful.py``) feeds the same inputs to this model and to the real
``Broker`` and compares every message and every event. The model shares no code with the broker
(it imports the event classes only to read them): it keeps its state in plain dicts and lists,
recomputes every deadline from scratch at every call (no heap, no lazy timers), validates frames
with its own few lines, and decides each transition with explicit ``if`` statements rather than
by reading ``WORKER_TRANSITIONS``. Where the two disagree, one of them is wrong about the spec.

What the model predicts for one call:

- ``out``: the messages, as ``Expected`` entries; only their order *per peer* is promised (the
  broker fires due timers in heap order, which the spec leaves open);
- ``events``: a multiset of event summaries (``summarize``), with the fields the spec fixes.

Time, as the spec has it: every call first brings the clock to ``now`` (MDP-D-03). At that instant
queued requests whose ``request_expiry`` has run out expire (MDP-D-11), silences that have lasted
``liveness * interval`` end (MDP-D-06), workers silent for ``liveness * interval`` expire (MDP-D-04)
and are sent nothing (MDP-D-07), every live worker sent nothing for a full interval gets a
HEARTBEAT (MDP-D-05), and only then do the requests of the expired workers go back to the front of
their queues, oldest first, and get dispatched (MDP-D-08, MDP-A-03).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from domo.protocol.events import (
    BrokerEvent,
    MessageDropped,
    MmiReplied,
    PartialForwarded,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    RequestRedispatched,
    RequestRefused,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)

W = b"MDPW02"
C = b"MDPC02"
# A body frame the broker relays may be a view of a received frame; every other frame is bytes.
Frame = bytes | memoryview
Frames = tuple[Frame, ...]
HEARTBEAT = (W, b"\x05")
DISCONNECT = (W, b"\x06")

# Violations that are about what a valid command means here, as opposed to how its frames look.
# A malformed message may carry any of the frame rules; the model only says "frame".
MEANING_RULES = frozenset(
    {"MDP-D-13", "MDP-D-14", "MDP-D-16", "MDP-H-01", "MDP-S-02", "MDP-W-10", "MDP-W-15"}
)

Summary = tuple[object, ...]


def summarize(event: BrokerEvent) -> Summary:
    """The fields of an event the model predicts (``at`` is checked separately)."""
    match event:
        case WorkerRegistered(worker, service, _):
            return ("registered", worker, service)
        case WorkerExpired(worker, service, last_heard, _):
            return ("expired", worker, service, last_heard)
        case WorkerDisconnected(worker, service, reason, sent, _):
            return ("disconnected", worker, service, reason, sent)
        case RequestQueued(rid, client, service, size, _):
            return ("queued", rid, client, service, size)
        case RequestDispatched(rid, client, service, worker, attempt, waited, _):
            return ("dispatched", rid, client, service, worker, attempt, waited)
        case RequestRedispatched(rid, client, service, lost, attempts, _):
            return ("redispatched", rid, client, service, lost, attempts)
        case PartialForwarded(rid, client, service, worker, size, _):
            return ("partial", rid, client, service, worker, size)
        case RequestCompleted(rid, client, service, worker, partials, size, elapsed, _):
            return ("completed", rid, client, service, worker, partials, size, elapsed)
        case RequestExpired(rid, client, service, waited, _):
            return ("request-expired", rid, client, service, waited)
        case RequestDropped(rid, client, service, reason, worker, _):
            return ("dropped", rid, client, service, reason, worker)
        case RequestRefused(client, service, reason, size, _, rule, _):
            return ("refused", client, service, reason, size, rule)
        case MmiReplied(client, service, query, status, _):
            return ("mmi", client, service, query, status)
        case MessageDropped(peer, _, _):
            return ("message-dropped", peer)
        case ProtocolViolation(peer, rule, _, action, _):
            return ("violation", peer, rule if rule in MEANING_RULES else "frame", action)
    raise AssertionError(f"an event the model does not know: {event!r}")


# --- frames, checked by the model's own reading of the spec ----------------------------------


def valid_service(name: bytes) -> bool:
    """MDP-D-01: 1 to 255 bytes, each printable ASCII."""
    return 1 <= len(name) <= 255 and all(0x20 <= byte <= 0x7E for byte in name)


def read_worker(frames: Frames) -> tuple[str, bytes, Frames]:
    """(command, service-or-address, body) of an MDPW02 message, or ("invalid", b"", ())."""
    invalid: tuple[str, bytes, Frames] = ("invalid", b"", ())
    control = [frame for frame in frames[:4] if isinstance(frame, bytes)]
    if len(frames) < 2 or len(control) < len(frames[:4]):  # MDP-W-08: only a body may be a view
        return invalid
    code = control[1]
    if code in (b"\x02", b"\x03", b"\x04"):  # REQUEST, PARTIAL, FINAL (MDP-W-02..04, MDP-R-02)
        if len(frames) < 5 or not 1 <= len(control[2]) <= 255 or control[3] != b"":
            return invalid
        name = {b"\x02": "REQUEST", b"\x03": "PARTIAL", b"\x04": "FINAL"}[code]
        return (name, control[2], frames[4:])
    if code == b"\x01":  # READY (MDP-W-01)
        if len(frames) != 3 or not valid_service(control[2]):
            return invalid
        return ("READY", control[2], ())
    if code in (b"\x05", b"\x06"):  # HEARTBEAT, DISCONNECT (MDP-W-05, MDP-W-06)
        if len(frames) != 2:
            return invalid
        return ("HEARTBEAT" if code == b"\x05" else "DISCONNECT", b"", ())
    return invalid


def read_client(frames: Frames) -> tuple[str, bytes, Frames]:
    """(command, service, body) of an MDPC02 message, or ("invalid", b"", ())."""
    control = [frame for frame in frames[:3] if isinstance(frame, bytes)]
    if len(frames) < 4 or len(control) < 3 or control[1] not in (b"\x01", b"\x02", b"\x03"):
        return ("invalid", b"", ())  # MDP-W-08: only a body may be a view
    if not valid_service(control[2]):
        return ("invalid", b"", ())
    name = {b"\x01": "REQUEST", b"\x02": "PARTIAL", b"\x03": "FINAL"}[control[1]]
    return (name, control[2], frames[3:])


# --- the model --------------------------------------------------------------------------------


@dataclass
class MWorker:
    service: bytes
    last_heard: float
    last_sent: float
    request: int | None = None


@dataclass
class MRequest:
    rid: int
    client: bytes
    service: bytes
    body: Frames
    received_at: float
    queued_at: float
    state: str = "queued"  # "queued" or "dispatched"
    worker: bytes | None = None
    attempts: int = 0
    partials: int = 0
    abandoned: bool = False  # its client is gone; its worker finishes, nothing is forwarded


@dataclass(frozen=True)
class Expected:
    """One message the broker must send; ``body_at`` is where the passed-through body starts."""

    peer: bytes
    frames: Frames
    body_at: int | None = None


@dataclass
class Model:
    interval: float
    liveness: int
    request_expiry: float
    max_redispatches: int
    now: float = float("-inf")
    workers: dict[bytes, MWorker] = field(default_factory=dict)  # in order of registration
    idle: dict[bytes, list[bytes]] = field(default_factory=dict)  # longest idle first
    queues: dict[bytes, list[int]] = field(default_factory=dict)
    silenced: dict[bytes, float] = field(default_factory=dict)  # peer -> end of its silence
    requests: dict[int, MRequest] = field(default_factory=dict)  # live, incl. abandoned
    clients: dict[bytes, int] = field(default_factory=dict)  # client -> outstanding request
    congested: dict[bytes, float] = field(default_factory=dict)  # peer -> refused until (D-29)
    last_rid: int = 0
    out: list[Expected] = field(default_factory=list)
    events: list[Summary] = field(default_factory=list)

    @property
    def span(self) -> float:
        return self.liveness * self.interval

    # -- views ---------------------------------------------------------------------------------

    def state(self, peer: bytes) -> str:
        worker = self.workers.get(peer)
        if worker is not None:
            return "IDLE" if worker.request is None else "BUSY"
        return "SILENCED" if peer in self.silenced else "UNKNOWN"

    def busy_workers(self) -> list[bytes]:
        return [p for p, w in self.workers.items() if w.request is not None]

    def outstanding(self) -> list[MRequest]:
        """Requests a client still waits for, in order of acceptance (not abandoned ones)."""
        return [self.requests[rid] for rid in sorted(self.clients.values())]

    def services(self) -> dict[bytes, tuple[int, int, int]]:
        """service -> (workers, idle, queued), for services with workers or a queue."""
        names = {w.service for w in self.workers.values()} | {
            s for s, q in self.queues.items() if q
        }
        return {
            name: (
                sum(1 for w in self.workers.values() if w.service == name),
                len(self.idle.get(name, [])),
                len(self.queues.get(name, [])),
            )
            for name in names
        }

    def deadlines(self) -> list[float]:
        """Every future time at which something is due, from scratch."""
        times = {until for until in self.silenced.values()}
        for w in self.workers.values():
            times.add(w.last_sent + self.interval)
            times.add(w.last_heard + self.span)
        for r in self.requests.values():
            if r.state == "queued":
                times.add(r.queued_at + self.request_expiry)
        return sorted(t for t in times if t > self.now)

    # -- outputs -------------------------------------------------------------------------------

    def send(self, peer: bytes, frames: Frames, body_at: int | None = None) -> None:
        worker = self.workers.get(peer)
        if worker is not None:  # MDP-D-05: anything sent to the peer, on its client side too
            worker.last_sent = self.now
        self.out.append(Expected(peer, frames, body_at))

    def send_worker(self, peer: bytes, frames: Frames, body_at: int | None = None) -> None:
        assert peer in self.workers
        self.send(peer, frames, body_at)

    def emit(self, *summary: object) -> None:
        self.events.append(summary)

    # -- time ----------------------------------------------------------------------------------

    def begin(self, now: float) -> None:
        """Start one call at ``now``: clear the outputs, then bring the clock to ``now``."""
        assert now >= self.now
        self.out = []
        self.events = []
        self.now = now
        for rid, r in list(self.requests.items()):
            if r.state == "queued" and r.queued_at + self.request_expiry <= now:
                self.queues[r.service].remove(rid)
                del self.requests[rid]
                del self.clients[r.client]
                self.emit("request-expired", rid, r.client, r.service, now - r.queued_at)
        for peer, until in list(self.silenced.items()):
            if until <= now:
                del self.silenced[peer]
        lost: list[tuple[MRequest, bytes]] = []
        for peer, w in list(self.workers.items()):
            if w.last_heard + self.span <= now:
                self.emit("expired", peer, w.service, w.last_heard)
                request = self._unregister(peer)
                if request is not None:
                    lost.append((request, peer))
                self.silenced[peer] = now + self.span
        for peer, w in self.workers.items():
            if w.last_sent + self.interval <= now:
                self.send_worker(peer, HEARTBEAT)
        lost.sort(key=lambda pair: pair[0].rid)
        for request, _ in reversed(lost):
            self._enqueue(request, front=True)
        for request, peer in lost:
            self.emit(
                "redispatched", request.rid, request.client, request.service, peer, request.attempts
            )
        for service in dict.fromkeys(r.service for r, _ in lost):
            self._dispatch(service)

    # -- requests and workers ------------------------------------------------------------------

    def _enqueue(self, request: MRequest, *, front: bool) -> None:
        request.state = "queued"
        request.queued_at = self.now
        queue = self.queues.setdefault(request.service, [])
        queue.insert(0, request.rid) if front else queue.append(request.rid)

    def _dispatch(self, service: bytes) -> None:
        queue = self.queues.get(service, [])
        idle = self.idle.get(service, [])
        while queue and idle:
            r = self.requests[queue.pop(0)]
            peer = idle.pop(0)
            r.state, r.worker, r.partials = "dispatched", peer, 0
            r.attempts += 1
            self.workers[peer].request = r.rid
            self.send_worker(peer, (W, b"\x02", r.client, b"", *r.body), body_at=4)
            self.emit(
                "dispatched", r.rid, r.client, service, peer, r.attempts, self.now - r.queued_at
            )

    def _end(self, r: MRequest, reason: str, worker: bytes | None) -> None:
        del self.requests[r.rid]
        del self.clients[r.client]
        self.emit("dropped", r.rid, r.client, r.service, reason, worker)

    def _unregister(self, peer: bytes) -> MRequest | None:
        """Remove a worker; returns its request if that request is to be re-dispatched."""
        w = self.workers.pop(peer)
        if w.request is None:
            self.idle[w.service].remove(peer)
            return None
        r = self.requests[w.request]
        r.worker = None
        if r.abandoned:
            del self.requests[r.rid]
        elif r.partials:
            self._end(r, "lost-after-partial", peer)  # MDP-D-09
        elif r.attempts > self.max_redispatches:
            self._end(r, "redispatch-limit", peer)  # MDP-D-08
        else:
            return r
        return None

    def _remove(self, peer: bytes, reason: str, *, disconnect_sent: bool) -> None:
        """Unregister outside the timers: a lost request goes back to the front at once."""
        service = self.workers[peer].service
        self.emit("disconnected", peer, service, reason, disconnect_sent)
        r = self._unregister(peer)
        if r is not None:
            self.emit("redispatched", r.rid, r.client, r.service, peer, r.attempts)
            self._enqueue(r, front=True)
            self._dispatch(r.service)

    def _silence(self, peer: bytes) -> None:
        self.silenced[peer] = self.now + self.span

    def _kick(self, peer: bytes, rule: str) -> None:
        """A valid but unexpected command: DISCONNECT, then silence (MDP-W-15)."""
        self.emit("violation", peer, rule, "disconnected")
        self.send(peer, DISCONNECT)
        if peer in self.workers:
            self._remove(peer, "unexpected-command", disconnect_sent=True)
        self._silence(peer)

    def _register(self, peer: bytes, service: bytes) -> None:
        self.silenced.pop(peer, None)
        self.workers[peer] = MWorker(service, self.now, self.now)
        self.idle.setdefault(service, []).append(peer)
        self.emit("registered", peer, service)
        self._dispatch(service)

    # -- inputs --------------------------------------------------------------------------------

    def receive(self, peer: bytes, frames: Frames) -> None:
        header = frames[0] if frames else None
        if header == W:
            self._worker_message(peer, read_worker(frames))
        elif header == C:
            self._client_message(peer, read_client(frames))
        elif peer in self.workers or peer in self.silenced:
            self._worker_message(peer, ("invalid", b"", ()))
        else:
            self.emit("violation", peer, "frame", "dropped")

    def _worker_message(self, peer: bytes, command: tuple[str, bytes, Frames]) -> None:
        name, arg, body = command
        state = self.state(peer)
        reserved = name == "READY" and arg.startswith(b"mmi.")
        if state in ("UNKNOWN", "SILENCED") and name == "READY":
            if reserved:
                self._kick(peer, "MDP-D-14")
            else:
                self._register(peer, arg)  # MDP-W-09, and a new conversation (MDP-D-06)
        elif state == "SILENCED":
            self.silenced[peer] = self.now + self.span  # MDP-D-06: dropped, silence extended
            self.emit("message-dropped", peer)
        elif state == "UNKNOWN":
            if name == "HEARTBEAT":
                self._kick(peer, "MDP-H-01")
            elif name in ("PARTIAL", "FINAL", "REQUEST"):
                self._kick(peer, "MDP-W-15")
            elif name == "DISCONNECT":
                self._silence(peer)  # MDP-W-12
            else:
                self.emit("violation", peer, "frame", "dropped")
                self._silence(peer)  # MDP-W-16
        elif name == "READY":
            self._kick(peer, "MDP-W-10")
        elif name == "HEARTBEAT":
            self.workers[peer].last_heard = self.now  # MDP-H-02
        elif name == "REQUEST":
            self._kick(peer, "MDP-W-15")
        elif name == "DISCONNECT":
            self._remove(peer, "worker-disconnect", disconnect_sent=False)  # MDP-W-13
            self._silence(peer)
        elif name == "invalid":
            self.emit("violation", peer, "frame", "dropped")
            self._remove(peer, "invalid-message", disconnect_sent=False)  # MDP-W-16
            self._silence(peer)
        else:
            self._reply(peer, name, arg, body)

    def _reply(self, peer: bytes, name: str, address: bytes, body: Frames) -> None:
        w = self.workers[peer]
        if w.request is None:
            self._kick(peer, "MDP-W-15")
            return
        r = self.requests[w.request]
        if r.client != address:
            self._kick(peer, "MDP-D-13")
            return
        w.last_heard = self.now
        size = sum(map(len, body))
        code = b"\x02" if name == "PARTIAL" else b"\x03"
        if name == "PARTIAL":
            if r.abandoned:
                self.emit("message-dropped", peer)
                return
            r.partials += 1
            self.send(r.client, (C, code, r.service, *body), body_at=3)
            self.emit("partial", r.rid, r.client, r.service, peer, size)
            return
        w.request = None
        del self.requests[r.rid]
        if r.abandoned:
            self.emit("message-dropped", peer)
        else:
            del self.clients[r.client]
            self.send(r.client, (C, code, r.service, *body), body_at=3)
            elapsed = self.now - r.received_at
            self.emit("completed", r.rid, r.client, r.service, peer, r.partials, size, elapsed)
        self.idle.setdefault(w.service, []).append(peer)
        self._dispatch(w.service)

    def _client_message(self, peer: bytes, command: tuple[str, bytes, Frames]) -> None:
        name, service, body = command
        if name == "invalid":
            self.emit("violation", peer, "frame", "dropped")
        elif name != "REQUEST":
            self.emit("violation", peer, "MDP-D-16", "dropped")
        elif peer in self.clients:
            self.emit("violation", peer, "MDP-S-02", "dropped")
        elif service.startswith(b"mmi."):
            query = bytes(body[0])  # a body frame, so it may be a view
            if service == b"mmi.service":
                served = any(w.service == query for w in self.workers.values())
                status = b"200" if served else b"404"  # MDP-M-01
            else:
                status = b"501"  # MDP-M-02
            self.send(peer, (C, b"\x03", service, status))
            self.emit("mmi", peer, service, query, status)
        elif self.now < self.congested.get(peer, float("-inf")):  # MDP-D-29
            size = sum(map(len, body))
            self.emit("refused", peer, service, "client-congested", size, "MDP-D-29")
        else:
            self.last_rid += 1
            r = MRequest(self.last_rid, peer, service, body, self.now, self.now)
            self.requests[r.rid] = r
            self.clients[peer] = r.rid
            self.emit("queued", r.rid, peer, service, sum(map(len, body)))
            self._enqueue(r, front=False)
            self._dispatch(service)

    def feedback(self, peer: bytes, kind: str) -> None:
        """``peer_unreachable`` (kind "unreachable") or ``peer_congested`` ("congested")."""
        if kind == "congested":
            self.congested[peer] = self.now + self.span  # MDP-D-29
        if peer in self.workers:
            self._remove(peer, kind, disconnect_sent=False)  # MDP-D-15
            self._silence(peer)
        rid = self.clients.get(peer)
        if rid is None:
            return
        r = self.requests[rid]
        reason = f"client-{kind}"
        if r.state == "queued":
            self.queues[r.service].remove(rid)
            self._end(r, reason, None)
        else:
            r.abandoned = True
            del self.clients[peer]
            self.emit("dropped", r.rid, r.client, r.service, reason, r.worker)
