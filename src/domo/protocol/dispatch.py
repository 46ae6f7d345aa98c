"""Services, their queues and their workers, without any wire format.

This is the part of a broker that every protocol of the Majordomo family shares: a request waits in
the queue of its service, first come first served (MDP-A-03), until a worker of that service is
idle; the worker that has been idle longest gets it (least recently used, MDP-A-04). A worker
handles one request at a time (MDP-A-06). All operations are O(1): each service keeps its queue and
its idle workers in insertion-ordered maps, which pop from the front, push at either end and remove
by key in constant time.

The records here are plain mutable objects owned by the protocol layer (``broker.py`` for MDP/0.2),
which adds heartbeats, DISCONNECT rules and framing on top. Nothing here knows about time beyond
the timestamps the protocol layer stores in the records.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import Enum
from typing import Final

from .mdp import Relayed

__all__ = [
    "REQUEST_OVERHEAD",
    "Dispatcher",
    "RequestRecord",
    "RequestState",
    "ServiceRecord",
    "WorkerRecord",
]


class RequestState(Enum):
    """Where a request is in its life."""

    QUEUED = "queued"
    DISPATCHED = "dispatched"
    DONE = "done"


# As globals for the request cycle: ``RequestState.X`` costs about 90 ns on Python 3.11
# (``EnumType.__getattr__``), a global a tenth of that.
_QUEUED, _DISPATCHED, _DONE = RequestState.QUEUED, RequestState.DISPATCHED, RequestState.DONE


# What an accepted request counts against max_held_bytes besides its body (MDP-D-26): an upper
# bound of what the broker keeps for it, the record itself, its queue and timer entries, and a
# dialect layer's keys and routes for it. Without it a flood of tiny requests costs the broker far
# more memory than the bound sees. Measured with tracemalloc (20,000 queued requests of 1-byte
# bodies, no worker): about 0.6 KB each for MDP/0.2 clients and 1.6 KB for MDP/0.1's; a hostile
# DCP flood grew the broker's RSS by about 1.3 KB per request.
REQUEST_OVERHEAD: Final = 2048


class RequestRecord:
    """One client request, from acceptance to its FINAL (or its end without one)."""

    __slots__ = (
        "abandoned",
        "attempts",
        "body",
        "client",
        "expires_at",
        "held",
        "partials",
        "queued_at",
        "received_at",
        "request_id",
        "service",
        "size",
        "state",
        "worker",
    )

    def __init__(
        self, request_id: int, client: bytes, service: bytes, body: Relayed, now: float
    ) -> None:
        self.request_id = request_id
        self.client = client
        self.service = service
        self.body = body
        self.size = sum(map(len, body))  # the body's bytes, as events report them
        self.held = self.size + REQUEST_OVERHEAD  # what it counts against max_held_bytes
        self.received_at = now
        self.queued_at = now
        self.expires_at = now
        self.attempts = 0  # how many times it was handed to a worker
        self.partials = 0  # PARTIALs forwarded to the client for the current attempt
        self.state = _QUEUED
        self.worker: WorkerRecord | None = None
        # True once its client is unreachable: the worker may finish, nothing is forwarded.
        self.abandoned = False


class WorkerRecord:
    """One registered worker: its service, its current request and its heartbeat clock."""

    __slots__ = (
        "last_heard",
        "last_sent",
        "peer",
        "registered_at",
        "request",
        "service",
        "timer_at",
    )

    def __init__(self, peer: bytes, service: bytes, now: float) -> None:
        self.peer = peer
        self.service = service
        self.registered_at = now
        self.last_heard = now
        self.last_sent = now
        self.request: RequestRecord | None = None
        # The deadline of this worker's one live entry in the broker's timer heap.
        self.timer_at = now


class ServiceRecord:
    """A service: its queue of waiting requests and its idle workers, both oldest first."""

    __slots__ = ("idle", "name", "queue", "worker_count")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.queue: OrderedDict[int, RequestRecord] = OrderedDict()
        self.idle: OrderedDict[bytes, WorkerRecord] = OrderedDict()
        self.worker_count = 0  # idle + busy


class Dispatcher:
    """The queues and worker pools of every service, and least-recently-used dispatch."""

    __slots__ = ("_services",)

    def __init__(self) -> None:
        self._services: dict[bytes, ServiceRecord] = {}

    # -- services ------------------------------------------------------------------------------

    def service(self, name: bytes) -> ServiceRecord | None:
        """The record of service ``name``, or None if it has no workers and no queue."""
        return self._services.get(name)

    def services(self) -> list[ServiceRecord]:
        """Every service with workers or waiting requests, in order of first appearance."""
        return list(self._services.values())

    def _service(self, name: bytes) -> ServiceRecord:
        record = self._services.get(name)
        if record is None:
            record = self._services[name] = ServiceRecord(name)
        return record

    def _forget_if_unused(self, record: ServiceRecord) -> None:
        # Clients may ask for any name: keep no record of names nobody serves or waits for.
        if record.worker_count == 0 and not record.queue:
            del self._services[record.name]

    # -- workers -------------------------------------------------------------------------------

    def add_worker(self, worker: WorkerRecord) -> ServiceRecord:
        """Add a new, idle worker to its service's pool (at the back: most recently used)."""
        record = self._service(worker.service)
        record.worker_count += 1
        record.idle[worker.peer] = worker
        return record

    def remove_worker(self, worker: WorkerRecord) -> RequestRecord | None:
        """Remove a worker; returns the request it was handling, now detached from it."""
        record = self._services[worker.service]
        record.idle.pop(worker.peer, None)
        record.worker_count -= 1
        request = worker.request
        worker.request = None
        if request is not None:
            request.worker = None
        self._forget_if_unused(record)
        return request

    def release(self, worker: WorkerRecord) -> RequestRecord:
        """The worker finished its request: mark the request done and the worker idle."""
        request = worker.request
        assert request is not None, "release() of a worker that is not busy"
        worker.request = None
        request.worker = None
        request.state = _DONE
        self._services[worker.service].idle[worker.peer] = worker
        return request

    # -- requests ------------------------------------------------------------------------------

    def enqueue(self, request: RequestRecord, *, front: bool = False) -> ServiceRecord:
        """Put a request in its service's queue, at the back (new) or the front (re-dispatch)."""
        record = self._service(request.service)
        request.state = _QUEUED
        record.queue[request.request_id] = request
        if front:
            record.queue.move_to_end(request.request_id, last=False)
        return record

    def unqueue(self, request: RequestRecord) -> None:
        """Take a waiting request out of its queue (it expired or its client went away)."""
        record = self._services[request.service]
        del record.queue[request.request_id]
        request.state = RequestState.DONE
        self._forget_if_unused(record)

    def next_assignment(self, record: ServiceRecord) -> tuple[RequestRecord, WorkerRecord] | None:
        """Pair the oldest waiting request with the longest-idle worker, if both exist."""
        if not record.queue or not record.idle:
            return None
        _, request = record.queue.popitem(last=False)
        _, worker = record.idle.popitem(last=False)
        worker.request = request
        request.worker = worker
        request.state = _DISPATCHED
        request.attempts += 1
        request.partials = 0
        return request, worker
