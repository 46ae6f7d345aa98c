"""memo01 on the family core, as a Hypothesis state machine checked against a model of its own.

Workers with service sets, clients with jobs and timeouts, time, leaving, DISCONNECT and crashed
workers, in any order; after every step what ``Memo01Broker`` sent is checked against a model
that knows only the spec (``specs/memo01.md``), not the broker's tables:

- every NNG token is answered at most once, and at shutdown every token is answered (MEMO-19);
- a JOB goes only to a worker that is waiting (its request held), not busy, and serves the
  service; the job is one a client sent and nobody is running (MEMO-11, MEMO-16);
- a RESULT reaches a client only with what the worker answered for that very job, and only
  before the job's deadline (MEMO-05, MEMO-13, MEMO-14); one the worker sends before that
  deadline does reach it, at once (MEMO-05);
- a job's context is released without a reply only when the job expired in its queue, passed
  its deadline or used up its re-dispatches (MEMO-18, MDP-C-11, MDP-D-08);
- a waiting worker is answered HEARTBEAT only when idle (MEMO-12, MEMO-15), and no job waits
  for a service while a worker of that service is idle and waiting (work conservation,
  MDP-A-03);
- a crashed (silent) worker is never sent a job once it is past liveness (MEMO-15).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import pytest

pytest.importorskip("cbor2")  # the `nng` extra

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from domo.protocol import BrokerConfig
from domo.protocol.dialects.memo01 import Memo01Message, MessageType, encode, parse
from domo.protocol.events import BrokerEvent, RequestDispatched, RequestQueued
from domo.protocol.memo01 import Memo01Broker, Memo01Config

NNG = 1
INTERVAL, LIVENESS, EXPIRY, REDISPATCHES = 1.0, 3, 10.0, 2
SERVICES = ("a", "b", "cc")


@dataclass
class Job:
    payload: bytes
    service: str
    timeout: float
    token: bytes
    queued_at: float
    attempts: int = 0  # JOBs seen
    dispatches: int = 0  # times the broker handed it to a worker (its events say)
    deadline: float | None = None  # of the current attempt
    worker: int | None = None
    done: bool = False


@dataclass
class Worker:
    number: int
    services: tuple[str, ...]
    ident: bytes = b""
    waiting: bytes | None = None  # the token of its request the broker has not answered
    job: Job | None = None
    result: bytes = b""  # what it answered for its job
    alive: bool = True  # False: crashed, silent from then on
    silent_since: float = 0.0
    leaving: bool = False
    gone: bool = False  # left for good (leaving flag honoured)


@dataclass
class Model:
    now: float = 0.0
    tokens: int = 0
    answered: set[bytes] = field(default_factory=set)
    workers: list[Worker] = field(default_factory=list)
    jobs: dict[bytes, Job] = field(default_factory=dict)  # token -> job
    by_payload: dict[bytes, Job] = field(default_factory=dict)


class Memo01Machine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        config = BrokerConfig(
            heartbeat_interval=INTERVAL,
            liveness=LIVENESS,
            request_expiry=EXPIRY,
            max_redispatches=REDISPATCHES,
        )
        self.broker = Memo01Broker(config, memo_connections={NNG}, memo=Memo01Config(epoch=b"TEST"))
        self.model = Model()
        self.stopping = False  # shutdown releases every job (MEMO-19)
        self.pending_token = b""
        self.owner: dict[bytes, Worker | Job] = {}
        self.core_keys: dict[bytes, Job] = {}  # the core's key of each job's request

    # -- helpers ---------------------------------------------------------------------------------

    def token(self) -> bytes:
        self.model.tokens += 1
        return b"\x00" * 7 + b"\x01" + self.model.tokens.to_bytes(8, "big")

    def send_worker(self, worker: Worker, message: bytes) -> None:
        token = self.token()
        if worker.waiting is not None:
            self.owner[worker.waiting] = worker  # may be released: it is superseded
        worker.waiting = token
        self.owner[token] = worker
        self.note(self.broker.receive(token, [message], self.model.now, NNG))
        self.drain()

    def note(self, events: list[BrokerEvent]) -> None:
        """Dispatches the model cannot see (to a worker whose JOB waits, MEMO-12)."""
        for event in events:
            if isinstance(event, RequestQueued):
                job = self.model.jobs.get(self.pending_token)
                if job is not None:
                    self.core_keys[event.client] = job
            elif isinstance(event, RequestDispatched) and event.client in self.core_keys:
                # The highest attempt, not the last event's: the layer reports what it made the
                # core do amid the core's own events, so a dispatch to a seat it had just
                # withdrawn (MEMO-11) can come after the job's re-dispatch (issue 23).
                job = self.core_keys[event.client]
                job.dispatches = max(job.dispatches, event.attempt)

    def drain(self) -> None:
        """Check what the broker sent; peers answer HEARTBEAT and DISCONNECT at once."""
        while True:
            sent = self.broker.take_outgoing()
            self.broker.flushed()
            if not sent:
                return
            follow_ups: list[tuple[Worker, bytes]] = []
            for connection, token, frames in sent:
                assert connection == NNG
                assert token not in self.model.answered, "a token answered twice"
                self.model.answered.add(token)
                owner = self.owner[token]
                reply = parse(bytes(frames[0]), from_broker=True) if frames else None
                if isinstance(owner, Job):
                    self.client_got(owner, token, reply)
                else:
                    follow = self.worker_got(owner, token, reply)
                    if follow is not None:
                        follow_ups.append((owner, follow))
            for worker, message in follow_ups:
                token = self.token()
                worker.waiting = token
                self.owner[token] = worker
                self.note(self.broker.receive(token, [message], self.model.now, NNG))

    def client_got(self, job: Job, token: bytes, reply: Memo01Message | None) -> None:
        assert not job.done, "a second answer for one job"
        job.done = True
        if reply is not None:
            assert reply.type is MessageType.RESULT
            assert job.worker is not None
            assert job.deadline is not None
            worker = self.model.workers[job.worker]
            assert reply.payload == job.payload[::-1], "a RESULT for another job"
            assert self.model.now <= job.deadline + 1e-9, "a RESULT after the deadline (MEMO-14)"
            assert worker.result == reply.payload
            return
        now = self.model.now
        expired = job.deadline is None and now >= job.queued_at + EXPIRY
        timed_out = job.deadline is not None and now >= job.deadline - 1e-9
        exhausted = job.dispatches > REDISPATCHES  # the last loss ends it (MDP-D-08)
        assert expired or timed_out or exhausted or self.stopping, (
            f"job released without cause at {now}: {job}"
        )

    def worker_got(self, worker: Worker, token: bytes, reply: Memo01Message | None) -> bytes | None:
        if reply is None:
            assert token != worker.waiting, "a worker's newest request released without reply"
            return None
        assert token == worker.waiting, "a reply to a worker's superseded request"
        worker.waiting = None
        ready = encode(MessageType.READY, services=worker.services)
        if not worker.alive:  # its process is gone: the reply goes nowhere
            assert reply.type is not MessageType.JOB or worker.job is None
            if reply.type is MessageType.JOB:  # sent before the broker could know
                job = self.model.by_payload[reply.payload]
                job.attempts += 1
                job.worker = worker.number
                job.deadline = self.model.now + job.timeout
                worker.job = job
            return None
        if reply.type is MessageType.DISCONNECT:
            if worker.job is not None:
                worker.job.worker = None  # it may be dispatched again (MDP-D-08)
                worker.job = None
            worker.ident = b""
            if worker.leaving or not worker.alive:
                worker.gone = True
                return None
            return ready  # MEMO-10: start again
        if worker.ident:
            assert reply.id == worker.ident, "the worker's id changed"
        worker.ident = reply.id
        if reply.type is MessageType.HEARTBEAT:
            assert worker.job is None, "HEARTBEAT to a busy worker (MEMO-12)"
            return encode(MessageType.HEARTBEAT, worker.ident)
        assert reply.type is MessageType.JOB
        assert worker.job is None, "a second job for a busy worker (MEMO-11)"
        assert reply.service in worker.services
        sent = self.model.by_payload.get(reply.payload)
        assert sent is not None, "a job no client sent"
        job = sent
        assert not job.done, "a job that is done"
        assert job.worker is None, "a job running elsewhere"
        assert job.service == reply.service
        assert reply.timeout_ms == round(job.timeout * 1000)
        job.attempts += 1
        job.worker = worker.number
        job.deadline = self.model.now + job.timeout
        worker.job = job
        return None

    # -- rules -----------------------------------------------------------------------------------

    @rule(services=st.sets(st.sampled_from(SERVICES), min_size=1, max_size=3))
    def add_worker(self, services: set[str]) -> None:
        worker = Worker(len(self.model.workers), tuple(sorted(services)))
        self.model.workers.append(worker)
        self.send_worker(worker, encode(MessageType.READY, services=worker.services))

    @rule(
        service=st.sampled_from((*SERVICES, "none")),
        timeout_ms=st.sampled_from((500, 2000, 20000)),
    )
    def submit(self, service: str, timeout_ms: int) -> None:
        token = self.token()
        payload = b"job-%d" % self.model.tokens  # unique: no MEMO-16 joining here
        job = Job(payload, service, timeout_ms / 1000, token, self.model.now)
        self.model.jobs[token] = job
        self.model.by_payload[payload] = job
        self.owner[token] = job
        message = encode(MessageType.JOB, b"", payload, service=service, timeout_ms=timeout_ms)
        self.pending_token = token
        self.note(self.broker.receive(token, [message], self.model.now, NNG))
        self.drain()

    def busy(self) -> list[Worker]:
        return [w for w in self.model.workers if w.alive and w.job is not None and not w.gone]

    @precondition(lambda self: bool(self.busy()))
    @rule(data=st.data(), leaving=st.booleans())
    def finish(self, data: st.DataObject, leaving: bool) -> None:
        worker = data.draw(st.sampled_from(self.busy()))
        job = worker.job
        assert job is not None
        worker.result = job.payload[::-1]
        worker.job = None
        worker.leaving = leaving
        message = encode(MessageType.RESULT, worker.ident, worker.result, leaving=leaving or None)
        if leaving:
            worker.leaving = True
        in_time = job.deadline is not None and self.model.now < job.deadline - 1e-9
        self.send_worker(worker, message)
        if in_time:  # MEMO-05: the busy worker's RESULT is its job's FINAL
            assert job.done, "a RESULT in time never reached its client (MEMO-05)"

    def idle(self) -> list[Worker]:
        return [
            w for w in self.model.workers if w.alive and w.job is None and w.ident and not w.gone
        ]

    @precondition(lambda self: bool(self.idle()))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(self.idle()))
        worker.leaving = True
        self.send_worker(worker, encode(MessageType.DISCONNECT, worker.ident))

    @precondition(lambda self: any(w.alive and not w.gone for w in self.model.workers))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        worker = data.draw(
            st.sampled_from([w for w in self.model.workers if w.alive and not w.gone])
        )
        worker.alive = False
        worker.silent_since = self.model.now

    @rule(dt=st.sampled_from((0.1, 0.4, 1.1, 2.5, 6.0)))
    def advance(self, dt: float) -> None:
        self.model.now += dt
        self.note(self.broker.tick(self.model.now))
        self.drain()

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def work_is_conserved(self) -> None:
        """No job waits for a service while a worker of it is idle and waiting (MDP-A-03)."""
        waiting_for = {
            job.service for job in self.model.jobs.values() if not job.done and job.worker is None
        }
        # A worker that holds no request (its HEARTBEAT's echo has not come: here, a crashed
        # one) may have been given a job that waits for it (MEMO-12): such a service is excused.
        excused = {
            service
            for worker in self.model.workers
            if worker.job is None and worker.waiting is None and not worker.gone
            for service in worker.services
        }
        for worker in self.model.workers:
            if worker.alive and worker.job is None and worker.waiting is not None and worker.ident:
                stuck = (waiting_for - excused) & set(worker.services)
                assert not stuck, (worker, waiting_for)

    @invariant()
    def nothing_goes_to_a_worker_long_silent(self) -> None:
        """A crashed worker is dropped within liveness x interval plus a heartbeat (MEMO-15)."""
        for worker in self.model.workers:
            silent_long = self.model.now > worker.silent_since + (LIVENESS + 1) * INTERVAL
            if not worker.alive and worker.job is None and worker.ident and silent_long:
                assert worker.ident not in self.broker.memo_workers(), worker

    def teardown(self) -> None:
        self.stopping = True
        self.note(self.broker.shutdown(self.model.now))
        self.drain()
        for job in self.model.jobs.values():
            assert job.done, f"a job's context never answered (MEMO-19): {job}"
        for worker in self.model.workers:
            if worker.alive and not worker.gone and worker.waiting is not None:
                # At shutdown the held request got DISCONNECT; the peer's READY after it is
                # the only request left, to a broker that is gone.
                assert worker.ident == b"", worker


Memo01Machine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_memo01_state_machine = Memo01Machine.TestCase


# -- regressions: runs Hypothesis found (issue 23), replayed step by step ---------------------


class _Pick:
    """A rule's ``data`` that draws the one value the replay names."""

    def __init__(self, value: object) -> None:
        self.value = value

    def draw(self, strategy: object) -> object:
        return self.value


def _step(machine: Memo01Machine) -> None:
    machine.work_is_conserved()
    machine.nothing_goes_to_a_worker_long_silent()


def _two_lost_jobs(machine: Memo01Machine, *also: set[str]) -> list[Worker]:
    """X1 {a} and X2 {b} fall silent, each is given a job while it awaits its HEARTBEAT's
    echo; at their expiry the core hands both jobs in one go to W {a, b}'s two seats."""
    for services in ({"a"}, {"b"}, {"a", "b"}, *also):
        machine.add_worker(services)
        _step(machine)
    x1, x2 = machine.model.workers[:2]
    machine.crash(cast(st.DataObject, _Pick(x1)))
    machine.crash(cast(st.DataObject, _Pick(x2)))
    machine.advance(1.1)  # HEARTBEATs; only W (and the others) echo
    _step(machine)
    machine.submit("a", 20000)  # to X1, idle longest: its JOB waits for an echo
    machine.submit("b", 20000)  # to X2, likewise
    _step(machine)
    return machine.model.workers


def test_a_result_goes_to_its_jobs_client_after_two_seats_got_jobs_at_once() -> None:
    """MEMO-11, MEMO-05: W runs the job of the seat it kept; its RESULT is that job's. The
    REQUEST already queued to the seat it gave back became its JOB and client before the fix:
    the RESULT went as the other job's FINAL (MDP-D-13) and was lost, and the model, which did
    not check a RESULT in time arrives, only saw it later as "a job running elsewhere"."""
    machine = Memo01Machine()
    w = _two_lost_jobs(machine)[2]
    machine.advance(2.5)  # t=3.6: X1 and X2 expire, both jobs go to W
    _step(machine)
    assert w.job is not None
    assert w.job.service == "b"
    machine.finish(cast(st.DataObject, _Pick(w)), leaving=False)
    _step(machine)
    assert w.job is not None
    assert w.job.service == "a"
    machine.teardown()


def test_a_dispatch_reported_after_the_jobs_redispatch_still_counts() -> None:
    """MDP-D-08 as the model reads it: the job given back by W's withdrawn seat (attempt 2)
    is re-dispatched at once to V (attempt 3), and the layer reports that before the core's
    dispatch to W's seat. V, silent, expires with the JOB unsent: the job's third loss by
    the core's count ends it (`redispatch-limit`). The model took the last event's attempt
    (2) and called the release "without cause", the lead's trace of issue 23."""
    machine = Memo01Machine()
    v = _two_lost_jobs(machine, {"a"})[3]
    machine.crash(cast(st.DataObject, _Pick(v)))  # after its echo: it awaits the next one
    for _ in range(3):  # t=2.2, 3.3 (X1, X2 expire), 4.4 (V expires)
        machine.advance(1.1)
        _step(machine)
    (job,) = (job for job in machine.model.jobs.values() if job.service == "a")
    assert job.done
    assert job.dispatches == 3
    machine.teardown()
