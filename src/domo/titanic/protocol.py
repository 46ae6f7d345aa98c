"""The Titanic service of 9/TSP (ZeroMQ RFC 9) as a sans-IO machine: decisions, no I/O.

Titanic stores requests on disk and runs them through a Majordomo broker later, so that a
client and the worker that serves it need not be up at the same time (``specs/tsp.md``). This
module is its logic and nothing else: it reads no clock, draws no id, opens no file and no
socket. Time (``now``, float seconds on a clock that survives restarts: the runtime passes wall
time, never decreasing) and request ids are inputs; what must be stored, sent or answered is
returned as data. ``domo.titanic.server`` is the runtime that does the I/O, ``domo.titanic.store``
the storage.

The three services (TSP-S-01) are decided by pure functions of the request's frames and, for
``titanic.reply``, of what the store holds for the id:

- ``titanic.request``: ``TitanicMachine.accept(frames, new_id, now)`` says ``Refused`` (a
  malformed request, answered ``400``) or ``StoreRequest``. The runtime commits the request and
  only then calls ``stored(...)``, which returns ``[b"200", id]`` (TSP-D-01: nothing is promised
  before it is on disk); if the commit fails, ``not_stored(...)`` returns the ``500`` answer.
- ``titanic.reply``: ``reply_id(frames)`` is the id or the ``400`` answer; ``answer_reply(record)``
  maps the store's record (or ``None``) to ``200 + reply``, ``300`` or ``400``.
- ``titanic.close``: ``close_id(frames)`` and ``closed(id)`` (``200`` whatever was known).

Request execution (TSP-R-01) is a scheduler: ``tick(now)`` returns ``Dispatch`` (send this
stored request to its service now), ``GiveUp`` (the request expired: record it as failed) and
``Purge`` (forget finished records older than this) effects. The runtime stores a reply, then
reports each dispatch's outcome with ``dispatched(id, outcome, now)``: a request leaves the
queue only once its reply is on disk. Requests of one service go out oldest first, at most
``max_in_flight`` at a time over all services; a service that had no worker or did not answer
is held back for a doubling delay (TSP-D-05). ``next_deadline()`` says when to tick.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from domo.protocol.errors import LocalProtocolError

__all__ = [
    "CLOSE",
    "ERROR",
    "OK",
    "PENDING",
    "REPLY",
    "REQUEST",
    "SERVICES",
    "UNKNOWN",
    "Answered",
    "Dispatch",
    "Effect",
    "GiveUp",
    "NoAnswer",
    "NoService",
    "Outcome",
    "Purge",
    "Record",
    "RecordState",
    "Refused",
    "StoreRequest",
    "TitanicConfig",
    "TitanicMachine",
    "check_service",
    "is_request_id",
    "pack_frames",
    "status_code",
    "unpack_frames",
]

# The services a Titanic server offers (TSP-S-01).
REQUEST: Final = b"titanic.request"
REPLY: Final = b"titanic.reply"
CLOSE: Final = b"titanic.close"
SERVICES: Final = (REQUEST, REPLY, CLOSE)

# Status codes (TSP-F-01..04): three digits, then optionally a space and text nobody relies on.
OK: Final = b"200"
PENDING: Final = b"300"
UNKNOWN: Final = b"400"
ERROR: Final = b"500"
STATUS_CODES: Final = (OK, PENDING, UNKNOWN, ERROR)

ID_LENGTH: Final = 32  # TSP-S-05
_ID_CHARACTERS: Final = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
MAX_SERVICE_NAME: Final = 255  # MDP-D-01, the broker's own bound
ANSWERED_KEPT: Final = 1024  # services whose last answer is remembered before old ones go


def status(code: bytes, text: str = "") -> bytes:
    """A status frame: the code, then ``text`` after a space if there is any (TSP-F-05)."""
    return code + b" " + text.encode("utf-8", "replace") if text else code


def status_code(frame: bytes) -> bytes | None:
    """The three-digit code of a status frame, or None if the frame is not one (TSP-F-05).

    Only the code counts: whatever follows the space is text for people (TSP-F-06).
    """
    code = bytes(frame[:3])
    if code not in STATUS_CODES or (len(frame) > 3 and frame[3:4] != b" "):
        return None
    return code


def is_request_id(frame: bytes) -> bool:
    """Whether ``frame`` is written as a request id: 32 characters, each 0-9, A-Z or a-z.

    That is 9/TSP's wording (TSP-S-05); ids this server issues are lowercase hexadecimal, a
    subset of it, and are compared exactly (TSP-D-09).
    """
    return len(frame) == ID_LENGTH and all(byte in _ID_CHARACTERS for byte in frame)


def check_service(name: bytes) -> str | None:
    """Why ``name`` cannot be a target service (TSP-S-03, MDP-D-01), or None if it can."""
    if not 1 <= len(name) <= MAX_SERVICE_NAME:
        return f"the service name must be 1 to {MAX_SERVICE_NAME} bytes, got {len(name)}"
    if not all(0x20 <= byte <= 0x7E for byte in name):
        return "the service name must be printable ASCII"
    if name.startswith(b"titanic."):
        return "a titanic.* service cannot be stored as a request (TSP-D-10)"
    return None


# --- frames as one blob: how a multi-frame body is stored ------------------------------------


def pack_frames(frames: Sequence[bytes]) -> bytes:
    """Frames as one blob: each is its length (4 bytes, big-endian), then its bytes."""
    parts: list[bytes] = []
    for frame in frames:
        parts.append(len(frame).to_bytes(4, "big"))
        parts.append(bytes(frame))
    return b"".join(parts)


def unpack_frames(blob: bytes) -> list[bytes]:
    """The frames ``pack_frames`` made; ``ValueError`` if ``blob`` is not such a blob."""
    frames: list[bytes] = []
    view = memoryview(blob)
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise ValueError("truncated frame length")
        size = int.from_bytes(view[offset : offset + 4], "big")
        offset += 4
        if offset + size > len(view):
            raise ValueError("truncated frame")
        frames.append(bytes(view[offset : offset + size]))
        offset += size
    return frames


# --- what the store holds for an id ------------------------------------------------------------


class RecordState(Enum):
    """Where a stored request is (TSP-D-02)."""

    PENDING = "pending"  # stored, not answered yet (maybe in flight)
    DONE = "done"  # its service answered; the reply is stored
    FAILED = "failed"  # given up (TSP-D-06): the reason is stored


@dataclass(frozen=True, slots=True)
class Record:
    """One request as the store holds it, as far as ``titanic.reply`` needs it."""

    request_id: bytes
    state: RecordState
    reply: tuple[bytes, ...] = ()  # DONE: the service's FINAL body
    reason: str = ""  # FAILED: why it was given up


# --- effects: what the machine asks the runtime to do ------------------------------------------


@dataclass(frozen=True, slots=True)
class Refused:
    """Answer ``reply`` and store nothing: the request was malformed."""

    reply: list[bytes]


@dataclass(frozen=True, slots=True)
class StoreRequest:
    """Commit this request to disk, then call ``stored`` (or ``not_stored`` if that failed)."""

    request_id: bytes
    service: bytes
    body: tuple[bytes, ...]
    created: float


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send the stored request ``request_id`` to ``service`` now; report with ``dispatched``."""

    request_id: bytes
    service: bytes
    attempt: int  # 1 for the first dispatch of this request by this machine
    probe: bool  # ask the broker first whether the service has a worker (TSP-D-05)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Record ``request_id`` as failed with ``reason``: it will not be dispatched again."""

    request_id: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class Purge:
    """Delete records that finished (done or failed) before ``finished_before`` (TSP-D-07)."""

    finished_before: float


Effect = Dispatch | GiveUp | Purge


@dataclass(frozen=True, slots=True)
class Answered:
    """The service answered and the runtime has stored its reply (TSP-S-07, TSP-D-02)."""


@dataclass(frozen=True, slots=True)
class NoService:
    """The broker knows no worker for the service (``mmi.service`` said 404)."""


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """No FINAL came in time, or the request could not be sent (``detail`` says which)."""

    detail: str = ""


Outcome = Answered | NoService | NoAnswer


@dataclass(frozen=True)
class TitanicConfig:
    """Titanic's policy (``specs/tsp.md`` section 4). Times in seconds.

    ``request_expiry``: a request not answered this long after it was stored is given up
    (TSP-D-06). ``reply_expiry``: a finished record nobody closed is purged this long after it
    finished (TSP-D-07). ``retry_initial`` and ``retry_max``: after a dispatch without an answer,
    its service is held back ``retry_initial``, doubled at each failure in a row up to
    ``retry_max`` (TSP-D-05). ``max_in_flight``: requests dispatched and not yet answered, over
    all services. ``purge_interval``: how often expired records are purged.
    """

    request_expiry: float = 86_400.0
    reply_expiry: float = 86_400.0
    retry_initial: float = 1.0
    retry_max: float = 30.0
    max_in_flight: int = 16
    purge_interval: float = 60.0
    probe_interval: float = 1.0

    def __post_init__(self) -> None:
        for name in ("request_expiry", "reply_expiry", "retry_initial", "purge_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.retry_max < self.retry_initial:
            raise ValueError("retry_max must be >= retry_initial")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")


@dataclass
class _Service:
    """The pending requests of one service, oldest first, and when it may be tried again."""

    name: bytes
    waiting: deque[bytes] = field(default_factory=deque)  # ids not in flight, oldest first
    held_until: float = -1.0  # no dispatch before this (a failed dispatch holds it back)
    backoff: float = 0.0  # the current hold; 0 after a success
    in_flight: int = 0


@dataclass
class _Pending:
    service: bytes
    created: float
    attempts: int = 0
    in_flight: bool = False
    expired: bool = False  # expired while in flight: given up unless it is answered


class TitanicMachine:
    """The Titanic service's decisions and its dispatch scheduler; see the module docstring.

    It knows the pending requests (id, service, creation time) in memory, not their bodies:
    the runtime loads a body from the store when it dispatches it. ``recover`` gives it the
    pending requests a restarted server finds in its store.
    """

    def __init__(self, config: TitanicConfig | None = None) -> None:
        self.config = config if config is not None else TitanicConfig()
        self.now = -float("inf")
        self._pending: dict[bytes, _Pending] = {}  # insertion order: creation order
        self._services: dict[bytes, _Service] = {}
        self._expiry: deque[tuple[float, bytes]] = deque()  # (created, id), creation order
        self._held: list[tuple[float, int, bytes]] = []  # (held_until, seq, service) heap
        self._seq = 0
        self._in_flight = 0
        self._in_flight_closed: dict[bytes, _Service] = {}  # closed while in flight
        self._answered_at: dict[bytes, float] = {}  # service -> its last answer, oldest first
        self._next_purge: float | None = None

    # --- time ---------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if now < self.now:
            raise LocalProtocolError(f"now went backwards: {now} < {self.now}")
        self.now = now
        if self._next_purge is None:
            self._next_purge = now + self.config.purge_interval

    # --- views --------------------------------------------------------------------------------

    def pending_count(self) -> int:
        """Requests stored and not yet answered or given up (in flight or waiting)."""
        return len(self._pending)

    def in_flight(self) -> int:
        """Requests dispatched and not yet reported."""
        return self._in_flight

    def is_pending(self, request_id: bytes) -> bool:
        return request_id in self._pending

    # --- titanic.request ----------------------------------------------------------------------

    def accept(self, frames: Sequence[bytes], new_id: bytes, now: float) -> Refused | StoreRequest:
        """A ``titanic.request``: refuse it (malformed) or ask for it to be stored.

        ``new_id`` is the id to give it (the runtime draws it: the machine draws nothing); it
        must be 32 lowercase hexadecimal characters and new.
        """
        self._advance(now)
        if not (is_request_id(new_id) and new_id == new_id.lower()) or new_id in self._pending:
            raise LocalProtocolError(f"not a fresh request id: {new_id!r}")
        if len(frames) < 2:  # TSP-S-02: the service name, then one or more body frames
            return Refused(
                [status(UNKNOWN, "malformed request: a service name and at least one body frame")]
            )
        service = bytes(frames[0])
        problem = check_service(service)
        if problem is not None:  # TSP-S-03
            return Refused([status(UNKNOWN, f"malformed request: {problem}")])
        return StoreRequest(new_id, service, tuple(bytes(f) for f in frames[1:]), now)

    def stored(self, request: StoreRequest, now: float) -> list[bytes]:
        """The request is on disk: queue it for dispatch; answer ``200`` and its id (TSP-S-04)."""
        self._advance(now)
        self._add(request.request_id, request.service, request.created)
        return [OK, request.request_id]

    def not_stored(self, request: StoreRequest, reason: str, now: float) -> list[bytes]:
        """The commit failed: nothing was promised; answer ``500`` (TSP-F-04, TSP-D-08)."""
        self._advance(now)
        return [status(ERROR, f"request not stored: {reason}")]

    def recover(self, pending: Iterable[tuple[bytes, bytes, float]], now: float) -> None:
        """Queue the pending requests found in the store: (id, service, created), oldest first.

        A request that was in flight when the server stopped is dispatched again: execution is
        at least once (TSP-D-04).
        """
        self._advance(now)
        for request_id, service, created in pending:
            if request_id not in self._pending:
                self._add(request_id, service, created)

    def _add(self, request_id: bytes, service: bytes, created: float) -> None:
        self._pending[request_id] = _Pending(service, created)
        queue = self._services.get(service)
        if queue is None:
            queue = self._services[service] = _Service(service)
        queue.waiting.append(request_id)
        self._expiry.append((created, request_id))

    # --- titanic.reply ------------------------------------------------------------------------

    @staticmethod
    def reply_id(frames: Sequence[bytes]) -> bytes | list[bytes]:
        """The id a ``titanic.reply`` asks for, or its answer if it is malformed (``400``)."""
        if len(frames) != 1:  # TSP-S-06
            return [status(UNKNOWN, "malformed request: exactly one frame, the request id")]
        request_id = bytes(frames[0])
        if not is_request_id(request_id):  # TSP-S-08
            return [status(UNKNOWN, "not a request id (32 characters 0-9, A-Z, a-z)")]
        return request_id

    def answer_reply(self, request_id: bytes, record: Record | None) -> list[bytes]:
        """The answer to ``titanic.reply`` for ``request_id``, from the store's record.

        The reply is not deleted by being read (TSP-S-09): the same answer is given again
        until the request is closed.
        """
        if record is None:
            return [status(UNKNOWN, "unknown request id")]  # TSP-F-03
        if record.state is RecordState.DONE:
            return [OK, *record.reply]  # TSP-F-01
        if record.state is RecordState.FAILED:
            return [status(UNKNOWN, f"given up: {record.reason}")]  # TSP-D-06
        return [status(PENDING, "pending")]  # TSP-F-02

    # --- titanic.close ------------------------------------------------------------------------

    @staticmethod
    def close_id(frames: Sequence[bytes]) -> bytes | list[bytes]:
        """The id a ``titanic.close`` names, or its answer: ``400`` if malformed, ``200`` if the
        frame cannot be an id (such an id is not known: TSP-S-11)."""
        if len(frames) != 1:  # TSP-S-10
            return [status(UNKNOWN, "malformed request: exactly one frame, the request id")]
        request_id = bytes(frames[0])
        if not is_request_id(request_id):
            return [OK]
        return request_id

    def closed(self, request_id: bytes, now: float) -> list[bytes]:
        """The store deleted ``request_id``: forget it here too and answer ``200`` (TSP-S-11).

        A request closed while in flight is not recalled; its answer, when it comes, is dropped
        (TSP-D-11).
        """
        self._advance(now)
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            queue = self._services[pending.service]
            if pending.in_flight:  # its outcome is still to come
                self._in_flight_closed[request_id] = queue
            else:  # its queue entry goes when the queue reaches it
                self._forget_service_if_idle(queue)
        return [OK]

    # --- request execution --------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When ``tick`` has something to do next (it may be called earlier; it is harmless)."""
        deadlines: list[float] = []
        if self._next_purge is not None:
            deadlines.append(self._next_purge)
        while self._expiry and self._expiry[0][1] not in self._pending:
            self._expiry.popleft()  # answered, closed or given up already
        if self._expiry:
            deadlines.append(self._expiry[0][0] + self.config.request_expiry)
        if self._in_flight < self.config.max_in_flight:
            if self._held:
                deadlines.append(self._held[0][0])
            for queue in self._services.values():
                if queue.held_until <= self.now and self._has_waiting(queue):
                    deadlines.append(self.now)
                    break
        return min(deadlines) if deadlines else None

    def tick(self, now: float) -> list[Effect]:
        """Give up expired requests, dispatch what may go now, purge when it is time."""
        self._advance(now)
        effects: list[Effect] = []
        expiry = self.config.request_expiry
        while self._expiry and self._expiry[0][0] + expiry <= now:
            created, request_id = self._expiry.popleft()
            pending = self._pending.get(request_id)
            if pending is None or pending.created != created:
                continue
            if pending.in_flight:  # its outcome decides: an answer still counts (TSP-D-06)
                pending.expired = True
                continue
            self._drop(request_id, pending)  # its queue entry goes when the queue reaches it
            effects.append(GiveUp(request_id, _expired_reason(pending, expiry)))
        while self._held and self._held[0][0] <= now:
            _, _, name = heapq.heappop(self._held)
            queue = self._services.get(name)
            if queue is not None:
                self._forget_service_if_idle(queue)
        # Dispatch: services in the order they were first seen, oldest request first in each,
        # one request per service per round, so a busy service does not starve the others.
        progress = True
        while progress and self._in_flight < self.config.max_in_flight:
            progress = False
            for queue in self._services.values():
                if self._in_flight >= self.config.max_in_flight:
                    break
                if queue.held_until > now:
                    continue
                waiting = self._next_waiting(queue)
                if waiting is None:
                    continue
                pending = self._pending[waiting]
                pending.in_flight = True
                pending.attempts += 1
                queue.in_flight += 1
                self._in_flight += 1
                answered_at = self._answered_at.get(queue.name, -math.inf)
                probe = now - answered_at >= self.config.probe_interval
                effects.append(Dispatch(waiting, queue.name, pending.attempts, probe))
                progress = True
        if self._next_purge is not None and self._next_purge <= now:
            self._next_purge = now + self.config.purge_interval
            effects.append(Purge(now - self.config.reply_expiry))
        return effects

    def dispatched(self, request_id: bytes, outcome: Outcome, now: float) -> GiveUp | None:
        """The outcome of a ``Dispatch``: ``GiveUp`` if it must be recorded as failed, or None.

        ``Answered``: the runtime has stored the reply (or found the request closed): it is done
        here. ``NoService`` and ``NoAnswer``: the request goes back to the front of its
        service's queue and the service is held back (TSP-D-05), unless it expired meanwhile:
        then ``GiveUp`` (TSP-D-06). A request closed while in flight has nothing more to record
        (TSP-D-11).
        """
        self._advance(now)
        closed = self._in_flight_closed.pop(request_id, None)
        if closed is not None:
            self._release(closed)
            if isinstance(outcome, Answered):
                self._answered(closed.name, now)
            self._forget_service_if_idle(closed)
            return None
        pending = self._pending.get(request_id)
        if pending is None or not pending.in_flight:
            raise LocalProtocolError(f"{request_id!r} is not in flight")
        service = self._services[pending.service]
        pending.in_flight = False
        self._release(service)
        if isinstance(outcome, Answered):
            service.backoff = 0.0
            self._answered(service.name, now)
            self._drop(request_id, pending)
            return None
        if pending.expired:
            self._drop(request_id, pending)
            return GiveUp(request_id, _expired_reason(pending, self.config.request_expiry))
        service.waiting.appendleft(request_id)
        self._answered_at.pop(service.name, None)  # probe it again before the next dispatch
        if service.held_until <= now:
            config = self.config
            service.backoff = min(max(service.backoff * 2, config.retry_initial), config.retry_max)
            service.held_until = now + service.backoff
            self._seq += 1
            heapq.heappush(self._held, (service.held_until, self._seq, service.name))
        return None

    def _has_waiting(self, queue: _Service) -> bool:
        """Whether ``queue`` holds a request still pending (entries of ended ones are dropped)."""
        waiting = queue.waiting
        while waiting and waiting[0] not in self._pending:
            waiting.popleft()
        return bool(waiting)

    def _next_waiting(self, queue: _Service) -> bytes | None:
        """The oldest request of ``queue`` still pending, taken out of it; None if none."""
        return queue.waiting.popleft() if self._has_waiting(queue) else None

    def _answered(self, service: bytes, now: float) -> None:
        """Remember that ``service`` answered at ``now`` (no probe before its next dispatch)."""
        self._answered_at.pop(service, None)
        self._answered_at[service] = now  # insertion order: oldest answer first
        if len(self._answered_at) > ANSWERED_KEPT:  # bounded: forget answers too old to count
            horizon = now - self.config.probe_interval
            while self._answered_at and next(iter(self._answered_at.values())) < horizon:
                del self._answered_at[next(iter(self._answered_at))]

    def _release(self, service: _Service) -> None:
        service.in_flight -= 1
        self._in_flight -= 1

    def _drop(self, request_id: bytes, pending: _Pending) -> None:
        del self._pending[request_id]
        queue = self._services.get(pending.service)
        if queue is not None:
            self._forget_service_if_idle(queue)

    def _forget_service_if_idle(self, queue: _Service) -> None:
        idle = not self._has_waiting(queue) and not queue.in_flight and queue.held_until <= self.now
        if idle and self._services.get(queue.name) is queue:
            del self._services[queue.name]


def _expired_reason(pending: _Pending, expiry: float) -> str:
    tried = "never dispatched" if pending.attempts == 0 else f"{pending.attempts} attempt(s)"
    return (
        f"no reply from {pending.service.decode('ascii', 'replace')!r} within "
        f"{expiry:g} s ({tried})"
    )
