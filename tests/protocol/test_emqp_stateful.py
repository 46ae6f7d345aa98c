"""eMQP/1.0 through FamilyBroker against an independent model of its queues and credits.

A Hypothesis ``RuleBasedStateMachine`` plays eMQP workers (INFORM with a subset of the queues,
READY credits, REPLY, KBYE, re-INFORM), eMQP clients (REQUESTs with and without
``reply-requested``) and near-miss garbage. The model, written here from specs/emqp-1.0.md and
sharing no code with ``domo.protocol``, keeps per queue the requests waiting in order, per worker
its queues, free credits and the jobs it holds. After every step everything the broker sent is
checked against it:

- a REQUEST goes only to an informed worker listening on its queue, spends one of its credits
  (EMQP-06, EMQP-07), is the oldest waiting request of that queue (re-dispatched ones first,
  EMQP-14), and carries the client's MSGID, queue, headers and message (EMQP-10);
- nothing waits in a queue while a worker listening on it has a free credit (work conservation);
- each request gets one receipt, when first handed to a worker (EMQP-11); a result reaches its
  client only after its worker's REPLY, with that REPLY's value and the client's MSGID (EMQP-12);
- a worker's INFORM is answered ACK then HEARTBEAT (EMQP-03, EMQP-15); garbage gets nothing
  but the answers the spec gives (EMQP-09, EMQP-18).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domo.protocol import BrokerConfig
from domo.protocol.family import FamilyBroker

E = b"eMQP/1.0"
QUEUES = (b"q0", b"q1", b"q2")
WORKERS = (b"w0", b"w1", b"w2")
CLIENTS = (b"c0", b"c1")
# No timer fires in a run (steps are 10 ms apart): expiry is tested in test_emqp.py.
CONFIG = BrokerConfig(
    heartbeat_interval=100.0, liveness=3, request_expiry=1000.0, max_redispatches=2
)
JOB = json.dumps(["run", {"path": "jobs", "callable": "f"}]).encode()
GARBAGE = [
    [b"", E],
    [b"", E, b"READY"],
    [b"", E, b"REQUEST", b"g1", b"q0", b"timeout:x", JOB],
    [b"", E, b"REQUEST", b"g2", b"q0", b"", b"[1]"],
    [b"", E, b"NOPE", b"g3"],
    [b"", E, b"ACK", b"g4", b"x"],
    [b"", b"eMQP/0.9", b"READY", b"g5"],
    [b"", E, b"REPLY", b"g6", b"{}", b"nothing"],
    [b"", E, b"INFORM", b"g7", b"[[1, 2]]", b"worker"],
]


@dataclass
class Request:
    client: bytes
    msgid: bytes
    queue: bytes
    reply: bool
    number: int  # order of acceptance
    attempts: int = 0  # times handed to a worker


@dataclass
class Worker:
    queues: tuple[bytes, ...] = ()
    informed: bool = False
    free: int = 0
    held: dict[bytes, Request] = field(default_factory=dict)  # reply jobs by MSGID


class EmqpMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker = FamilyBroker(CONFIG)
        self.now = 0.0
        self.workers = {name: Worker() for name in WORKERS}
        self.waiting: dict[bytes, deque[Request]] = {q: deque() for q in QUEUES}
        self.accepted = 0
        self.receipts: set[bytes] = set()
        self.dispatched: set[bytes] = set()
        self.results_due: dict[bytes, bytes] = {}  # msgid -> result the client must get
        self.expect_inform: dict[bytes, bytes] = {}  # worker -> the INFORM's MSGID

    # -- driving ----------------------------------------------------------------------------

    def send(self, peer: bytes, *frames: bytes) -> None:
        self.now += 0.01
        self.broker.receive(peer, list(frames), self.now)
        self.check_outgoing()

    def give_back(self, worker: Worker) -> None:
        """A lost or re-informing worker's reply jobs go back to the front, oldest first, unless
        they were handed out too often already (MDP-D-08's limit): those are dropped."""
        for request in sorted(worker.held.values(), key=lambda r: r.number, reverse=True):
            if request.attempts <= CONFIG.max_redispatches:
                self.waiting[request.queue].appendleft(request)
        worker.held.clear()
        worker.free = 0

    @rule(
        name=st.sampled_from(WORKERS),
        queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True),
    )
    def inform(self, name: bytes, queues: list[bytes]) -> None:
        worker = self.workers[name]
        if worker.informed:
            self.give_back(worker)  # EMQP-05
        worker.queues, worker.informed = tuple(queues), True
        text = json.dumps([[10 - n, q.decode()] for n, q in enumerate(queues)]).encode()
        msgid = b"inform-%d" % self.accepted
        self.expect_inform[name] = msgid
        self.send(name, b"", E, b"INFORM", msgid, text, b"worker")
        assert name not in self.expect_inform, "no ACK and HEARTBEAT for an INFORM"

    @rule(name=st.sampled_from(WORKERS))
    def ready(self, name: bytes) -> None:
        worker = self.workers[name]
        if worker.informed:
            worker.free += 1
        self.send(name, b"", E, b"READY", b"r")

    @rule(
        client=st.sampled_from(CLIENTS),
        queue=st.sampled_from(QUEUES),
        reply=st.booleans(),
    )
    def request(self, client: bytes, queue: bytes, reply: bool) -> None:
        self.accepted += 1
        msgid = b"m%d" % self.accepted
        self.waiting[queue].append(Request(client, msgid, queue, reply, self.accepted))
        headers = b"reply-requested" if reply else b"timeout:5"
        self.send(client, b"", E, b"REQUEST", msgid, queue, headers, JOB)

    @precondition(lambda self: any(w.held for w in self.workers.values()))
    @rule(data=st.data())
    def reply(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n, w in self.workers.items() if w.held]))
        worker = self.workers[name]
        msgid = data.draw(st.sampled_from(sorted(worker.held)))
        del worker.held[msgid]
        result = b'{"value": "%s"}' % msgid
        self.results_due[msgid] = result
        self.send(name, b"", E, b"REPLY", b"w-" + msgid, result, msgid)
        assert msgid not in self.results_due, f"no result for {msgid!r}"

    @rule(name=st.sampled_from(WORKERS), word=st.sampled_from([b"KBYE", b"KBAI"]))
    def leave(self, name: bytes, word: bytes) -> None:
        worker = self.workers[name]
        if worker.informed:
            self.give_back(worker)  # EMQP-14, EMQP-16
            worker.informed, worker.queues = False, ()
        self.send(name, b"", E, word, b"bye")

    @rule(peer=st.sampled_from((b"x0", *CLIENTS)), frames=st.sampled_from(GARBAGE))
    def garbage(self, peer: bytes, frames: list[bytes]) -> None:
        self.send(peer, *frames)

    # -- checking ---------------------------------------------------------------------------

    def check_outgoing(self) -> None:
        out = [
            (peer, [bytes(f) for f in frames]) for _, peer, frames in self.broker.take_outgoing()
        ]
        # Receipts may go out before the REQUEST they report (to another peer): REPLYs last.
        out.sort(key=lambda pair: pair[1][2:3] == [b"REPLY"])
        for peer, message in out:
            assert message[:2] == [b"", E], message
            command = message[2]
            if command == b"REQUEST":
                self.check_request(peer, message)
            elif command == b"REPLY":
                self.check_reply(peer, message)
            elif command == b"ACK":
                assert message[4] == self.expect_inform.get(peer), message
            elif command == b"HEARTBEAT":
                # Only right after an ACK here: no timer fires in these runs (EMQP-15).
                assert self.expect_inform.pop(peer, None) is not None, message
            elif command == b"DISCONNECT":
                assert peer == b"x0" or peer in CLIENTS, message  # a bad INFORM (EMQP-04)
            else:
                raise AssertionError(f"unexpected {message!r} to {peer!r}")
        self.broker.flushed()

    def check_request(self, peer: bytes, message: list[bytes]) -> None:
        worker = self.workers.get(peer)
        assert worker is not None, message
        assert worker.informed, f"REQUEST to an uninformed worker: {message!r}"
        msgid, queue, headers, job = message[3:]
        assert queue in worker.queues, message
        assert worker.free > 0, f"REQUEST to {peer!r} with no credit"
        worker.free -= 1
        assert self.waiting[queue], f"nothing was waiting in {queue!r}"
        oldest = self.waiting[queue].popleft()
        assert oldest.msgid == msgid, f"{msgid!r} went before {oldest.msgid!r}"
        assert headers == (b"reply-requested" if oldest.reply else b"timeout:5")
        assert job == JOB
        self.dispatched.add(msgid)
        oldest.attempts += 1
        if oldest.reply:
            worker.held[msgid] = oldest

    def check_reply(self, peer: bytes, message: list[bytes]) -> None:
        msgid = message[-1]
        if len(message) == 5:  # a receipt
            assert msgid in self.dispatched, f"receipt before dispatch: {message!r}"
            assert msgid not in self.receipts, f"second receipt: {message!r}"
            self.receipts.add(msgid)
            return
        if msgid in self.results_due:
            assert message[4] == self.results_due.pop(msgid), message
            return
        assert "error" in json.loads(message[4]), message  # a refused garbage REQUEST

    @invariant()
    def keys_counts_the_routes_not_kept_idle(self) -> None:
        """``keys()`` (counted as routes are made, parked and forgotten) agrees with the routes."""
        assert self.broker.keys() == len(self.broker._routes) - self.broker.idle()

    @invariant()
    def work_is_conserved(self) -> None:
        for queue, waiting in self.waiting.items():
            if waiting:
                free = [n for n, w in self.workers.items() if w.informed and w.free]
                assert not [n for n in free if queue in self.workers[n].queues], (
                    f"{queue!r} has requests waiting while a worker on it has a credit"
                )

    @invariant()
    def every_dispatched_request_had_its_receipt(self) -> None:
        assert self.receipts == self.dispatched


TestEmqpAgainstModel = EmqpMachine.TestCase
