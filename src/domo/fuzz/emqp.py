"""``domo fuzz --dialect emqp``: random eMQP/1.0 scenarios against a live broker.

eMQP (``specs/emqp-1.0.md``) differs from MDP/0.2 on purpose (a READY is one single-use credit,
requests carry MSGIDs, a client gets a receipt and, when it asks, a result, the broker speaks
HEARTBEAT first), so it is not played through the MDP fuzzer's broker target. This is a search
of its own, like ``domo.fuzz.memo01``: each scenario, drawn from a seeded ``random.Random``,
starts hand-framed eMQP workers and clients (ZeroMQ DEALERs with ASCII routing ids, as EventMQ's
peers have) and plays random steps: INFORM with weighted queues, READY credits, REQUESTs with
MSGIDs, queues and headers (``reply-requested``, ``timeout:N``, ``retry-count:N``,
``guarantee``), REPLYs, HEARTBEATs, KBYE/KBAI/DISCONNECT, silence, a second INFORM, a worker lost
while it holds jobs and another is free on their queue (EMQP-14), MMI, and
near misses: malformed INFORMs, REQUESTs and MSGIDs, unknown commands, SCHEDULE, PUBLISH, a
READY from a stranger, more credits than allowed. After each near miss a fresh worker and client
check that the broker still serves.

Everything that comes back is judged against an independent model of what the spec requires,
nothing else (where EventMQ 0.3.13 differs from the seed, the spec's rule is the judge):

- safety, on every message: a worker gets a REQUEST only with a free credit (EMQP-06, EMQP-07),
  only for one of its queues (EMQP-22), only for a request a client sent and the broker did not
  refuse (EMQP-02, EMQP-08, EMQP-09, EMQP-17, EMQP-25), with the client's frames unchanged
  (EMQP-10, EMQP-26), once unless its worker was lost (EMQP-12, EMQP-14), never after it left
  or was forgotten (EMQP-04, EMQP-15, EMQP-16); a client gets one receipt per request handed
  to a worker (EMQP-11) and a result only when it asked, with the worker's bytes (EMQP-12);
- what must arrive, within a window derived from the heartbeat interval: ACK (EMQP-03),
  DISCONNECT for a refused INFORM (EMQP-04), the broker's HEARTBEATs (EMQP-15), each request
  that meets a free credit on its queue (EMQP-10; again after its worker is lost, EMQP-14), its
  receipt (EMQP-11), its result (EMQP-12), a refusal's answer (EMQP-09, EMQP-17), MMI's status
  (EMQP-25).

A broken rule is an ``EmqpFinding`` with its rule id, the seed and scenario number that repeat
it, and the number of scenarios that broke it. A broker that stops serving after a near miss
ends the run (``EmqpFuzzResult.stopped``): nothing more can be judged. ``malformed=False``
leaves the near misses out, so that such a broker can still be checked on the rest.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import zmq

from .engine import Outcome, Violation, search
from .jitter import JitterMeter
from .scenario import Step

__all__ = ["EmqpFinding", "EmqpFuzzResult", "EmqpPlanner", "fuzz_emqp", "replay_emqp"]

EMQP = b"eMQP/1.0"
MAX_CREDITS = 64  # EMQP-06: free slots one worker may hold
MAX_QUEUES = 16  # EMQP-03
QUEUE_NAMES = ("q0", "q1", "q2")
STEPS_PER_SCENARIO = 9


@dataclass(frozen=True)
class EmqpFinding:
    """A rule the broker broke, and the smallest plan found that breaks it."""

    rule: str
    explanation: str
    seed: int
    scenario: int
    scenarios: int = 1  # how many scenarios of the run broke it
    steps: tuple[Step, ...] = ()  # the plan: replay_emqp plays it again


@dataclass(frozen=True)
class EmqpFuzzResult:
    """What ``fuzz_emqp`` ran and found."""

    scenarios: int
    seconds: float
    seed: int
    findings: tuple[EmqpFinding, ...]
    stopped: str | None = None  # why the run ended early: the broker stopped serving
    steps: dict[str, int] = field(default_factory=dict)  # how often each kind of step ran
    judged: Counter[str] = field(default_factory=Counter)  # rule -> scenarios that judged it
    held: Counter[str] = field(default_factory=Counter)  # rule -> ... in which it held
    rules: tuple[str, ...] = ()  # the rules the search can judge


class _Found(Exception):
    """A violation that leaves the model unable to go on with the scenario."""

    def __init__(self, rule: str, explanation: str) -> None:
        super().__init__(explanation)
        self.rule = rule


class _Stopped(Exception):
    """The broker no longer serves: the run ends."""

    def __init__(self, rule: str, explanation: str) -> None:
        super().__init__(explanation)
        self.rule = rule


# -- the model's peers ---------------------------------------------------------------------------


@dataclass(eq=False)
class _Request:
    """One message a client sent that the broker must route, refuse or drop."""

    msgid: bytes
    client: _Client
    queue: bytes
    headers: bytes
    body: tuple[bytes, ...]
    reply: bool
    sent_at: float
    kind: str = "job"  # job, refused (EMQP-09/17: an error REPLY), mmi, dropped (no answer)
    rule: str = "EMQP-10"  # the rule its dispatch (or answer) is owed by
    mmi_status: bytes | None = None  # EMQP-25: the status owed, where the spec decides it
    status: str = "waiting"  # waiting, held, replied, done, tainted
    queued_at: float = 0.0
    holder: _Worker | None = None
    deliveries: int = 0
    delivered_at: float | None = None
    receipts: int = 0
    results: int = 0
    answers: int = 0
    result: bytes | None = None  # what its worker answered
    replied_at: float | None = None
    requeued: int = 0
    duplicate_sent: bool = False
    receipt_at: float | None = None
    flagged: set[str] = field(default_factory=set)


@dataclass(eq=False)
class _Peer:
    name: str
    socket: zmq.Socket[bytes]
    probe: bool = False  # a liveness probe's peer: its obligations are the probe's to judge
    closed: bool = False  # its scenario is over: nothing can reach it


@dataclass(eq=False)
class _Client(_Peer):
    pass


@dataclass(eq=False)
class _Worker(_Peer):
    queues: tuple[bytes, ...] = ()
    state: str = "new"  # new, informing, ready, refusing, refused, silent, lost, stranger
    inform_msgid: bytes = b""
    informed_at: float = 0.0
    acked_at: float | None = None
    last_heartbeat: float | None = None  # the broker's last HEARTBEAT to it
    heartbeat_flagged: bool = False
    next_beat: float = 0.0  # when it sends its own next HEARTBEAT
    credits: int = 0
    credit_at: float = 0.0
    readies: int = 0  # READYs since its INFORM
    dropped_credits: str | None = None  # the rule that withdrew credits it had (EMQP-05)
    stray: str | None = None  # the rule of a message it sent that must not be a credit
    old_queues: set[bytes] = field(default_factory=set)  # of its earlier INFORMs (EMQP-05)
    held: list[_Request] = field(default_factory=list)
    lost_at: float | None = None
    lost_rule: str = "EMQP-16"  # "": lost by the fuzzer's own fault, not judged
    last_sent: float = float("inf")  # when it last sent anything
    refused_at: float = 0.0


class _Scenario:
    """One scenario's peers and model; ``run`` holds what outlives it (requests, findings)."""

    def __init__(self, run: _Run, tag: str, rng: random.Random) -> None:
        self.run = run
        self.rng = rng
        self.tag = tag
        self.judged: set[str] = set()  # the rules a check had something to judge (coverage)
        # The broker's "default" queue is every such scenario's: one of them runs at a time.
        self.shares_default = False
        self.workers: list[_Worker] = []
        self.clients: list[_Client] = []
        self.broken: dict[str, str] = {}
        self.queues = tuple(f"{self.tag}{q}".encode() for q in QUEUE_NAMES)
        self.counter = 0

    # -- sockets -------------------------------------------------------------------------------

    def _socket(self, name: str, endpoint: str) -> zmq.Socket[bytes]:
        socket = self.run.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        # EventMQ's router decodes every frame, the routing id too: ASCII, as its peers use.
        socket.setsockopt(zmq.ROUTING_ID, f"{name}-{self.run.nonce}".encode())
        socket.connect(endpoint)
        self.run.poller.register(socket, zmq.POLLIN)
        return socket

    def new_worker(self, probe: bool = False) -> _Worker:
        name = f"{self.tag}w{len(self.workers)}"
        worker = _Worker(name, self._socket(name, self.run.workers_endpoint), probe=probe)
        self.workers.append(worker)
        return worker

    def new_client(self, probe: bool = False) -> _Client:
        name = f"{self.tag}c{len(self.clients)}"
        client = _Client(name, self._socket(name, self.run.clients_endpoint), probe=probe)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for peer in [*self.workers, *self.clients]:
            self.run.poller.unregister(peer.socket)
            peer.socket.close(linger=0)
            peer.closed = True

    def msgid(self) -> bytes:
        self.counter += 1
        return f"{self.run.nonce}-{self.tag}-{self.counter}".encode()

    def send(self, peer: _Peer, command: bytes, *body: bytes, msgid: bytes | None = None) -> bytes:
        ident = self.msgid() if msgid is None else msgid
        peer.socket.send_multipart([b"", EMQP, command, ident, *body])
        if isinstance(peer, _Worker):
            peer.last_sent = self.now()
        return ident

    # -- judging -------------------------------------------------------------------------------

    def violate(self, rule: str, explanation: str, peer: _Peer | None = None) -> None:
        """A broken rule the model can go on after (the first explanation per rule is kept)."""
        if peer is not None and peer.probe:
            return  # the probe judges its own peers
        self.judged.add(rule)
        self.broken.setdefault(rule, explanation)

    def judge(self, *rules: str) -> None:
        """These rules' checks had something to judge in this scenario (coverage)."""
        self.judged.update(rules)

    def now(self) -> float:
        return time.monotonic()

    # -- what comes back -----------------------------------------------------------------------

    def pump(
        self, longest: float, shortest: float = 0.02, until: Callable[[], bool] | None = None
    ) -> None:
        """Read, send the workers' heartbeats and judge for up to ``longest`` seconds, or less
        (after ``shortest``) once nothing is owed any more, or ``until`` says so."""
        started = self.now()
        wait = 0
        while True:
            self._drain(wait)
            wait = 10
            # Judged only once all that arrived is read: a late reader is not a late broker.
            now = self.now()
            self._beat(now)
            pending = self._owed(now)
            done = until() if until is not None else not pending
            if now - started >= longest or (now - started >= shortest and done):
                return

    def _drain(self, wait_ms: int) -> None:
        """Read every message that has arrived (waiting up to ``wait_ms`` for the first); how
        late a wait that timed out returned is a jitter sample."""
        planned = self.now() + wait_ms / 1000
        ready = self.run.poller.poll(wait_ms)
        if not ready:
            self.run.meter.wake(planned + 0.001, self.now())
        else:
            self._forsake(self.now())
        while ready:
            for socket, _ in ready:
                while True:
                    try:
                        frames = socket.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._receive(socket, frames)
            ready = self.run.poller.poll(0)

    def _forsake(self, now: float) -> None:
        """Drop from the judging each worker this process was too slow to heartbeat in time (a
        loaded machine): the broker may rightly have forgotten it and given its jobs to
        another. Done before what arrived is read, so that such a job is not judged either."""
        for worker in self.workers:
            if worker.state not in ("informing", "ready"):
                continue
            if now - worker.last_sent > self.run.span * 0.8:
                worker.state, worker.lost_rule, worker.credits = "lost", "", 0
                worker.lost_at = now
                for request in worker.held:
                    request.status = "tainted"

    def _beat(self, now: float) -> None:
        self._forsake(now)
        for worker in self.workers:
            if worker.state not in ("informing", "ready"):
                continue
            if now >= worker.next_beat:
                self.send(worker, b"HEARTBEAT", b"%.3f" % time.time())
                worker.next_beat = now + self.run.interval

    def _receive(self, socket: zmq.Socket[bytes], frames: list[bytes]) -> None:
        peer = next((p for p in [*self.workers, *self.clients] if p.socket is socket), None)
        if peer is None:
            return
        if len(frames) < 4 or frames[0] != b"" or frames[1] != EMQP:
            self.violate("EMQP-01", f"{peer.name} got a message not framed as eMQP: {frames!r}")
            return
        command, ident = frames[2], frames[3]
        if not peer.probe:
            self.judge("EMQP-01", "EMQP-02", *(("EMQP-19",) if isinstance(peer, _Worker) else ()))
        if command != b"REQUEST":  # a forwarded REQUEST carries its client's MSGID (EMQP-10)
            if not ident or ident in self.run.broker_ids:
                self.violate(
                    "EMQP-02", f"the broker sent {command!r} with MSGID {ident!r}, not unique"
                )
            self.run.broker_ids.add(ident)
        if isinstance(peer, _Worker):
            self._to_worker(peer, command, frames)
        else:
            assert isinstance(peer, _Client)
            self._to_client(peer, command, frames)

    def _to_worker(self, worker: _Worker, command: bytes, frames: list[bytes]) -> None:
        now = self.now()
        if command == b"ACK":
            if worker.state == "informing" and frames[4:] == [worker.inform_msgid]:
                worker.state = "ready"
                worker.acked_at = now
            elif worker.state in ("refusing", "refused"):
                self.violate(
                    "EMQP-04", f"{worker.name}'s INFORM should be refused, got ACK", worker
                )
            elif frames[4:] != [worker.inform_msgid]:
                self.violate(
                    "EMQP-03",
                    f"{worker.name} got ACK {frames[4:]!r}, not its INFORM's MSGID "
                    f"{worker.inform_msgid!r}",
                    worker,
                )
        elif command == b"HEARTBEAT":
            if not worker.probe:
                self.judge("EMQP-15")
            if worker.last_heartbeat is not None:
                self.run.meter.heartbeat_gap(worker, now - worker.last_heartbeat, now)
            worker.last_heartbeat = now
            self.run.last_any_heartbeat = now
        elif command == b"DISCONNECT":
            if worker.state == "refusing":
                worker.state = "refused"
            elif worker.state not in ("refused", "lost", "silent"):
                self.violate(
                    "EMQP-04",
                    f"{worker.name} ({worker.state}) got DISCONNECT; the broker sends it only to "
                    "refuse an INFORM",
                    worker,
                )
                self._lose(worker, now, "EMQP-04")
        elif command == b"KBYE":
            self.violate("EMQP-19", f"{worker.name} got KBYE while the broker runs", worker)
        elif command == b"REQUEST":
            self._delivered(worker, frames, now)
        else:
            self.violate("EMQP-01", f"{worker.name} got an unknown command {command!r}", worker)

    def _delivered(self, worker: _Worker, frames: list[bytes], now: float) -> None:
        msgid = frames[3] if len(frames) > 3 else b""
        request = self.run.requests.get(msgid)
        if request is None:
            if not msgid.startswith(self.run.nonce.encode()):
                return  # another run's request, left waiting in the broker
            raise _Found("EMQP-10", f"{worker.name} got a REQUEST no client sent: {frames!r}")
        if not worker.probe:
            self.judge("EMQP-06", "EMQP-07", "EMQP-10", "EMQP-22", "EMQP-26")
            if request.deliveries:
                self.judge("EMQP-12" if not request.reply else "EMQP-14")
            if request.duplicate_sent:
                self.judge("EMQP-08")
            if worker.lost_rule and worker.state in ("lost", "silent"):
                self.judge(worker.lost_rule)
        where = f"{worker.name} (queues {b','.join(worker.queues).decode()})"
        what = f"REQUEST {msgid.decode(errors='replace')} for {request.queue!r}"
        problems: list[tuple[str, str]] = []
        if request.status != "tainted":
            if request.kind != "job":
                why = {
                    "EMQP-25": "an mmi.* question is the broker's to answer",
                    "EMQP-08": "its MSGID was outstanding",
                    "EMQP-02": "its MSGID is not valid",
                    "EMQP-09": "it should be refused",
                    "EMQP-17": "it should be refused",
                }.get(request.rule, "it should not be dispatched")
                problems.append((request.rule, f"{where} got {what}: {why}"))
            sent = [request.queue, request.headers, *request.body]
            if frames[4:] != sent:
                rule = (
                    "EMQP-26" if frames[4:5] == sent[:1] and frames[5:6] != sent[1:2] else "EMQP-10"
                )
                problems.append((rule, f"{where} got {what} as {frames[4:]!r}, sent as {sent!r}"))
            if request.queue in worker.old_queues - set(worker.queues):
                problems.append(
                    ("EMQP-05", f"{where} got {what}, a queue of its INFORM before the last")
                )
            elif request.queue not in worker.queues:
                problems.append(("EMQP-22", f"{where} got {what}, a queue it does not listen on"))
            if worker.state in ("lost", "silent") and worker.lost_at is not None:
                # Certainly after the broker had the KBYE (the way there and back), or the
                # silence (then one interval more: a broker may expire on its heartbeat tick).
                known = worker.lost_at + self.run.settle
                if worker.lost_rule == "EMQP-15":
                    known += self.run.interval
                if worker.lost_rule and now > known:
                    problems.append(
                        (
                            worker.lost_rule,
                            f"{where} got {what} {now - worker.lost_at:.2f} s after it "
                            + (
                                "left"
                                if worker.lost_rule == "EMQP-16"
                                else "went silent past the liveness span"
                            ),
                        )
                    )
            elif worker.state in ("refusing", "refused"):
                problems.append(("EMQP-04", f"{where} got {what} after its INFORM was refused"))
            elif worker.state in ("new", "stranger"):
                problems.append(("EMQP-06", f"{where} got {what} but never sent INFORM"))
            elif worker.credits <= 0:
                if worker.stray is not None:
                    rule, why = worker.stray, "after a message that is no READY (dropped)"
                elif worker.dropped_credits is not None:
                    rule, why = worker.dropped_credits, "on a credit of its previous INFORM"
                elif worker.readies > self.run.credits:
                    rule, why = "EMQP-06", f"on a READY beyond {self.run.credits} free slots"
                elif worker.readies:
                    rule, why = "EMQP-07", "with every credit spent (a slot does one request)"
                else:
                    rule, why = "EMQP-06", "without a READY"
                problems.append((rule, f"{where} got {what} {why}"))
            if request.deliveries and request.kind == "job":
                holder = request.holder
                live = holder is not None and holder.state in ("ready", "informing")
                # A request its holder gave back (lost, or INFORMed again: EMQP-05, EMQP-14)
                # waits again: its next dispatch is owed, not a duplicate's.
                back = request.status == "waiting" and request.requeued > 0
                if request.duplicate_sent and not back and (live or not request.reply):
                    problems.append(
                        ("EMQP-08", f"{where} got {what} again after its client resent the MSGID")
                    )
                elif not request.reply:
                    problems.append(
                        (
                            "EMQP-12",
                            f"{where} got {what} a second time; without reply-requested "
                            "a request is done once handed to a worker",
                        )
                    )
                elif (
                    request.status in ("held", "replied")
                    and holder is not None
                    and holder.state not in ("silent", "lost")  # forgotten, or gave it back
                ):
                    problems.append(
                        (
                            "EMQP-14",
                            f"{where} got {what}, already held by {holder.name}, which "
                            "was not lost",
                        )
                    )
        for rule, explanation in problems:
            self.violate(rule, explanation, worker)
        if problems:
            request.status = "tainted"
        # What the broker did, applied to the model so that it goes on from there.
        worker.credits = max(0, worker.credits - 1)
        request.deliveries += 1
        if request.delivered_at is None:
            request.delivered_at = now
        request.holder = worker
        if request.status == "waiting":
            request.status = "held" if request.reply else "done"
        if request.reply and request.status in ("held", "tainted"):
            worker.held.append(request)
        lost = worker.lost_at is not None and worker.state in ("lost", "silent")
        if lost and request.status == "held":
            # Given before the broker had the worker's KBYE or saw its silence (the settle
            # window, not judged): that gives it back at once, as every job it held (EMQP-14).
            if worker.lost_rule:
                self._requeue(worker, now)
            else:
                request.status = "tainted"

    def _to_client(self, client: _Client, command: bytes, frames: list[bytes]) -> None:
        if command != b"REPLY" or len(frames) not in (5, 6):
            self.violate("EMQP-01", f"{client.name} got {frames!r}", client)
            return
        request = self.run.requests.get(frames[-1])
        if request is None or request.client is not client:
            self.violate(
                "EMQP-11" if len(frames) == 5 else "EMQP-12",
                f"{client.name} got a REPLY for MSGID {frames[-1]!r}, which it never sent",
                client,
            )
            return
        if request.status == "tainted":
            return
        if not client.probe:
            kinds = {"refused": request.rule, "dropped": request.rule, "mmi": "EMQP-25"}
            self.judge("EMQP-11" if len(frames) == 5 else kinds.get(request.kind, "EMQP-12"))
        what = f"{client.name}'s request {request.msgid.decode(errors='replace')}"
        if len(frames) == 5:  # a receipt (EMQP-11)
            request.receipts += 1
            if request.receipt_at is None:
                request.receipt_at = self.now()
            if request.kind == "mmi":
                return  # not handed to a worker: the spec leaves a receipt open
            if request.kind != "job":
                self.violate(request.rule, f"{what} got a receipt; it should be refused", client)
            elif request.receipts > 1:
                self.violate("EMQP-11", f"{what} got {request.receipts} receipts", client)
            return
        body = frames[4]
        request.answers += 1
        if request.kind == "refused":
            if not _is_error(body):
                self.violate(request.rule, f"{what} was answered {body!r}, not an error", client)
            elif request.answers > 1:
                self.violate(request.rule, f"{what} was refused {request.answers} times", client)
        elif request.kind == "dropped":
            self.violate(request.rule, f"{what} got {body!r}; it should get no answer", client)
        elif request.kind == "mmi":
            if request.mmi_status is not None and body != request.mmi_status:
                self.violate(
                    "EMQP-25",
                    f"{what} (mmi.service {request.body[0]!r}) got {body!r}, "
                    f"not {request.mmi_status!r}",
                    client,
                )
        else:
            request.results += 1
            if not request.reply:
                self.violate("EMQP-12", f"{what} got result {body!r}; it asked none", client)
            elif request.result is None:
                self.violate(
                    "EMQP-12", f"{what} got result {body!r} before its worker answered", client
                )
            elif body != request.result:
                self.violate(
                    "EMQP-12",
                    f"{what} got {body!r}, its worker answered {request.result!r}",
                    client,
                )
            elif request.results > 1:
                self.violate("EMQP-12", f"{what} got its result {request.results} times", client)

    # -- what is owed --------------------------------------------------------------------------

    def _live_credit(self, queue: bytes, now: float) -> _Worker | None:
        """A worker with a free credit on ``queue`` for at least the settle window."""
        for worker in self.workers:
            if worker.state == "ready" and worker.credits > 0 and queue in worker.queues:
                return worker
        return None

    def _broker_stalled(self, now: float) -> bool:
        """Is the broker not running now? Its HEARTBEAT to an informed worker of this scenario
        is overdue (by more than the slack): judge nothing owed until it runs again. No
        evidence, no stall: a broker that has not heartbeated here is judged as it is."""
        beats = [
            w.last_heartbeat
            for w in self.workers
            if w.last_heartbeat is not None and w.state == "ready"
        ]
        late = self.run.interval + self.run.slack
        if bool(beats) and now - max(beats) > late:
            return True
        # Nothing heartbeated in this lane for that long, though the broker has before.
        last = self.run.last_any_heartbeat
        return (
            last is not None
            and now - last > late
            and any(w.state == "ready" and not w.probe for w in self.workers)
        )

    def _owed(self, now: float) -> list[str]:
        """Report what the broker owes and is overdue (once each); what it still owes."""
        window = self.run.window
        pending: list[str] = []

        stalled = self._broker_stalled(now)

        def due(since: float, key: str, rule: str, explanation: str, peer: _Peer) -> bool:
            if not peer.probe:
                self.judged.add(rule)
            if now < since + window or stalled:
                pending.append(key)
                return False
            self.violate(rule, explanation, peer)
            return True

        for worker in self.workers:
            if worker.probe:
                continue  # the probe waits for its own worker
            if worker.state == "informing":
                if due(
                    worker.informed_at,
                    f"ack {worker.name}",
                    "EMQP-03",
                    f"{worker.name}'s INFORM got no ACK within {window:.2f} s",
                    worker,
                ):
                    worker.state, worker.lost_at = "lost", now
            elif worker.state == "refusing":
                if due(
                    worker.refused_at,
                    f"disconnect {worker.name}",
                    "EMQP-04",
                    f"{worker.name}'s INFORM, which the broker must refuse, got no DISCONNECT "
                    f"within {window:.2f} s",
                    worker,
                ):
                    worker.state = "refused"
            elif (
                worker.state == "ready"
                and worker.acked_at
                and not worker.heartbeat_flagged
                and not stalled
            ):
                last = worker.last_heartbeat or worker.acked_at
                if now - last > self.run.heartbeat_span:
                    after = "its ACK" if worker.last_heartbeat is None else "the last HEARTBEAT"
                    self.violate(
                        "EMQP-15",
                        f"{worker.name} heard no HEARTBEAT from the broker for {now - last:.2f} s "
                        f"after {after} (interval {self.run.interval:g} s, liveness "
                        f"{self.run.liveness})",
                        worker,
                    )
                    worker.heartbeat_flagged = True
        active: list[_Request] = []
        for request in self.run.active:
            if request.status == "tainted" or request.client.probe or request.client.closed:
                continue
            waiting = request.kind == "job" and request.status == "waiting"
            if waiting and now - request.queued_at > self.run.request_age:
                continue  # may have expired (MDP-C-11): owed nothing
            if not _settled(request):
                active.append(request)
            for since, key, rule, explanation in self._owed_for(request, now):
                if key.split()[0] in request.flagged:
                    continue
                if due(since, key, rule, explanation, request.client):
                    request.flagged.add(key.split()[0])
                    if key.startswith("dispatch"):
                        request.status = "tainted"
        self.run.active = active
        return pending

    def _owed_for(self, request: _Request, now: float) -> list[tuple[float, str, str, str]]:
        """What the broker owes for ``request``: (since, key, rule, explanation) each."""
        window = self.run.window
        key = request.msgid.decode(errors="replace")
        what = f"{request.client.name}'s request {key} for {request.queue.decode(errors='replace')}"
        owed: list[tuple[float, str, str, str]] = []
        if request.kind == "job":
            free = self._live_credit(request.queue, now) if request.status == "waiting" else None
            if free is not None:
                lost = " (its first worker was lost)" if request.requeued else ""
                owed.append(
                    (
                        max(request.queued_at, free.credit_at),
                        f"dispatch {key}",
                        request.rule,
                        f"{what} was not dispatched within {window:.2f} s while {free.name} had "
                        f"a free credit on its queue{lost}",
                    )
                )
            holder = request.holder.name if request.holder else "?"
            if request.delivered_at is not None and not request.receipts:
                owed.append(
                    (
                        request.delivered_at,
                        "receipt",
                        "EMQP-11",
                        f"{what} was handed to {holder} but its client got no receipt "
                        f"within {window:.2f} s",
                    )
                )
            if request.receipts and not request.deliveries:
                # From the receipt: the REQUEST to the worker goes at the same time, on
                # another connection, and may arrive later.
                owed.append(
                    (
                        request.receipt_at or request.sent_at,
                        "early",
                        "EMQP-11",
                        f"{what} got a receipt but no worker got it within {window:.2f} s",
                    )
                )
            if request.replied_at is not None and not request.results:
                owed.append(
                    (
                        request.replied_at,
                        "result",
                        "EMQP-12",
                        f"{what} asked reply-requested: {holder} answered, but the client "
                        f"got no result within {window:.2f} s",
                    )
                )
        elif request.kind in ("refused", "mmi") and not request.answers:
            owing = "the broker answers mmi.service" if request.kind == "mmi" else "a refusal"
            explanation = f"{what} got no answer within {window:.2f} s ({owing})"
            owed.append((request.sent_at, "answer", request.rule, explanation))
        return owed

    # -- changes the model makes ---------------------------------------------------------------

    def _lose(self, worker: _Worker, at: float, rule: str) -> None:
        """The worker is gone (left, silent, refused): its reply-requested jobs go back."""
        worker.state = "silent" if rule == "EMQP-15" else "lost"
        worker.lost_at = at
        worker.lost_rule = rule
        worker.credits = 0
        self._requeue(worker, at)

    def _requeue(self, worker: _Worker, at: float) -> None:
        for request in worker.held:
            # EMQP-14: back to its queue (judged for its first re-dispatch only: once a free
            # credit on its queue makes the dispatch owed, or it is dispatched again).
            if request.status == "held" and request.holder is worker:
                # Dispatched once only: one already given again (its holder silent past the
                # span before the model lost it) may have met the broker's limit of
                # re-dispatches (MDP-D-08).
                first = request.requeued == 0 and request.deliveries <= 1
                request.status = "waiting" if first else "tainted"
                request.queued_at = at
                request.requeued += 1
                request.rule = "EMQP-14"
        worker.held = [r for r in worker.held if r.status == "replied"]


def _settled(request: _Request) -> bool:
    """Whether nothing more is owed for ``request`` (what it must not get is judged anyway)."""
    if request.kind == "dropped":
        return True
    if request.kind in ("refused", "mmi"):
        return request.answers > 0 or "answer" in request.flagged
    receipt = request.receipts > 0 or "receipt" in request.flagged
    if request.status == "done":
        return receipt
    if request.status == "replied":
        return receipt and (request.results > 0 or "result" in request.flagged)
    return False


def _is_error(body: bytes) -> bool:
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


def _job(rng: random.Random) -> bytes:
    number = rng.randrange(1000)
    return json.dumps(
        ["run", {"path": "fuzz_jobs", "callable": "add", "args": [number, 1]}]
    ).encode()


# -- the steps -----------------------------------------------------------------------------------


class _Steps:
    """The steps a scenario draws from; each acts, then lets the broker answer (``pump``)."""

    def __init__(self, scenario: _Scenario) -> None:
        self.s = scenario
        self.rng = scenario.rng
        self.run = scenario.run

    def pick_queues(self) -> tuple[bytes, ...]:
        rng = self.rng
        chosen = rng.sample(self.s.queues, rng.randint(1, len(self.s.queues)))
        # A plan that holds the broker's "default" queue uses it: its first informed worker
        # listens there (the target of a re-route, EMQP-22), later ones at times.
        listened = any(
            b"default" in w.queues for w in self.s.workers if w.state in ("ready", "informing")
        )
        if self.s.shares_default and not listened and rng.random() < 0.3:
            # The default queue alone: half of these INFORMs name it as "" (EMQP-03), which a
            # worker of the scenario's own queues too never sends.
            return (b"default",)
        if self.s.shares_default and (not listened or rng.random() < 0.2):
            chosen.append(b"default")
        return tuple(chosen)

    def _queues_frame(self, queues: tuple[bytes, ...]) -> bytes:
        rng = self.rng
        if queues == (b"default",) and rng.random() < 0.5:
            return b""  # EMQP-03: the broker's default queue
        if rng.random() < 0.2:
            return b",".join(queues)  # the seed's CSV names
        pairs = [[rng.choice((0, 1, 5, 10, 20)), q.decode()] for q in queues]
        return json.dumps(pairs).encode()

    def inform(
        self, worker: _Worker, queues: tuple[bytes, ...] | None = None, frame: bytes | None = None
    ) -> None:
        s = self.s
        now = s.now()
        if worker.state in ("ready", "informing"):
            # EMQP-05: a new conversation; its credits are withdrawn, its jobs go back.
            s.judge("EMQP-05")
            if worker.credits:
                worker.dropped_credits = "EMQP-05"
            worker.credits = 0
            s._requeue(worker, now)
        if worker.state != "new":
            worker.old_queues |= set(worker.queues)
        worker.queues = queues or self.pick_queues()
        queues_frame = self._queues_frame(worker.queues) if frame is None else frame
        worker.inform_msgid = s.send(worker, b"INFORM", queues_frame, b"worker")
        worker.state, worker.informed_at, worker.acked_at = "informing", now, None
        worker.last_heartbeat, worker.heartbeat_flagged = None, False
        worker.readies, worker.stray = 0, None
        worker.next_beat = now + self.run.interval
        s.pump(self.run.window)

    def ready(self, worker: _Worker, count: int) -> None:
        s = self.s
        for _ in range(count):
            s.send(worker, b"READY")
            worker.readies += 1
            if worker.credits < self.run.credits:
                worker.credits += 1
        worker.dropped_credits = None if worker.credits else worker.dropped_credits
        worker.credit_at = s.now()
        s.pump(self.run.window)

    def request(
        self,
        client: _Client,
        queue: bytes,
        *,
        reply: bool | None = None,
        wait: bool = True,
        rule: str = "EMQP-10",
    ) -> _Request:
        s, rng = self.s, self.rng
        reply = rng.random() < 0.6 if reply is None else reply
        headers = [b"reply-requested"] if reply else []
        if rng.random() < 0.3:
            headers.append(b"timeout:%d" % rng.choice((0, 1, 30, 300)))
        if rng.random() < 0.2:
            headers.append(rng.choice((b"retry-count:2", b"guarantee")))
        rng.shuffle(headers)
        body = [_job(rng)]
        if rng.random() < 0.1:
            body.append(b"extra frame")
        now = s.now()
        msgid = s.msgid()
        request = _Request(msgid, client, queue, b",".join(headers), tuple(body), reply, now)
        request.queued_at, request.rule = now, rule
        self.run.add(request)
        s.send(client, b"REQUEST", queue, request.headers, *body, msgid=msgid)
        if wait:
            s.pump(self.run.window)
        return request

    def finish(self, worker: _Worker) -> None:
        s = self.s
        held = [r for r in worker.held if r.status == "held"]
        if not held or worker.state != "ready":
            return
        request = held[0]
        result = json.dumps({"value": f"r-{request.msgid.decode()}"}).encode()
        s.send(worker, b"REPLY", result, request.msgid)
        request.status, request.result, request.replied_at = "replied", result, s.now()
        worker.held.remove(request)
        if self.rng.random() < 0.8:
            self.ready(worker, 1)  # as EventMQ's jobmanager does after each job
        else:
            s.pump(self.run.window)

    def leave(
        self, worker: _Worker, command: bytes | None = None, client: _Client | None = None
    ) -> bytes:
        """KBYE, KBAI or DISCONNECT from ``worker``; then, given a ``client`` and if it left
        free credits, a job for one of its queues: it must not reach the worker (EMQP-16)."""
        s = self.s
        command = command or self.rng.choice((b"KBYE", b"KBYE", b"KBAI", b"DISCONNECT"))
        free = worker.credits > 0 and not worker.probe
        s.send(worker, command)
        s._lose(worker, s.now(), "EMQP-16")
        if free:
            s.judge("EMQP-16")  # from now on none of its credits may take a job
        s.pump(self.run.window)
        if free and client is not None:
            # Once the broker certainly had the KBYE: a job given sooner is not judged.
            s.pump(self.run.settle, shortest=self.run.settle)
            self.request(client, self.rng.choice(worker.queues))
        return command

    def handover(self, client: _Client) -> tuple[str, str] | None:
        """EMQP-14's run of events: a worker holding jobs is lost (KBYE, KBAI or DISCONNECT,
        silence past the liveness span, or a new INFORM) while another worker listens on their
        queue; that one has a free credit before the loss or gets one after it. The held jobs
        with ``reply-requested`` are owed to it; those without must not go out again
        (EMQP-12)."""
        s, rng = self.s, self.rng
        queue = rng.choice(s.queues)
        listening = [
            w for w in s.workers if w.state == "ready" and not w.probe and queue in w.queues
        ]
        rng.shuffle(listening)
        while len(listening) < 2:
            worker = s.new_worker()
            others = [q for q in s.queues if q != queue]
            self.inform(worker, (queue, *rng.sample(others, rng.randint(0, 1))))
            if worker.state != "ready":
                return None
            listening.append(worker)
        first, second = listening[:2]
        if first.credits == 0:
            self.ready(first, 1)
        jobs = [
            self.request(client, queue, reply=i == 0 or rng.random() < 0.7)
            for i in range(rng.randint(1, 2))
        ]
        holders = [r.holder for r in jobs if r.status == "held" and r.holder is not None]
        holder = holders[0] if holders else None
        if holder is None or holder.state != "ready":
            return None  # not dispatched (judged as EMQP-10): nothing to hand over
        spare = second if holder is first else first
        late = rng.random() < 0.3  # the spare's credit after the loss: the jobs wait for it
        if not late:
            self._free_credit(spare)
        how = rng.choice(("leave", "leave", "silent", "reinform"))
        if how == "leave":
            what = f"{self.leave(holder).decode()} from a worker holding a job"
        elif how == "silent":
            self.go_silent(holder)
            what = "the silence of a worker holding a job"
        else:
            self.inform(holder)
            what = "a second INFORM from a worker holding a job"
        if late:
            self._free_credit(spare)
        return what, "EMQP-14"

    def _free_credit(self, worker: _Worker) -> None:
        """READY until ``worker`` has a free credit (a job waiting on its queue may take the
        first), three at most."""
        for _ in range(3):
            if worker.state != "ready" or worker.credits > 0:
                return
            self.ready(worker, 1)

    def go_silent(self, worker: _Worker) -> None:
        """The worker sends nothing from now on (EMQP-14, EMQP-15)."""
        s = self.s
        worker.state = "silent"
        s.judge("EMQP-15")  # past the liveness span no job may reach it
        silent_since = s.now()
        s.pump(self.run.span + self.run.settle, shortest=self.run.span + self.run.settle)
        s._lose(worker, silent_since + self.run.span, "EMQP-15")
        s.pump(self.run.window)

    def mmi(self, client: _Client) -> None:
        s, rng = self.s, self.rng
        now = s.now()
        waiting = {r.queue for r in self.run.active if r.status == "waiting"}
        served = [  # a free credit the broker has surely seen, not about to be taken
            q
            for w in s.workers
            if w.state == "ready" and w.credits > 0 and now - w.credit_at > self.run.settle
            for q in w.queues
            if q not in waiting
        ]
        if served and rng.random() < 0.6:
            queue, status = rng.choice(served), b"200"
        else:
            queue, status = f"{s.tag}nobody{rng.randrange(100)}".encode(), b"404"
        msgid = s.msgid()
        request = _Request(
            msgid,
            client,
            b"mmi.service",
            b"reply-requested",
            (queue,),
            True,
            s.now(),
            kind="mmi",
            rule="EMQP-25",
            mmi_status=status,
        )
        self.run.add(request)
        s.send(client, b"REQUEST", b"mmi.service", b"reply-requested", queue, msgid=msgid)
        s.pump(self.run.window)

    def duplicate(self, client: _Client) -> None:
        """EMQP-08: a REQUEST with the MSGID of one still outstanding is dropped. Without one,
        the client first sends a ``reply-requested`` job (waiting, or held until answered)."""
        s = self.s
        now = s.now()
        # Certainly outstanding at the broker: a reply-requested job until its result, one
        # without reply-requested only while no credit may have taken it (it is done once
        # handed to a worker, EMQP-12: its MSGID may then be used again).
        outstanding = [
            r
            for r in self.run.active
            if r.client is client
            and r.kind == "job"
            and r.status in ("waiting", "held")
            and r.requeued == 0
            and (r.reply or (r.status == "waiting" and s._live_credit(r.queue, now) is None))
        ]
        if not outstanding:
            original = self.request(client, self.rng.choice(s.queues), reply=True)
            if original.status not in ("waiting", "held"):
                return
        else:
            original = outstanding[0]
        original.duplicate_sent = True
        s.judge("EMQP-08")
        s.send(
            client,
            b"REQUEST",
            original.queue,
            original.headers,
            *original.body,
            msgid=original.msgid,
        )
        s.pump(self.run.window)

    # -- near misses ---------------------------------------------------------------------------

    def bad_inform(self) -> tuple[str, str] | None:
        s, rng = self.s, self.rng
        worker = s.new_worker()
        queue = s.queues[0].decode()
        variants: list[tuple[bytes, bytes, str]] = [
            (json.dumps([[10, queue]]).encode(), b"scheduler", "as a scheduler"),
            (json.dumps([[10, queue]]).encode(), b"manager", "as type 'manager'"),
            (b"[[10, " + queue.encode(), b"worker", "with queues that are not JSON"),
            (json.dumps([[10]]).encode(), b"worker", "with a queue without a name"),
            (json.dumps([["ten", queue]]).encode(), b"worker", "with a weight that is no integer"),
            (json.dumps([[10, queue], [5, queue]]).encode(), b"worker", "naming a queue twice"),
            (json.dumps([[10, "mmi.service"]]).encode(), b"worker", "listening on mmi.service"),
            (json.dumps([[1, f"{queue}x{i}"] for i in range(MAX_QUEUES + 1)]).encode(),
             b"worker", f"with {MAX_QUEUES + 1} queues"),
            (json.dumps([[10, ""]]).encode(), b"worker", "with an empty queue name"),
        ]  # fmt: skip
        frame, kind, what = rng.choice(variants)
        worker.queues = (s.queues[0],)
        worker.inform_msgid = s.send(worker, b"INFORM", frame, kind)
        worker.state, worker.refused_at = "refusing", s.now()
        s.pump(self.run.window)
        # Nothing is registered: a READY after it is no credit (EMQP-04).
        s.send(worker, b"READY")
        s.pump(0.05)
        return f"an INFORM {what}", "EMQP-04"

    def bad_request(self, client: _Client) -> tuple[str, str] | None:
        s, rng = self.s, self.rng
        queue = rng.choice(s.queues)
        job = _job(rng)
        variants: list[tuple[list[bytes], str]] = [
            ([queue, b"", b"not json"], "whose message is not JSON"),
            ([queue, b"", b'{"run": 1}'], "whose message is a JSON object"),
            ([queue, b"", b'["run"]'], "whose message has no options"),
            ([queue, b"timeout:soon", job], "with the header timeout:soon"),
            ([queue, b"reply-requested,timeout:-1", job], "with the header timeout:-1"),
            ([b"", b"", job], "with an empty queue"),
            ([queue, b""], "without its message"),
            ([queue], "without headers and message"),
            ([queue, b"", b"\xff\xfe"], "whose message is not UTF-8"),
            ([b"\xffq", b"", job], "whose queue is not UTF-8"),
        ]
        frames, what = rng.choice(variants)
        msgid = s.msgid()
        request = _Request(
            msgid,
            client,
            frames[0],
            b"",
            tuple(frames[2:]),
            False,
            s.now(),
            kind="refused",
            rule="EMQP-09",
        )
        self.run.add(request)
        s.send(client, b"REQUEST", *frames, msgid=msgid)
        s.pump(self.run.window)
        return f"a REQUEST {what}", "EMQP-09"

    def bad_msgid(self, client: _Client) -> tuple[str, str] | None:
        s, rng = self.s, self.rng
        variants = [
            (b"", "an empty MSGID"),
            (b"id\x00nul" + s.msgid(), "a MSGID with a NUL"),
            (b"x" * 256 + s.msgid(), "a MSGID of over 255 bytes"),
            (b"\xff\xfe" + s.msgid(), "a MSGID that is not UTF-8"),
        ]
        msgid, what = rng.choice(variants)
        if rng.random() < 0.5:
            queue = rng.choice(s.queues)
            request = _Request(
                msgid,
                client,
                queue,
                b"",
                (_job(rng),),
                False,
                s.now(),
                kind="dropped",
                rule="EMQP-02",
            )
            self.run.add(request)
            s.send(client, b"REQUEST", queue, b"", *request.body, msgid=msgid)
            s.pump(0.2)
            return f"a REQUEST with {what}", "EMQP-02"
        worker = self._informed_worker()
        if worker is None:
            return None
        s.send(worker, b"READY", msgid=msgid)  # EMQP-02: dropped, so no credit
        worker.stray = "EMQP-02"
        s.pump(0.2)
        return f"a READY with {what}", "EMQP-02"

    def bad_reply(self) -> tuple[str, str] | None:
        s, rng = self.s, self.rng
        worker = self._informed_worker()
        if worker is None:
            return None
        if rng.random() < 0.5:
            s.send(worker, b"REPLY", b'{"value": 1}', b"no-such-" + s.msgid())
            what = "a REPLY naming no request it holds"
        else:
            s.send(worker, b"REPLY", b"no-such-" + s.msgid())
            what = "a REPLY without a result"
        self._still_served(worker, "EMQP-13")
        return f"{what}", "EMQP-13"

    def unknown_command(self) -> tuple[str, str] | None:
        s, rng = self.s, self.rng
        worker = self._informed_worker()
        if worker is None:
            return None
        command = rng.choice((b"FOO", b"ACK", b"STATUS", b"ready"))
        s.send(worker, command, b"x")
        worker.stray = "EMQP-18"
        self._still_served(worker, "EMQP-18")
        return f"the unknown command {command!r} from a worker", "EMQP-18"

    def stranger_ready(self) -> tuple[str, str] | None:
        s = self.s
        worker = s.new_worker()
        worker.state = "stranger"
        s.send(worker, b"READY")
        s.send(worker, b"READY")
        s.pump(0.05)
        return "READY from a peer that sent no INFORM", "EMQP-06"

    def refused_command(self, client: _Client) -> tuple[str, str] | None:
        s, rng = self.s, self.rng
        queue = rng.choice(s.queues)
        job = _job(rng)
        variants: list[tuple[bytes, list[bytes]]] = [
            (b"SCHEDULE", [queue, b"", b"60", job, b""]),
            (b"SCHEDULE", [queue, b"nohaste", b"-1", job, b"* * * * *"]),
            (b"UNSCHEDULE", [queue, b"", b"60", job, b""]),
            (b"PUBLISH", [b"topic", job]),
        ]
        command, frames = rng.choice(variants)
        msgid = s.msgid()
        request = _Request(
            msgid, client, queue, b"", (job,), False, s.now(), kind="refused", rule="EMQP-17"
        )
        self.run.add(request)
        s.send(client, command, *frames, msgid=msgid)
        s.pump(self.run.window)
        return f"{command.decode()}", "EMQP-17"

    def not_emqp(self, client: _Client) -> tuple[str, str] | None:
        s, rng = self.s, self.rng
        msgid, job = s.msgid(), _job(rng)
        # Never to be dispatched: not eMQP/1.0 (EMQP-01).
        self.run.add(
            _Request(msgid, client, s.queues[0], b"", (job,), False, s.now(), "dropped", "EMQP-01")
        )
        variants: list[tuple[list[bytes], str]] = [
            ([b"", EMQP], "a header and nothing else"),
            ([b"", EMQP, b"REQUEST"], "a REQUEST without a MSGID"),
            ([b"", b"eMQP/2.0", b"REQUEST", msgid, s.queues[0], b"", job], "eMQP/2.0"),
            ([b"junk"], "one frame of junk"),
            ([b"", EMQP, b"INFORM"], "an INFORM without a MSGID"),
        ]
        frames, what = rng.choice(variants)
        peer: _Peer = client if rng.random() < 0.5 else s.new_worker()
        peer.socket.send_multipart(frames)
        s.pump(0.1)
        return f"{what}", "EMQP-01"

    def flood_credits(self) -> tuple[str, str] | None:
        """More READYs than the broker's cap on free slots, then as many requests (EMQP-06)."""
        s = self.s
        worker = s.new_worker()
        queue = f"{s.tag}flood{len(s.workers)}".encode()
        self.inform(worker, (queue,))
        if worker.state != "ready":
            return None
        self.ready(worker, self.run.credits + 6)
        # The broker caps free slots: all READYs must be in before the first request is.
        s.pump(self.run.settle, shortest=self.run.settle)
        client = s.new_client()
        for _ in range(self.run.credits + 6):
            self.request(client, queue, reply=False, wait=False)
        s.pump(self.run.window)
        return f"{self.run.credits + 6} READYs from one worker", "EMQP-06"

    def _informed_worker(self) -> _Worker | None:
        ready = [w for w in self.s.workers if w.state == "ready" and not w.probe]
        return self.rng.choice(ready) if ready else None

    def _still_served(self, worker: _Worker, rule: str) -> None:
        """The worker's message was dropped, not the worker: a request on its queue, with a
        credit of its own, must still be dispatched (``rule`` owes it)."""
        s = self.s
        if worker.credits == 0:
            self.ready(worker, 1)
        queue = worker.queues[0]
        self.request(s.clients[0] if s.clients else s.new_client(), queue, reply=False, rule=rule)

    # -- is the broker still serving? ----------------------------------------------------------

    def probe(self, after: str, rule: str) -> None:
        """A fresh worker and client: INFORM gets its ACK, a request reaches the worker. A probe
        whose worker this process failed to heartbeat in time (a stalled machine: the broker
        may rightly have forgotten it) proves nothing: it is played again, three times at
        most, then left unjudged. So is one whose worker the broker stopped heartbeating (it
        forgot the worker: a broker that had stalled may have read its heartbeats too late), as
        EventMQ's jobmanager INFORMs again once it misses the broker's heartbeats; the third
        such is the broker's."""
        for attempt in range(3):
            if self._probe_once(after, rule, last=attempt == 2):
                return

    def _probe_once(self, after: str, rule: str, last: bool) -> bool:
        """One probe: True if the broker served it, False if this process was too slow to
        tell, or (unless ``last``) the broker forgot the probe's worker; ``_Stopped`` if the
        broker no longer serves."""
        s = self.s
        worker, client = s.new_worker(probe=True), s.new_client(probe=True)
        queue = f"{s.tag}probe{len(s.workers)}".encode()

        def forsaken() -> bool:  # by _forsake: this process was too slow to heartbeat it
            return worker.state == "lost"

        self.inform(worker, (queue,), json.dumps([[10, queue.decode()]]).encode())
        # Generous: a broker declared stopped ends the run, so a slow one is given time.
        s.pump(
            max(10.0, 2 * self.run.window),
            until=lambda: worker.acked_at is not None or forsaken(),
        )
        if forsaken():
            return False
        if worker.acked_at is None:
            raise _Stopped(rule, f"after {after} the broker no longer answers INFORM with ACK")
        self.ready(worker, 1)
        msgid, body = s.msgid(), _job(random.Random(0))
        request = _Request(msgid, client, queue, b"", (body,), False, s.now())
        request.queued_at = request.sent_at
        self.run.add(request)
        s.send(client, b"REQUEST", queue, b"", body, msgid=msgid)
        s.pump(max(10.0, 3 * self.run.window), until=lambda: request.deliveries > 0 or forsaken())
        if request.deliveries == 0:
            if forsaken():
                return False
            beat = worker.last_heartbeat
            if not last and (beat is None or s.now() - beat > self.run.heartbeat_span):
                worker.state, worker.lost_rule, worker.lost_at = "lost", "", s.now()
                return False  # forgotten: a fresh INFORM
            since = "never" if beat is None else f"{s.now() - beat:.2f} s ago"
            raise _Stopped(
                rule,
                f"after {after} the broker no longer dispatches requests (the probe's worker, "
                f"INFORMed and READY, last heard a HEARTBEAT {since}; its client got "
                f"{request.receipts} receipt(s))",
            )
        self.leave(worker, b"KBYE")
        return True


# -- a scenario and the run ----------------------------------------------------------------------


class _Run:
    """What outlives one scenario: sockets' context, settings, requests sent, findings."""

    def __init__(
        self,
        clients_endpoint: str,
        workers_endpoint: str,
        seed: int,
        interval: float,
        liveness: int,
        malformed: bool,
        credits: int,
        meter: JitterMeter | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.clients_endpoint = clients_endpoint
        self.credits = credits  # the broker's cap on one worker's free slots (EMQP-06)
        self.workers_endpoint = workers_endpoint
        self.seed = seed
        self.interval = interval
        self.liveness = liveness
        self.malformed = malformed
        self.span = interval * liveness
        self.meter = JitterMeter() if meter is None else meter
        self.last_any_heartbeat: float | None = None  # the broker's last HEARTBEAT in this lane
        self.shared = threading.Lock()  # the lanes' hold on the broker's "default" queue
        self.request_age = 20.0
        self.owns_context = context is None
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context() if context is None else context
        self.poller = zmq.Poller()
        self.nonce = f"{random.Random().randrange(16**6):06x}"  # routing ids unique per run
        self.requests: dict[bytes, _Request] = {}
        self.active: list[_Request] = []  # requests something may still be owed for
        self.broker_ids: set[bytes] = set()
        self.steps: dict[str, int] = {}

    @property
    def slack(self) -> float:
        """A message's way through two sockets and the broker's loop, plus the measured jitter
        at both ends (``domo.fuzz.jitter``): 40 ms on an idle machine."""
        return 0.02 + 4 * self.meter.value

    @property
    def window(self) -> float:
        """How long what the broker owes may take: two intervals (it may act on its heartbeat
        tick) and twice the slack."""
        return 2 * self.interval + 2 * self.slack

    @property
    def settle(self) -> float:
        """How long after a peer's message the broker has certainly had it: there and back."""
        return 2 * self.slack

    @property
    def heartbeat_span(self) -> float:
        """The longest silence of the broker to an informed worker (EMQP-15)."""
        return self.span + self.window

    def add(self, request: _Request) -> None:
        self.requests[request.msgid] = request
        self.active.append(request)

    def close(self) -> None:
        if self.owns_context:
            self.context.destroy(linger=0)


MALFORMED = ("bad-inform", "bad-request", "bad-msgid", "bad-reply", "unknown", "stranger",
             "refused", "not-emqp", "flood")  # fmt: skip
KINDS = ("worker", "ready", "request", "request", "request", "finish", "finish", "leave",
         "silent", "reinform", "handover", "mmi", "duplicate")  # fmt: skip
# The rules each kind of step gives something to judge, for the planner's steering: only
# those it reaches whatever the scenario's state (a leave or a silence judges EMQP-14 only when
# its worker held a job and another was free on its queue; "handover" makes that so).
STEP_RULES: dict[str, tuple[str, ...]] = {
    "worker": ("EMQP-03", "EMQP-06", "EMQP-15"),
    "ready": ("EMQP-06", "EMQP-07"),
    "request": ("EMQP-10", "EMQP-11", "EMQP-12", "EMQP-22", "EMQP-26"),
    "finish": ("EMQP-12", "EMQP-07"),
    "leave": ("EMQP-16",),
    "silent": ("EMQP-15",),
    "reinform": ("EMQP-05",),
    "handover": ("EMQP-14",),
    "mmi": ("EMQP-25",),
    "duplicate": ("EMQP-08",),
    "bad-inform": ("EMQP-04",),
    "bad-request": ("EMQP-09",),
    "bad-msgid": ("EMQP-02",),
    "bad-reply": ("EMQP-13",),
    "unknown": ("EMQP-18",),
    "stranger": ("EMQP-06",),
    "refused": ("EMQP-17",),
    "not-emqp": ("EMQP-01",),
    "flood": ("EMQP-06",),
}
RULES = tuple(sorted({rule for rules in STEP_RULES.values() for rule in rules} | {"EMQP-19"}))


def _play(run: _Run, plan: Sequence[Step], tag: str) -> Outcome:
    """Play one plan: its first step (``setup``) seeds the peers it starts with, each later one
    is a kind of step and the seed of the random choices it makes. The rules it broke, the
    rules it judged, and the stop if the broker stopped serving."""
    setup = plan[0].arg if plan and plan[0].kind == "setup" else 0
    rng = random.Random(setup)
    s = _Scenario(run, tag, rng)
    s.shares_default = bool(plan and plan[0].kind == "setup" and plan[0].actor)
    steps = _Steps(s)
    before: dict[str, str] = {}

    def outcome(fatal: Violation | None = None) -> Outcome:
        broken = [Violation(rule, why) for rule, why in sorted(s.broken.items())]
        return Outcome(broken, frozenset(s.judged), fatal)

    try:
        try:
            for _ in range(rng.randint(1, 2)):
                s.new_client()
            for _ in range(rng.randint(1, 3)):
                worker = s.new_worker()
                steps.inform(worker)
                if worker.state == "ready":
                    steps.ready(worker, rng.randint(0, 3))
            for step in plan:
                if step.kind == "setup":
                    continue
                before = dict(s.broken)
                s.rng = steps.rng = random.Random(step.arg)
                run.steps[step.kind] = run.steps.get(step.kind, 0) + 1
                _step(steps, s, step.kind)
            # The end: every job answered and its result owed, then every worker leaves.
            for worker in s.workers:
                while any(r.status == "held" for r in worker.held) and worker.state == "ready":
                    steps.finish(worker)
            s.pump(run.window)
            for worker in s.workers:
                if worker.state in ("ready", "informing"):
                    s.send(worker, b"KBYE")
                    s._lose(worker, s.now(), "EMQP-16")
            s.pump(0.05)
        except _Found as found:
            s.broken.setdefault(found.rule, str(found))
        except _Stopped as stop:
            # What broke during the fatal step may be the stop itself (no heartbeats, nothing
            # dispatched): only the stop is reported for it.
            s.broken = before
            return outcome(Violation(stop.rule, f"the broker stopped serving: {stop}"))
    finally:
        s.close()
    return outcome()


def _step(steps: _Steps, s: _Scenario, kind: str) -> None:
    """One step of ``kind``, then the probe: does the broker still serve a fresh worker and
    client?"""
    rng = s.rng
    workers = [w for w in s.workers if w.state == "ready" and not w.probe]
    client = rng.choice([c for c in s.clients if not c.probe])
    done: tuple[str, str] | None = None
    if kind == "worker":
        worker = s.new_worker()
        steps.inform(worker)
        if worker.state == "ready":
            steps.ready(worker, rng.randint(1, 3))
        done = "an INFORM", "EMQP-03"
    elif kind == "ready" and workers:
        steps.ready(rng.choice(workers), rng.randint(1, 3))
        done = "READY", "EMQP-06"
    elif kind == "request":
        roll = rng.random()
        if roll < 0.75:
            queue = rng.choice(s.queues)
        elif roll < 0.9 or not s.shares_default:
            queue = f"{s.tag}unknown{rng.randrange(100)}".encode()  # EMQP-22: no re-route
        else:
            queue = b"default"
        steps.request(client, queue)
        done = "a REQUEST", "EMQP-08"
    elif kind == "finish" and workers:
        steps.finish(rng.choice(workers))
        done = "a worker's REPLY", "EMQP-12"
    elif kind == "leave" and workers:
        # Mostly one with free credits: what it must not be given any more (EMQP-16).
        free = [w for w in workers if w.credits > 0]
        leaving = rng.choice(free if free and rng.random() < 0.8 else workers)
        done = f"{steps.leave(leaving, client=client).decode()} from a worker", "EMQP-16"
    elif kind == "silent" and workers:
        steps.go_silent(rng.choice(workers))
        done = "a worker's silence", "EMQP-15"
    elif kind == "reinform" and workers:
        steps.inform(rng.choice(workers))
        done = "a second INFORM", "EMQP-05"
    elif kind == "handover":
        done = steps.handover(client)
    elif kind == "mmi":
        steps.mmi(client)
        done = "mmi.service", "EMQP-25"
    elif kind == "duplicate":
        steps.duplicate(client)
        done = "a REQUEST with an outstanding MSGID", "EMQP-08"
    elif kind in MALFORMED and s.run.malformed:
        actions: dict[str, Callable[[], tuple[str, str] | None]] = {
            "bad-inform": steps.bad_inform,
            "bad-request": lambda: steps.bad_request(client),
            "bad-msgid": lambda: steps.bad_msgid(client),
            "bad-reply": steps.bad_reply,
            "unknown": steps.unknown_command,
            "stranger": steps.stranger_ready,
            "refused": lambda: steps.refused_command(client),
            "not-emqp": lambda: steps.not_emqp(client),
            "flood": steps.flood_credits,
        }
        done = actions[kind]()
    if done is not None:
        steps.probe(*done)


class EmqpPlanner:
    """eMQP plans: a setup seed, then nine steps, one in two chosen for the rules judged
    least (the rest at random); shrinking drops steps."""

    death_rule = "EMQP-01"

    def __init__(self, malformed: bool) -> None:
        self.kinds = KINDS + (MALFORMED if malformed else ())
        self.rules = tuple(
            r for r in RULES if any(r in STEP_RULES[k] for k in self.kinds) or r == "EMQP-19"
        )

    def draw(self, rng: random.Random, judged: Mapping[str, int]) -> tuple[Step, ...]:
        # One plan in six may use the broker's "default" queue (EMQP-03's "" INFORM, EMQP-22),
        # which every such plan shares: one of them runs at a time (beside plans that do not:
        # those never send to it nor listen on it).
        plan = [Step("setup", int(rng.random() < 1 / 6), rng.randrange(2**31))]
        for _ in range(STEPS_PER_SCENARIO):
            if rng.random() < 0.5:
                kind = rng.choice(self.kinds)
            else:
                kind = min(
                    self.kinds,
                    key=lambda k: min(judged.get(r, 0) for r in STEP_RULES[k]) + 3 * rng.random(),
                )
            plan.append(Step(kind, 0, rng.randrange(2**31)))
        return tuple(plan)

    def simpler(self, step: Hashable) -> Sequence[Hashable]:
        return []


class _Lane:
    """One lane of the search: its own sockets, the run's settings and jitter meter."""

    def __init__(self, run: _Run, index: int) -> None:
        self.run = run
        self.index = index
        self.played = 0

    def play(self, plan: Sequence[Hashable]) -> Outcome:
        self.played += 1
        tag = f"s{self.run.seed}l{self.index}n{self.played}"
        steps = [s for s in plan if isinstance(s, Step)]
        if not (steps and steps[0].kind == "setup" and steps[0].actor):
            return _play(self.run, steps, tag)  # its own queues only: beside any other
        with self.run.shared:  # the broker's "default" queue: one such plan at a time
            return _play(self.run, steps, tag)

    def close(self) -> None:
        self.run.close()


def _fuzz(
    clients_endpoint: str,
    workers_endpoint: str,
    scenarios: int,
    seed: int,
    time_budget: float,
    interval: float,
    liveness: int,
    malformed: bool,
    progress: Callable[[str], None] | None,
    first: bool,
    credits: int,
    lanes: int,
    stop_after: Sequence[str],
) -> EmqpFuzzResult:
    meter = JitterMeter()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    runs: list[_Run] = []
    # Shared by every lane: the broker's MSGIDs, and the requests sent (a request for the
    # broker's "default" queue may go to another lane's worker that listens on it too).
    broker_ids: set[bytes] = set()
    requests: dict[bytes, _Request] = {}
    nonce = f"{random.Random().randrange(16**6):06x}"
    shared = threading.Lock()

    def open_lane(index: int) -> _Lane:
        run = _Run(clients_endpoint, workers_endpoint, seed, interval, liveness, malformed,
                   credits, meter=meter, context=context)  # fmt: skip
        run.broker_ids, run.requests, run.nonce = broker_ids, requests, nonce
        run.shared = shared
        runs.append(run)
        return _Lane(run, index)

    try:
        searched = search(
            open_lane,
            EmqpPlanner(malformed),
            seed=seed,
            lanes=lanes,
            time_budget=time_budget,
            examples=scenarios,
            stop_after=stop_after,
            first=first,
            progress=progress,
        )
    finally:
        context.destroy(linger=0)
    if searched.errors:
        raise RuntimeError(f"the eMQP fuzzer failed: {searched.errors[0]}")
    steps: dict[str, int] = {}
    for run in runs:
        for kind, count in run.steps.items():
            steps[kind] = steps.get(kind, 0) + count
    findings = tuple(
        EmqpFinding(
            f.violation.rule,
            f.violation.explanation,
            seed,
            -1,
            f.scenarios,
            tuple(step for step in f.plan if isinstance(step, Step)),
        )
        for f in sorted(searched.findings, key=lambda f: _rule_order(f.violation.rule))
    )
    return EmqpFuzzResult(
        searched.scenarios,
        searched.seconds,
        seed,
        findings,
        searched.stopped,
        dict(sorted(steps.items())),
        judged=Counter(searched.judged),
        held=Counter(searched.held),
        rules=EmqpPlanner(malformed).rules,
    )


def replay_emqp(
    endpoint: str,
    steps: Sequence[Step],
    *,
    workers_endpoint: str | None = None,
    heartbeat_interval: float = 0.1,
    liveness: int = 3,
    credits: int = MAX_CREDITS,
) -> list[Violation]:
    """Play one saved eMQP plan once; the rules it broke (the stop last, if it stopped)."""
    run = _Run(endpoint, workers_endpoint or endpoint, 0, heartbeat_interval, liveness, True,
               credits)  # fmt: skip
    try:
        outcome = _play(run, list(steps), "replay")
    finally:
        run.close()
    return [*outcome.violations, *([outcome.fatal] if outcome.fatal else [])]


def _rule_order(rule: str) -> tuple[str, int]:
    prefix, _, number = rule.rpartition("-")
    return prefix, int(number) if number.isdigit() else 0


def fuzz_emqp(
    endpoint: str,
    *,
    workers_endpoint: str | None = None,
    scenarios: int = 20,
    seed: int = 0,
    time_budget: float = 60.0,
    heartbeat_interval: float = 0.1,
    liveness: int = 3,
    malformed: bool = True,
    progress: Callable[[str], None] | None = None,
    first: bool = False,
    credits: int = MAX_CREDITS,
    lanes: int = 4,
    stop_after: Sequence[str] = (),
) -> EmqpFuzzResult:
    """Run up to ``scenarios`` eMQP scenarios, ``lanes`` at a time, against the broker whose
    clients connect to ``endpoint`` and workers to ``workers_endpoint`` (the same one if None;
    EventMQ's router has two); the rules it broke, one finding per rule, each with the
    smallest plan found that breaks it. ``heartbeat_interval`` and ``liveness`` must be the
    broker's, and ``credits`` its cap on one worker's free slots (EMQP-06: 64 at most; domo's
    broker what a burst is sure to fit in a peer's pipe, 7 with its defaults). ``progress``
    sees each rule the first time it breaks; ``first`` stops after the first finding."""
    return _fuzz(
        endpoint,
        workers_endpoint or endpoint,
        scenarios,
        seed,
        time_budget,
        heartbeat_interval,
        liveness,
        malformed,
        progress,
        first,
        credits,
        lanes,
        stop_after,
    )


def describe(result: EmqpFuzzResult) -> Sequence[str]:
    """The result as lines for a terminal."""
    lines = [
        f"{f.rule}: {f.explanation} (--seed {f.seed}; broken in {f.scenarios} of "
        f"{result.scenarios} scenarios; the smallest: {len(f.steps) - 1} step(s): "
        f"{', '.join(s.kind for s in f.steps if s.kind != 'setup')})"
        for f in result.findings
    ]
    if result.stopped:
        lines.append(f"domo fuzz: the run stopped: {result.stopped}")
    return lines
