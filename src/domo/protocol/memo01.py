"""``Memo01Broker``: the family broker that also serves memo01 (MemoDB) peers on NNG connections.

memo01 (``specs/memo01.md``) cannot be a stateless frame codec like the ZeroMQ dialects: its
worker speaks only when the broker holds one of its requests (NNG req0), it names itself by an id
the broker gave it rather than by an address, it serves a *set* of services, and each job carries
its own timeout. So this layer sits on ``FamilyBroker``'s public contract without changing it:

- A connection listed in ``memo_connections`` carries memo01. A message on it comes with a
  *token*, the runtime's name for the NNG context that holds that request (the "routing id" of
  an NNG connection, good for one reply); sending ``(token, ())`` releases the context with no
  reply (MEMO-01, MEMO-09).
- Each memo01 worker is known to the core as one MDP/0.2 worker per service of its set (its
  *seats*, routing ids ``b"\\x01" + id + index``); once a seat is given a job the other seats
  are withdrawn, and they come back with its RESULT, so the core's per-service queues and
  least-recently-used dispatch are the service-set queues (MEMO-11). The withdrawals and
  returns are the layer's bookkeeping: their events are not reported.
- Each memo01 JOB is an MDP/0.2 client request of its own (routing id ``b"\\x02" + token``);
  its payload is one body frame and the reply's frames make its RESULT's payload (MEMO-20).
- Its own timers (one heap, as the core's) are the job deadlines (MEMO-12..MEMO-14) and the
  liveness the layer vouches for on a busy worker's behalf (MEMO-12): they fire, in time
  order, before the core sees a later ``now``.

Everything else (queues, dispatch, re-dispatch, heartbeats, MMI, back-pressure, shutdown) is the
core's, so a memo01 worker serves clients of every dialect and a memo01 client reaches workers of
every dialect. Sans-IO like the core: no I/O, no clock, no randomness (the worker-id epoch is
given, MEMO-10).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import cbor2

from . import mdp
from .broker import BrokerConfig
from .dialects import REGISTRY, Dialect, Registry
from .dialects.memo01 import Memo01Message, MessageType, claimed_sender, encode, parse
from .errors import MalformedMessage
from .events import (
    BrokerEvent,
    MessageDropped,
    MmiReplied,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from .family import FamilyBroker, Outgoing
from .mdp import BodyFrame, Relayed
from .timers import DeadlineHeap

__all__ = ["Memo01Broker", "Memo01Config", "body_to_payload", "payload_to_body"]

# How every READY starts (MEMO-01, MEMO-03: the deterministic CBOR of the 4-item array, "memo01",
# type 1): enough to refuse one before reading its names (MEMO-24).
_READY_HEAD: Final = b"\x84\x66memo01\x01"
_SEAT: Final = b"\x01"  # routing id prefix of a memo01 worker's seat (one per service)
_JOB: Final = b"\x02"  # routing id prefix of a memo01 client's job
_READY, _FINAL, _HB, _DISC = mdp.W_READY, mdp.W_FINAL, mdp.W_HEARTBEAT, mdp.W_DISCONNECT
_DEADLINE: Final = 0  # timer kinds
_VOUCH: Final = 1


@dataclass(frozen=True, slots=True)
class Memo01Config:
    """What a memo01-serving broker is told at start.

    - ``epoch``: 4 bytes the runtime draws at random when the broker starts; every worker id
      starts with them, so a restarted broker knows its predecessor's ids (MEMO-10).
    - ``job_timeout``: seconds a memo01 worker has for a job from a client of another dialect,
      which carries no timeout of its own (MEMO-13).
    - ``max_seats``: the services all the workers of one NNG connection may register together
      (a worker offers one seat per service of its set); a READY that would take its connection
      over is refused (MEMO-24).
    """

    epoch: bytes = b"\x00\x00\x00\x00"
    job_timeout: float = 60.0
    max_seats: int = 4096

    def __post_init__(self) -> None:
        if len(self.epoch) != 4:
            raise ValueError("epoch is 4 bytes")
        if not self.job_timeout > 0:
            raise ValueError(f"job_timeout must be > 0, got {self.job_timeout}")
        if self.max_seats < 256:  # MEMO-03: one worker may offer 256 services
            raise ValueError(f"max_seats must be >= 256, got {self.max_seats}")


def payload_to_body(payload: bytes) -> tuple[bytes]:
    """A memo01 payload as an MDP body: one frame, the payload as it is (MEMO-20)."""
    return (payload,)


def body_to_payload(body: Sequence[BodyFrame]) -> bytes:
    """An MDP body as a memo01 payload (MEMO-20): one frame as it is; several (or none) as
    the deterministic CBOR array of their bytes, since memo01 has one payload."""
    if len(body) == 1:
        return bytes(body[0])
    return bytes(cbor2.dumps([bytes(frame) for frame in body], canonical=True))


class _Worker:
    """One memo01 worker: its seats in the core, the request of its the broker holds, its job."""

    __slots__ = (
        "answer",
        "answer_pipe",
        "answer_sent",
        "busy",
        "client",
        "client_key",
        "connection",
        "deadline",
        "id",
        "last",
        "ready_pipe",
        "seated",
        "services",
        "token",
    )

    def __init__(self, ident: bytes, connection: int, services: tuple[str, ...]) -> None:
        self.id = ident
        self.ready_pipe = b""  # the NNG pipe its READY came on: its seats count there (MEMO-24)
        self.connection = connection
        self.services = services
        self.seated: set[int] = set()  # seats registered in the core now
        self.token: bytes | None = None  # its request the broker holds (its NNG context)
        self.busy: int | None = None  # the seat that holds its job
        self.client = b""  # the job's client address, as the core gave it
        self.deadline = 0.0  # when its job's time is up
        self.answer: bytes | None = None  # the JOB it was sent for its last message
        self.answer_pipe = b""  # the NNG pipe that JOB went on
        self.answer_sent = False  # the JOB went out (else it waits for the worker to speak)
        self.client_key = b""  # the core's key of its job's client
        self.last: bytes | None = None  # its last message, as it came (a resend repeats it)

    def seat(self, index: int) -> bytes:
        return _SEAT + self.id + index.to_bytes(2, "big")


class _Job:
    """One memo01 JOB in the core, and every context waiting for its RESULT (MEMO-16)."""

    __slots__ = ("connection", "deadline", "rid", "signature", "timeout", "tokens")

    def __init__(self, connection: int, token: bytes, signature: bytes, timeout: float) -> None:
        self.connection = connection
        self.rid = _JOB + token
        self.tokens = [token]
        self.signature = signature
        self.timeout = timeout
        self.deadline: float | None = None


class Memo01Broker(FamilyBroker):
    """A ``FamilyBroker`` that serves memo01 on the connections in ``memo_connections``.

    >>> broker = Memo01Broker(memo_connections={1})
    >>> ready = encode(MessageType.READY, services=("echo",))
    >>> _ = broker.receive(b"t1", [ready], 0.0, connection=1)
    >>> _ = broker.receive(b"C", [b"MDPC02", b"\\x01", b"echo", b"hi"], 0.1)
    >>> [(c, token, parse(frames[0], from_broker=True).type.name)
    ...  for c, token, frames in broker.take_outgoing()]
    [(1, b't1', 'JOB')]
    """

    def __init__(
        self,
        config: BrokerConfig | None = None,
        registry: Registry = REGISTRY,
        *,
        memo_connections: Iterable[int] = (),
        memo: Memo01Config | None = None,
    ) -> None:
        super().__init__(config, registry)
        self.memo = memo if memo is not None else Memo01Config()
        self.memo_connections = frozenset(memo_connections)
        self._next_worker = 0
        self._workers: dict[bytes, _Worker] = {}  # worker id -> worker
        self._seats_of_pipe: dict[tuple[int, bytes], int] = {}  # its workers' seats (MEMO-24)
        self._seats: dict[bytes, tuple[_Worker, int]] = {}  # core key -> (worker, seat)
        self._jobs: dict[bytes, _Job] = {}  # core key -> job
        self._by_signature: dict[tuple[int, bytes], _Job] = {}  # MEMO-16
        self._own: list[Outgoing] = []  # replies decided here, before the core's
        self._sent: dict[tuple[int, bytes], bytes] = {}  # token sent to -> core key (feedback)
        self._timers: DeadlineHeap[tuple[int, bytes, bytes, float]] = DeadlineHeap()
        self._index_map: list[int | None] = []  # take_outgoing's index -> FamilyBroker's
        # (connection, NNG pipe) -> the ids of workers whose JOB went out on it (MEMO-23)
        self._answered_on: dict[tuple[int, bytes], dict[bytes, None]] = {}
        self._quiet: set[bytes] = set()  # seats whose registry events are bookkeeping

    # -- the sans-IO contract ------------------------------------------------------------------

    def receive(
        self, peer: bytes, frames: Sequence[BodyFrame], now: float, connection: int = 0
    ) -> list[BrokerEvent]:
        """As ``FamilyBroker.receive``; on a memo01 connection ``peer`` is the token of the
        context that holds the message and ``frames`` its one frame."""
        events = self._advance(now)
        if connection not in self.memo_connections:
            self._absorb(super().receive(peer, frames, now, connection), now, events)
            return events
        if not frames:  # the runtime's word that the NNG pipe ``peer`` closed (MEMO-23)
            self._pipe_closed(bytes(peer[:8]), connection, now, events)
            return events
        data = bytes(frames[0]) if len(frames) == 1 else b""
        if data.startswith(_READY_HEAD) and self._full(connection, peer):
            # MEMO-24 before the parse: its connection can take no seat more, and reading 256
            # names costs more than all the rest of refusing them (a READY flood's every READY).
            why = "a READY on an NNG connection whose workers have all the seats it may have"
            events.append(ProtocolViolation(_pipe(peer), "MEMO-24", why, "dropped", now))
            self._reply(connection, peer, None)
            return events
        try:
            message = parse(data) if len(frames) == 1 else _malformed()
        except MalformedMessage as error:
            self._refuse(peer, connection, data, error, now, events)
            return events
        if message.type is MessageType.JOB:
            self._on_job(peer, connection, data, message, now, events)
        elif message.type is MessageType.READY:
            self._on_ready(peer, connection, message, now, events)
        else:
            self._on_worker(peer, connection, data, message, now, events)
        return events

    def tick(self, now: float) -> list[BrokerEvent]:
        events = self._advance(now)
        self._absorb(super().tick(now), now, events)
        return events

    def next_deadline(self) -> float | None:
        core, own = super().next_deadline(), self._timers.earliest()
        if core is None or own is None:
            return own if core is None else core
        return min(core, own)

    def take_outgoing(self) -> list[Outgoing]:
        """As ``FamilyBroker.take_outgoing``; to a memo01 token, ``(connection, token,
        (message,))`` or ``(connection, token, ())`` to release its context without a reply."""
        own, self._own = self._own, []
        self._sent.clear()
        out: list[Outgoing] = own
        self._index_map = [None] * len(own)
        for index, (connection, rid, frames) in enumerate(super().take_outgoing()):
            if connection not in self.memo_connections:
                out.append((connection, rid, frames))
                self._index_map.append(index)
                continue
            for message in self._to_memo(connection, rid, frames):
                out.append(message)
                self._index_map.append(None)
        # What translating decided (a DISCONNECT to a withdrawn seat's worker, say) goes too.
        for message in self._own:
            out.append(message)
            self._index_map.append(None)
        self._own = []
        return out

    def peer_unreachable(
        self, peer: bytes, now: float, connection: int = 0, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        return self._failed(peer, now, connection, unsent, congested=False)

    def peer_congested(
        self, peer: bytes, now: float, connection: int = 0, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        return self._failed(peer, now, connection, unsent, congested=True)

    def shutdown(self, now: float) -> list[BrokerEvent]:
        """As the core's (MDP-W-14): every memo01 worker whose request is held gets DISCONNECT,
        every memo01 client's context is released (MEMO-19)."""
        events = self._advance(now)
        self._absorb(super().shutdown(now), now, events)
        return events

    # -- views ---------------------------------------------------------------------------------

    def memo_workers(self) -> dict[bytes, tuple[str, ...]]:
        """Every registered memo01 worker's id and service set."""
        return {ident: worker.services for ident, worker in self._workers.items()}

    def dialect_of(self, key: bytes) -> str:
        """As ``FamilyBroker.dialect_of``; a memo01 job's or seat's key is ``"memo01"``."""
        if key in self._jobs or key in self._seats:
            return "memo01"
        return super().dialect_of(key)

    def memo_jobs(self) -> int:
        """How many memo01 jobs are outstanding."""
        return len(self._jobs)

    # -- clients -------------------------------------------------------------------------------

    def _on_job(
        self,
        token: bytes,
        connection: int,
        data: bytes,
        message: Memo01Message,
        now: float,
        events: list[BrokerEvent],
    ) -> None:
        same = self._by_signature.get((connection, data))
        if same is not None:  # MEMO-16: the same job again (an NNG resend): it runs once
            same.tokens.append(token)
            return
        job = _Job(connection, token, data, message.timeout_ms / 1000)
        key = self._key(connection, job.rid)
        self._jobs[key] = job
        self._by_signature[connection, data] = job
        frames = (mdp.CLIENT_HEADER, mdp.C_REQUEST, message.service.encode("ascii"))
        body = payload_to_body(message.payload)
        before = len(events)
        self._feed(job.rid, connection, (*frames, *body), now, events)
        route = self._routes.get(key)
        if route is not None:  # its rid is never used again: no idle route is kept for it
            route.once = True
        if not any(
            isinstance(e, RequestQueued | MmiReplied) and e.client == key for e in events[before:]
        ):
            # MEMO-22: refused (a memory bound, MDP-D-25/26): nothing of it is kept, so a
            # resend is a job afresh; its context is released with no reply (MEMO-18).
            self._jobs.pop(key, None)
            self._by_signature.pop((connection, data), None)
            self._reply(connection, token, None)

    def _end_job(self, job: _Job, reply: bytes | None) -> None:
        """The job is over: its contexts get ``reply`` (a RESULT) or are released."""
        key = self._key(job.connection, job.rid)
        if self._jobs.pop(key, None) is None:
            return
        self._by_signature.pop((job.connection, job.signature), None)
        frames: Relayed = () if reply is None else (reply,)
        for token in job.tokens:
            self._own.append((job.connection, token, frames))

    # -- workers -------------------------------------------------------------------------------

    def _full(self, connection: int, token: bytes) -> bool:
        """Whether the workers of ``token``'s NNG connection have every seat it may (MEMO-24)."""
        return self._seats_of_pipe.get((connection, _pipe(token)), 0) >= self.memo.max_seats

    def _on_ready(
        self,
        token: bytes,
        connection: int,
        message: Memo01Message,
        now: float,
        events: list[BrokerEvent],
    ) -> None:
        pipe = (connection, _pipe(token))
        seats = self._seats_of_pipe.get(pipe, 0) + len(message.services)
        if seats > self.memo.max_seats:
            # MEMO-24: one connection's workers may not offer more services than that: each seat
            # costs the core a registration and a place in its queues (issue 27: READYs of 256
            # names without end starved every other peer). Released unanswered, as a refused JOB.
            why = (
                f"a READY of {len(message.services)} services would take its NNG connection to "
                f"{seats} seats, over the {self.memo.max_seats} one connection may have"
            )
            events.append(ProtocolViolation(_pipe(token), "MEMO-24", why, "dropped", now))
            self._reply(connection, token, None)
            return
        self._seats_of_pipe[pipe] = seats
        # MEMO-10: an id nobody had, opaque to the worker; the epoch tells a restart apart.
        self._next_worker = (self._next_worker + 1) & 0xFFFFFFFF
        ident = self.memo.epoch + self._next_worker.to_bytes(4, "big")
        worker = _Worker(ident, connection, message.services)
        worker.token = token
        worker.ready_pipe = _pipe(token)
        self._workers[ident] = worker
        for index in range(len(worker.services)):
            self._seats[self._key(connection, worker.seat(index))] = (worker, index)
        self._seat_all(worker, now, events, quiet=False)

    def _on_worker(
        self,
        token: bytes,
        connection: int,
        data: bytes,
        message: Memo01Message,
        now: float,
        events: list[BrokerEvent],
    ) -> None:
        worker = self._workers.get(message.id)
        if worker is None or worker.connection != connection:
            # MEMO-10, MEMO-14: an id this broker never gave (a predecessor's) or has dropped
            # (a late RESULT): DISCONNECT, and the worker starts again with READY.
            why = f"memo01 {message.type.name} from an unknown worker id; DISCONNECT (MEMO-10)"
            events.append(MessageDropped(None, why, now))
            self._reply(connection, token, encode(MessageType.DISCONNECT, message.id))
            return
        if (
            data == worker.last
            and worker.busy is not None
            and worker.answer_sent
            and worker.answer is not None
            and _pipe(token) != worker.answer_pipe
        ):
            # MEMO-17: its last message again, on another pipe: our answer (its JOB) was lost
            # with the pipe it went on (on one pipe, NNG delivers the JOB or nothing ever
            # comes: the same bytes there are a RESULT that happens to repeat the last).
            self._release_held(worker)
            self._reply(connection, token, worker.answer)
            self._answer_on(worker, _pipe(token))
            return
        held = worker.token
        if held is not None:
            # MEMO-17: an NNG req waits only for the reply to its newest request.
            self._own.append((connection, held, ()))
            worker.token = None
        if message.type is MessageType.DISCONNECT:  # MEMO-08
            self._unseat(worker, now, events, quiet=False)
            self._reply(connection, token, encode(MessageType.DISCONNECT, worker.id))
            return
        resend = data == worker.last
        worker.last = data
        worker.token = token
        if message.type is MessageType.HEARTBEAT and not worker.answer_sent:
            for index in sorted(worker.seated):  # MEMO-15: heard: alive on every seat
                self._feed(worker.seat(index), connection, mdp.HEARTBEAT_FRAMES, now, events)
            if worker.busy is not None and worker.answer is not None:
                # The echo of a HEARTBEAT, while its JOB waited for a request to answer.
                self._reply(connection, token, worker.answer)
                worker.token = None
                self._answer_on(worker, _pipe(token))
                self._job_sent(worker, now)
            return
        if message.type is MessageType.RESULT and worker.answer_sent:
            self._finish(worker, message, now, events)
            return
        if resend:
            return  # MEMO-17: a resend of what the broker already acted on; its context waits
        # MEMO-09: a RESULT with no job, a HEARTBEAT in the middle of one.
        state = "idle" if worker.busy is None else "busy"
        why = f"memo01 {message.type.name} from a worker that is {state}"
        events.append(ProtocolViolation(message.id, "MEMO-09", why, "disconnected", now))
        self._unseat(worker, now, events, quiet=False)
        self._reply(connection, token, encode(MessageType.DISCONNECT, worker.id))

    def _finish(
        self, worker: _Worker, message: Memo01Message, now: float, events: list[BrokerEvent]
    ) -> None:
        """The worker's RESULT is its job's FINAL (MEMO-05); then it is free again, or leaves."""
        index = worker.busy
        assert index is not None
        worker.busy = None
        worker.answer = None
        worker.answer_sent = False
        self._forget_answer_pipe(worker)
        final = (mdp.WORKER_HEADER, _FINAL, worker.client, b"", *payload_to_body(message.payload))
        self._feed(worker.seat(index), worker.connection, final, now, events)
        if message.leaving:  # MEMO-06: it takes no more jobs
            self._unseat(worker, now, events, quiet=False)
            self._release_held(worker, encode(MessageType.DISCONNECT, worker.id))
            return
        if worker.busy is None and worker.id in self._workers:
            self._seat_all(worker, now, events, quiet=True)

    def _seat_all(
        self, worker: _Worker, now: float, events: list[BrokerEvent], *, quiet: bool
    ) -> None:
        """Register the worker's free seats, one at a time: a seat that gets a job at once
        makes the others wait (MEMO-11)."""
        for index, service in enumerate(worker.services):
            if worker.busy is not None or worker.id not in self._workers:
                return
            if index in worker.seated:
                continue
            worker.seated.add(index)
            rid = worker.seat(index)
            if quiet:
                self._quiet.add(self._key(worker.connection, rid))
            ready = (mdp.WORKER_HEADER, _READY, service.encode("ascii"))
            self._feed(rid, worker.connection, ready, now, events)

    def _unseat(
        self,
        worker: _Worker,
        now: float,
        events: list[BrokerEvent],
        *,
        quiet: bool,
        keep: int | None = None,
    ) -> None:
        """Withdraw the worker's seats from the core (all, or all but ``keep``); unless
        ``keep`` is given the worker is forgotten too."""
        if keep is None and self._workers.pop(worker.id, None) is not None:
            pipe = (worker.connection, worker.ready_pipe)
            left = self._seats_of_pipe.get(pipe, 0) - len(worker.services)
            if left > 0:
                self._seats_of_pipe[pipe] = left
            else:
                self._seats_of_pipe.pop(pipe, None)
        for index in sorted(worker.seated):
            if index == keep:
                continue
            worker.seated.discard(index)
            rid = worker.seat(index)
            if quiet:
                self._quiet.add(self._key(worker.connection, rid))
            self._feed(rid, worker.connection, mdp.DISCONNECT_FRAMES, now, events)
        if keep is None:
            self._forget_answer_pipe(worker)
            for index in range(len(worker.services)):
                self._seats.pop(self._key(worker.connection, worker.seat(index)), None)

    def _answer_on(self, worker: _Worker, pipe: bytes) -> None:
        """The worker's JOB went out on NNG pipe ``pipe``: if that pipe closes before its
        RESULT, the worker is gone (MEMO-23)."""
        self._forget_answer_pipe(worker)
        worker.answer_pipe = pipe
        self._answered_on.setdefault((worker.connection, pipe), {})[worker.id] = None

    def _forget_answer_pipe(self, worker: _Worker) -> None:
        ids = self._answered_on.get((worker.connection, worker.answer_pipe))
        if ids is not None:
            ids.pop(worker.id, None)
            if not ids:
                del self._answered_on[worker.connection, worker.answer_pipe]
        worker.answer_pipe = b""

    def _pipe_closed(
        self, pipe: bytes, connection: int, now: float, events: list[BrokerEvent]
    ) -> None:
        """MEMO-23: NNG pipe ``pipe`` closed: a worker whose JOB went out on it and that has
        not answered is gone (SIGKILLed, say): its job goes back to its queue now, not at its
        timeout (MDP-D-08)."""
        for ident in list(self._answered_on.pop((connection, pipe), ())):
            worker = self._workers.get(ident)
            if worker is None or worker.busy is None or not worker.answer_sent:
                continue
            worker.answer_pipe = b""
            why = f"memo01 worker {ident.hex()}'s NNG pipe closed while it held a job (MEMO-23)"
            events.append(MessageDropped(None, why, now))
            worker.busy = None
            self._release_held(worker)
            self._unseat(worker, now, events, quiet=False)

    def _release_held(self, worker: _Worker, reply: bytes | None = None) -> None:
        if worker.token is not None:
            self._reply(worker.connection, worker.token, reply)
            worker.token = None

    def _reply(self, connection: int, token: bytes, message: bytes | None) -> None:
        self._own.append((connection, token, () if message is None else (message,)))

    # -- malformed input -----------------------------------------------------------------------

    def _refuse(
        self,
        token: bytes,
        connection: int,
        data: bytes,
        error: MalformedMessage,
        now: float,
        events: list[BrokerEvent],
    ) -> None:
        """MEMO-18: a worker's malformed message gets DISCONNECT (it starts again), anything
        else (a client's, or garbage) is dropped and its context released with no reply."""
        kind, ident = claimed_sender(data)
        worker = self._workers.get(ident) if ident else None
        is_worker = kind in (MessageType.RESULT, MessageType.HEARTBEAT, MessageType.READY)
        # The peer to blame is the worker it claims to be, else the NNG pipe it came on: never
        # None, which a broker's log reads as the broker itself (issue 27, finding 8).
        culprit = ident or _pipe(token)
        if is_worker:
            violation = ProtocolViolation(culprit, error.rule, str(error), "disconnected", now)
        else:
            violation = ProtocolViolation(culprit, error.rule, str(error), "dropped", now)
        events.append(violation)
        if worker is not None and worker.connection == connection:
            self._release_held(worker)
            self._unseat(worker, now, events, quiet=False)
        self._reply(connection, token, encode(MessageType.DISCONNECT, ident) if is_worker else None)

    # -- the core's side -----------------------------------------------------------------------

    def _key(self, connection: int, rid: bytes) -> bytes:
        return rid if connection == 0 else self._key_of(rid, (), Dialect.MDP02, connection)

    def _feed(
        self,
        rid: bytes,
        connection: int,
        frames: Relayed,
        now: float,
        events: list[BrokerEvent],
    ) -> None:
        """One MDP/0.2 message to the core on behalf of a memo01 peer."""
        at = max(now, self.core.now)
        self._absorb(FamilyBroker.receive(self, rid, frames, at, connection), at, events)

    def _absorb(self, new: list[BrokerEvent], now: float, events: list[BrokerEvent]) -> None:
        """Act on what the core did to memo01 peers; report every event but bookkeeping."""
        for event in new:
            if isinstance(event, WorkerRegistered | WorkerDisconnected) and self._hush(
                event.worker
            ):
                continue
            events.append(event)
            if isinstance(event, RequestDispatched):
                self._dispatched(event, now, events)
            elif isinstance(event, RequestExpired | RequestDropped):
                job = self._jobs.get(event.client)
                if job is not None:
                    self._end_job(job, None)  # MEMO-18: no error reply; the context is freed
            elif isinstance(event, RequestCompleted):
                self._jobs.pop(event.client, None)
            elif isinstance(event, WorkerExpired | WorkerDisconnected):
                seat = self._seats.get(event.worker)
                if seat is not None and seat[1] in seat[0].seated:
                    # The core dropped a seat on its own (expiry, shutdown): the worker is gone.
                    worker, index = seat
                    worker.seated.discard(index)
                    if worker.busy == index:
                        worker.busy = None
                    self._unseat(worker, now, events, quiet=True)
                    self._release_held(worker, encode(MessageType.DISCONNECT, worker.id))

    def _hush(self, key: bytes) -> bool:
        """Whether an event about seat ``key`` is the layer's own bookkeeping (once)."""
        if key in self._quiet:
            self._quiet.discard(key)
            return True
        return False

    def _dispatched(self, event: RequestDispatched, now: float, events: list[BrokerEvent]) -> None:
        job = self._jobs.get(event.client)
        seat = self._seats.get(event.worker)
        if seat is None:
            if job is not None:  # a worker of another dialect: the job's clock runs now
                self._start_clock(job, event.client, event.worker, None, now)
            return
        worker, index = seat
        if worker.busy is not None:
            # Two seats got jobs in one go (the core's batch): the first kept its job and
            # withdrew this seat, so the core has taken this job back already (MDP-D-08; its
            # REQUEST is not translated, `_to_memo`). Were it still seated, hand it back now.
            if index in worker.seated:
                worker.seated.discard(index)
                self._quiet.add(event.worker)
                self._feed(
                    worker.seat(index), worker.connection, mdp.DISCONNECT_FRAMES, now, events
                )
            return
        worker.busy = index
        worker.client_key = event.client
        worker.answer = None
        worker.answer_sent = False
        self._unseat(worker, now, events, quiet=True, keep=index)  # MEMO-11
        # The JOB goes out (and its clock starts, MEMO-12) when it is translated, on the
        # worker's held request; a worker answering a HEARTBEAT holds none until its echo.

    def _job_sent(self, worker: _Worker, now: float) -> None:
        """The worker's JOB went out: its deadline runs from now (MEMO-12, MEMO-13)."""
        worker.answer_sent = True
        assert worker.busy is not None
        key = self._key(worker.connection, worker.seat(worker.busy))
        self._start_clock(self._jobs.get(worker.client_key), worker.client_key, key, worker, now)

    def _start_clock(
        self, job: _Job | None, client: bytes, key: bytes, worker: _Worker | None, now: float
    ) -> None:
        timeout = job.timeout if job is not None else self.memo.job_timeout
        deadline = now + timeout  # MEMO-12, MEMO-13
        if job is not None:
            job.deadline = deadline
        self._timers.push(deadline, (_DEADLINE, client, key, deadline))
        if worker is not None:
            worker.deadline = deadline
            # The core heard it last when it asked for work, maybe most of a liveness span
            # ago: vouch for it at once (at the next input, before the core's clock moves on).
            self._timers.push(now, (_VOUCH, b"", key, deadline))

    def _vouch(self, worker: _Worker, key: bytes, now: float) -> None:
        """MEMO-12: a busy memo01 worker cannot heartbeat; the layer does, until its deadline."""
        at = now + self.config.heartbeat_interval
        if at < worker.deadline:
            self._timers.push(at, (_VOUCH, b"", key, worker.deadline))

    def _advance(self, now: float) -> list[BrokerEvent]:
        """Fire the layer's timers due by ``now``, in time order, each at its own time."""
        events: list[BrokerEvent] = []
        for due, (kind, client, key, deadline) in self._timers.pop_due(now):
            at = max(due, self.core.now)
            seat = self._seats.get(key)
            if kind == _VOUCH:
                if seat is not None and seat[0].busy == seat[1] and seat[0].deadline == deadline:
                    worker, index = seat
                    self._feed(
                        worker.seat(index), worker.connection, mdp.HEARTBEAT_FRAMES, at, events
                    )
                    self._vouch(worker, key, at)
                continue
            job = self._jobs.get(client)
            if job is not None and job.deadline == deadline:
                # MEMO-13: the job's time is up: its contexts are released, the request dropped.
                why = f"memo01 job's {job.timeout:g} s timeout passed (MEMO-13)"
                events.append(MessageDropped(client, why, at))
                self._end_job(job, None)
                self._absorb(super().peer_unreachable(job.rid, at, job.connection), at, events)
            if (
                seat is not None
                and seat[0].busy == seat[1]
                and seat[0].client_key == client  # this job's, not an earlier one's
                and seat[0].deadline == deadline
            ):
                # MEMO-12: a busy worker past its job's timeout is gone; a late RESULT will get
                # DISCONNECT (MEMO-14).
                worker, index = seat
                why = f"memo01 worker {worker.id.hex()} past its job's timeout; dropped (MEMO-12)"
                events.append(MessageDropped(key, why, at))
                worker.busy = None
                self._unseat(worker, at, events, quiet=False)
        return events

    # -- what the core sends -------------------------------------------------------------------

    def _to_memo(self, connection: int, rid: bytes, frames: Relayed) -> list[Outgoing]:
        key = self._key(connection, rid)
        if rid[:1] == _JOB:
            job = self._jobs.get(key)
            if job is None or frames[1] != mdp.C_FINAL:
                return []  # a PARTIAL: memo01 has none, its client gets the RESULT alone
            payload = body_to_payload(frames[3:])
            result = encode(MessageType.RESULT, b"", payload)
            self._jobs.pop(key, None)
            self._by_signature.pop((job.connection, job.signature), None)
            return [(connection, token, (result,)) for token in job.tokens]
        seat = self._seats.get(key)
        if seat is None:
            return []  # a seat already withdrawn (a DISCONNECT the core sends it, say)
        worker, index = seat
        command = frames[1]
        message: bytes | None
        if command == mdp.W_REQUEST:
            if index != worker.busy or frames[2] != worker.client_key:
                # MEMO-11: a REQUEST to a seat the layer withdrew after the core had dispatched
                # to it (two seats of one worker got jobs in one go: `_requeue_lost`). The core
                # took that job back with the seat and re-dispatches it; the worker's one job
                # is the one its busy seat holds, so this stale REQUEST is not its JOB.
                return []
            worker.client = bytes(frames[2])
            job = self._jobs.get(frames[2]) if isinstance(frames[2], bytes) else None
            timeout = job.timeout if job is not None else self.memo.job_timeout
            message = encode(
                MessageType.JOB,
                worker.id,
                body_to_payload(frames[4:]),
                service=worker.services[index],
                timeout_ms=max(1, round(timeout * 1000)),
            )
            worker.answer = message
        elif command == _HB:
            if worker.busy is not None or worker.token is None:
                return []  # MEMO-15: answered already, or busy (the layer vouches)
            message = encode(MessageType.HEARTBEAT, worker.id)
        elif command == _DISC:
            message = encode(MessageType.DISCONNECT, worker.id)
            worker.seated.discard(index)
            self._unseat(worker, self.core.now, [], quiet=True)
        else:
            return []
        token = worker.token
        if token is None:
            return []  # MEMO-12: a JOB waits for the worker's next request (kept as its answer)
        worker.token = None
        if command == mdp.W_REQUEST:
            self._answer_on(worker, _pipe(token))
            self._job_sent(worker, self.core.now)
        self._sent[connection, token] = key
        return [(connection, token, (message,))]

    # -- I/O feedback --------------------------------------------------------------------------

    def _failed(
        self, peer: bytes, now: float, connection: int, unsent: int | None, *, congested: bool
    ) -> list[BrokerEvent]:
        events = self._advance(now)
        report = FamilyBroker.peer_congested if congested else FamilyBroker.peer_unreachable
        if connection not in self.memo_connections:
            at = None if unsent is None else self._index_map[unsent]
            self._absorb(report(self, peer, now, connection, unsent=at), now, events)
            return events
        key = self._sent.get((connection, peer))
        seat = None if key is None else self._seats.get(key)
        if seat is None:
            # A RESULT or a release: the job is over here; its client will resend (MEMO-19).
            why = "memo01 reply not sent: " + ("congested" if congested else "unreachable")
            events.append(MessageDropped(None, why, now))
            return events
        worker = seat[0]  # its JOB or HEARTBEAT did not reach it: it is gone (MDP-D-15)
        worker.busy = None
        self._unseat(worker, now, events, quiet=False)
        return events


def _pipe(token: bytes) -> bytes:
    """The NNG pipe a token's request came on: its first 8 bytes (MEMO-01)."""
    return token[:8]


def _malformed() -> Memo01Message:
    raise MalformedMessage("a memo01 message is one frame", "MEMO-01")
