"""``EmqpLayer``: how ``FamilyBroker`` serves eMQP/1.0 peers through the routing core.

eMQP (``specs/emqp-1.0.md``) needs what MDP's frames do not carry: a worker with several
execution slots, credited one READY at a time, listening on several queues; message ids the
broker must echo; an ACK, a "submitted" receipt, a result only when asked for; heartbeats the
broker sends first. The layer keeps that state and speaks to the core in the core's neutral
terms, so routing, queueing, expiry and re-dispatch stay the core's (one implementation for
every dialect):

- A *slot* (one READY, EMQP-06) is a group of seats (``layers.seats``): one single-use core
  registration per queue of its worker, so the core's per-service queues and
  least-recently-used dispatch serve eMQP's queues as they serve MDP services; when the core
  hands one of them a request the others are withdrawn, and the core ends that one with the
  request (EMQP-07): credits are never spent twice and never kept after use.
- A client's request is a core client under a key made from its MSGID (EMQP-08), so one client
  may have any number outstanding, as its ``DialectCodec.request_key`` says.
- What the core sends to these keys is translated back (``encode``): REQUEST with the client's
  MSGID, queue and headers to the worker (EMQP-10); FINAL as the result to a client that asked
  (EMQP-12); heartbeats and DISCONNECTs to slots are the layer's own business and go nowhere.
- What the layer itself sends (ACK, HEARTBEAT, receipts, refusals, KBYE) goes out through the
  host (``LayerHost.send``), before the core's messages.
- A worker's liveness is one clock, the layer's (EMQP-15): the core neither times nor
  heartbeats its slots.

Like the core, the layer is driven by calls: no I/O, no clock, no randomness. Message ids it
makes are ``domo-<n>`` from a counter (EMQP-24).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, cast

from ..commands import Command, CoreCommand, Role
from ..dialects.base import RouteView
from ..dialects.emqp import (
    ACK,
    DISCONNECT,
    EMQP,
    EMQP_HEADER,
    HEARTBEAT,
    INFORM,
    KBAI,
    KBYE,
    PUBLISH,
    READY,
    REPLY,
    REQUEST,
    SCHEDULE,
    UNSCHEDULE,
    BadInput,
    check_job,
    check_msgid,
    check_request,
    error_body,
    parse_queues,
    reply_requested,
)
from ..events import (
    BrokerEvent,
    MessageDropped,
    MmiReplied,
    ProtocolViolation,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    WorkerDisconnected,
    WorkerExpired,
)
from ..mdp import BodyFrame, Relayed
from ..timers import DeadlineHeap
from .base import LayerHost
from .seats import Seat, Seats

__all__ = ["MAX_CREDITS", "EmqpLayer", "credit_cap"]

MAX_CREDITS: Final = 64  # free slots one worker may hold (EMQP-06); EventMQ's default is 4
# Messages of a worker's pipe kept free of REQUESTs: its ACK and a HEARTBEAT (EMQP-06).
_PIPE_RESERVE: Final = 2


def credit_cap(pipe_messages: int) -> int:
    """The free slots one worker may hold with pipes of ``pipe_messages`` (EMQP-06).

    As many REQUESTs as a worker has free slots may go to it in one burst, and one its full
    pipe refuses drops it as congested (MDP-D-15) with jobs receipted but not delivered. A
    ZeroMQ pipe learns what its reader took only every ``lwm`` messages (half its high-water
    mark), so a burst is sure of ``hwm - lwm + 1`` places, not ``hwm``; two are kept back.
    """
    lwm = (pipe_messages + 1) // 2 if pipe_messages <= 2048 else pipe_messages - 1024
    return max(1, min(MAX_CREDITS, pipe_messages - lwm + 1 - _PIPE_RESERVE))


_WORKER, _CLIENT = Role.WORKER, Role.CLIENT
_REGISTER, _REQUEST, _FINAL = Command.REGISTER, Command.REQUEST, Command.FINAL
_SLOT_TAG: Final = b"\x00slot:"  # a slot's seats' request keys: tag, slot number, queue
_LEAVING = (KBYE, KBAI, DISCONNECT)
_REFUSED = {
    SCHEDULE: "SCHEDULE is not supported by this broker: run jobs on a timer in the client",
    UNSCHEDULE: "UNSCHEDULE is not supported by this broker: nothing is scheduled here",
    PUBLISH: "PUBLISH is not supported by this broker: it has no pub-sub device",
}

Address = tuple[int, bytes]  # (connection, routing id)


@dataclass(eq=False, slots=True)
class _Worker:
    """An eMQP worker that sent INFORM: its queues, its live slots, its jobs with a result due."""

    address: Address
    queues: tuple[tuple[int, bytes], ...]
    last_heard: float
    heartbeat_due: float
    timer_at: float = 0.0
    jobs: dict[bytes, tuple[bytes, bytes]] = field(default_factory=dict)  # msgid -> (key, client)


@dataclass(frozen=True, slots=True)
class _Job:
    """A request on its way to an eMQP worker, for ``encode``."""

    msgid: bytes
    queue: bytes
    headers: bytes


@dataclass(frozen=True, slots=True)
class _Asked:
    """An eMQP client's outstanding request: what its answers need."""

    msgid: bytes
    headers: bytes
    reply: bool
    address: Address


class EmqpLayer:
    """eMQP/1.0 peers for a ``FamilyBroker`` (see the module docstring)."""

    def __init__(self, host: LayerHost) -> None:
        self._host = host
        self._core = host.core
        config = host.core.config
        self._interval = config.heartbeat_interval
        self._span = config.expiry_span
        self.max_credits = credit_cap(config.pipe_messages)
        """The free slots one worker may hold (EMQP-06)."""
        self._workers: dict[Address, _Worker] = {}
        self._seats = Seats(host, EMQP)  # every worker's slots, as groups of seats
        self._outgoing: dict[bytes, _Job] = {}  # slot key -> the request the core just gave it
        self._asked: dict[bytes, _Asked] = {}  # eMQP client key -> its request
        self._timers: DeadlineHeap[_Worker] = DeadlineHeap()
        self._last_id = 0

    # -- what FamilyBroker calls ------------------------------------------------------------

    def receive(
        self, peer: bytes, message: Sequence[BodyFrame], now: float, connection: int
    ) -> list[BrokerEvent]:
        """One eMQP message (the frames after the empty delimiter: header, command, ...)."""
        events: list[BrokerEvent] = []
        command = bytes(message[1]) if len(message) > 1 else b""
        address = (connection, peer)
        worker = self._workers.get(address)
        if worker is not None:
            worker.last_heard = now  # EMQP-15: any command counts as a heartbeat
        try:
            if command == REQUEST:
                self._on_request(address, message, now, events)
            elif command in _REFUSED:
                msgid = check_msgid(message[2]) if len(message) > 2 else b""
                self._answer(address, msgid, error_body(_REFUSED[command]))
                events.append(MessageDropped(peer, f"{command.decode()} refused (EMQP-17)", now))
            elif len(message) < 3:
                raise BadInput("EMQP-02", f"{command!r} without a MSGID")
            elif command == INFORM:
                self._on_inform(address, message, now, events)
            elif worker is None:
                # EMQP-06: a worker not (or no longer) informed; it re-INFORMs once it misses
                # the broker's heartbeats, so it is not told to go.
                events.append(
                    MessageDropped(peer, f"{command!r} from a peer that sent no INFORM", now)
                )
            else:
                check_msgid(message[2])
                if command == READY:
                    self._on_ready(worker, now, events)
                elif command == REPLY:
                    self._on_reply(worker, message, now, events)
                elif command == HEARTBEAT:
                    pass
                elif command in _LEAVING:
                    self._forget(worker, now, events)  # EMQP-16
                else:
                    raise BadInput("EMQP-18", f"unknown or broker-only command {command!r}")
        except BadInput as bad:
            events.append(ProtocolViolation(peer, bad.rule, bad.reason, "dropped", now))
        self.follow(events)
        return events

    def follow(self, events: list[BrokerEvent], start: int = 0) -> None:
        """React to what the core did (appending what that makes it do): a slot handed a
        request, a slot or a request gone."""
        if not self._asked and not self._seats.by_key:
            return  # no eMQP peer: nothing to follow
        at = start
        while at < len(events):
            event = events[at]
            at += 1
            if isinstance(event, RequestDispatched):
                seat = self._seats.dispatched(event.worker, event.at, events)  # EMQP-06
                if seat is not None:
                    self._on_dispatched(event, seat, events)
                asked = self._asked.get(event.client)
                if asked is not None and event.attempt == 1:
                    # EMQP-11: the request is submitted to a worker.
                    self._send(asked.address, REPLY, (asked.msgid,))
            elif isinstance(event, WorkerDisconnected | WorkerExpired):
                self._slot_gone(event.worker)
            elif isinstance(event, RequestExpired | RequestDropped):
                self._asked.pop(event.client, None)

    def encode(self, key: bytes, route: RouteView, command: CoreCommand) -> Relayed | None:
        """What the core sends to an eMQP key, as eMQP, or None to send nothing."""
        if command.role is _WORKER:
            job = self._outgoing.pop(key, None) if command.command is _REQUEST else None
            if job is None:
                return None  # HEARTBEAT, DISCONNECT: the layer speaks to workers itself
            # EMQP-10: the client's MSGID, queue and headers, then its message.
            body = command.body
            return (b"", EMQP_HEADER, REQUEST, job.msgid, job.queue, job.headers, *body)
        if command.command is not _FINAL:
            return None  # EMQP-21: no PARTIALs
        asked = self._asked.pop(key, None)
        if asked is None or not asked.reply:
            return None  # EMQP-12: no result unless asked for
        result = command.body[0] if command.body else b""
        return (b"", EMQP_HEADER, REPLY, self._new_id(), result, asked.msgid)

    def tick(self, now: float) -> list[BrokerEvent]:
        """Send due heartbeats; forget workers silent for the liveness span (EMQP-15)."""
        events: list[BrokerEvent] = []
        for deadline, worker in self._timers.pop_due(now):
            if self._workers.get(worker.address) is not worker or worker.timer_at != deadline:
                continue
            if now >= worker.last_heard + self._span:
                self._forget(worker, now, events, expired=True)
                continue
            if now >= worker.heartbeat_due:
                self._heartbeat(worker, now)
            self._arm(worker)
        self.follow(events)
        return events

    def next_deadline(self) -> float | None:
        """When ``tick`` is next due (possibly early: a stale timer entry), or None."""
        return self._timers.earliest()

    def peer_gone(self, peer: bytes, connection: int) -> None:
        """The I/O layer lost ``peer``: the core drops its keys; the layer forgets it."""
        worker = self._workers.pop((connection, peer), None)
        if worker is not None:
            worker.jobs.clear()
            self._seats.forget(worker.address)  # the core drops its seats itself

    def shutdown(self, now: float) -> list[BrokerEvent]:
        """EMQP-19: KBYE to every worker (EventMQ's jobmanager reconnects on its own)."""
        for worker in self._workers.values():
            self._send(worker.address, KBYE, ())
        self._workers.clear()
        return []

    # -- inside -----------------------------------------------------------------------------

    def _new_id(self) -> bytes:
        self._last_id += 1
        return b"domo-%d" % self._last_id

    def _send(self, address: Address, command: bytes, body: Relayed) -> None:
        message = (b"", EMQP_HEADER, command, self._new_id(), *body)
        self._host.send(address[0], address[1], message)

    def _answer(self, address: Address, msgid: bytes, result: bytes) -> None:
        self._send(address, REPLY, (result, msgid))

    def _on_request(
        self, address: Address, message: Sequence[BodyFrame], now: float, events: list[BrokerEvent]
    ) -> None:
        if len(message) < 3:
            raise BadInput("EMQP-02", "REQUEST without a MSGID")
        check_msgid(message[2])  # no good MSGID: nothing to answer to (EMQP-02)
        try:
            msgid, queue, headers, body = check_request(message)
        except BadInput as bad:
            self._answer(address, bytes(message[2]), error_body(bad.reason))  # EMQP-09
            raise
        host = self._host
        key = host.key_for(address[1], EMQP, address[0], msgid, once=True)  # a MSGID's alone
        fresh = key not in self._asked
        if fresh:
            refused = host.count_request(key, queue, sum(map(len, body)), now)
            if refused is not None:  # FAM-07: its client has as many as it may
                events += refused
                self._answer(address, msgid, error_body("too many requests outstanding (FAM-07)"))
                return
            self._asked[key] = _Asked(msgid, headers, reply_requested(headers), address)
        before = len(events)
        events += self._core.command(key, CoreCommand(_CLIENT, _REQUEST, queue, b"", body), now)
        accepted = any(isinstance(e, RequestQueued | MmiReplied) for e in events[before:])
        if fresh and not accepted:
            del self._asked[key]  # refused (EMQP-08): nothing to answer for
        host.forget_later(key)

    def _on_inform(
        self, address: Address, message: Sequence[BodyFrame], now: float, events: list[BrokerEvent]
    ) -> None:
        msgid = check_msgid(message[2])
        kind = bytes(message[4]) if len(message) > 4 else b"worker"
        try:
            if kind not in (b"worker", b""):
                raise BadInput("EMQP-04", f"INFORM as {kind!r}: only workers are served")
            queues = parse_queues(message[3] if len(message) > 3 else b"")
        except BadInput:
            self._send(address, DISCONNECT, ())  # EMQP-04: told to go, never registered
            raise
        old = self._workers.get(address)
        if old is not None:
            self._forget(old, now, events)  # EMQP-05: a new conversation replaces the old
        worker = _Worker(address, queues, now, now + self._interval)
        self._workers[address] = worker
        self._send(address, ACK, (msgid,))  # EMQP-03
        self._heartbeat(worker, now)  # EMQP-15: the worker starts work on a broker HEARTBEAT
        self._arm(worker)

    def _on_ready(self, worker: _Worker, now: float, events: list[BrokerEvent]) -> None:
        if self._seats.free(worker.address) >= self.max_credits:
            raise BadInput("EMQP-06", f"more than {self.max_credits} free slots")
        connection, peer = worker.address
        queues = [queue for _, queue in worker.queues]  # EMQP-06: in the order it listed them
        self._seats.offer(worker.address, peer, connection, queues, now, events, _SLOT_TAG)

    def _on_dispatched(
        self, event: RequestDispatched, seat: Seat, events: list[BrokerEvent]
    ) -> None:
        key, now = event.worker, event.at
        worker = self._workers[cast(Address, seat.owner)]  # its seats are live
        asked = self._asked.get(event.client)
        if asked is not None:
            job = _Job(asked.msgid, seat.service, asked.headers)
            reply = asked.reply
        else:
            # EMQP-20: another dialect's client; its first body frame is the job.
            body = self._core.request_body(event.client) or (b"",)
            try:
                check_job(body[0])
                for frame in body[1:]:
                    bytes(frame).decode("utf-8")
            except (BadInput, UnicodeDecodeError) as bad:
                reason = bad.reason if isinstance(bad, BadInput) else "a frame is not UTF-8"
                final = CoreCommand(_WORKER, _FINAL, b"", event.client, (error_body(reason),))
                events += self._core.command(key, final, now)
                self._on_ready(worker, now, events)  # the worker never saw it: its credit stands
                return
            job = _Job(self._new_id(), seat.service, b"reply-requested")
            reply = True
        self._outgoing[key] = job
        if reply:
            worker.jobs[job.msgid] = (key, event.client)
        else:
            # EMQP-12: no result asked for: the request is done once handed to the worker.
            done = CoreCommand(_WORKER, _FINAL, b"", event.client, (b"",))
            events += self._core.command(key, done, now)

    def _on_reply(
        self, worker: _Worker, message: Sequence[BodyFrame], now: float, events: list[BrokerEvent]
    ) -> None:
        if len(message) < 5:
            raise BadInput("EMQP-13", "REPLY needs a result and the request's MSGID")
        job = worker.jobs.pop(bytes(message[-1]), None)
        if job is None:
            raise BadInput("EMQP-13", "REPLY for no request this worker holds")
        key, client = job
        final = CoreCommand(_WORKER, _FINAL, b"", client, (message[3],))
        events += self._core.command(key, final, now)

    def _slot_gone(self, key: bytes) -> None:
        seat = self._seats.gone(key)
        worker = None if seat is None else self._workers.get(cast(Address, seat.owner))
        if worker is not None and worker.jobs:
            for msgid, (held, _) in list(worker.jobs.items()):
                if held == key:
                    del worker.jobs[msgid]

    def _forget(
        self, worker: _Worker, now: float, events: list[BrokerEvent], *, expired: bool = False
    ) -> None:
        """The worker leaves (or, ``expired``, fell silent: this is its one liveness clock,
        EMQP-15): its slots are withdrawn, its requests go back to their queues (EMQP-14,
        EMQP-16)."""
        self._workers.pop(worker.address, None)
        worker.jobs.clear()
        self._seats.withdraw(worker.address, now, events, expired=expired)

    def _heartbeat(self, worker: _Worker, now: float) -> None:
        # EMQP-24: the broker's clock, not wall time; EventMQ's peers do not read it.
        self._send(worker.address, HEARTBEAT, (b"%.3f" % now,))
        worker.heartbeat_due = now + self._interval

    def _arm(self, worker: _Worker) -> None:
        at = min(worker.heartbeat_due, worker.last_heard + self._span)
        worker.timer_at = at
        self._timers.push(at, worker)
