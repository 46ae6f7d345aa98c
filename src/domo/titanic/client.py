"""The client side of 9/TSP, runtime-neutral: what to send and what an answer means.

``AsyncTitanicClient`` wraps any client with ``async request(service, *frames)`` (the ``Client``
of ``domo.trio`` and of ``domo.asyncio``), ``SyncTitanicClient`` one with a blocking
``request`` (``domo.sync.Client``); ``domo.titanic.trio``, ``.asyncio`` and ``.sync`` give each
runtime's as ``TitanicClient``. Both use the functions below, so the three agree by
construction: ``submit(service, *frames)`` stores a request and returns its id,
``fetch(id)`` says ``PENDING``, ``DONE`` (with the reply) or ``UNKNOWN``, ``close(id)`` forgets
it (TSP-S-02, TSP-S-06, TSP-S-10). Only the status code counts, never its text (TSP-F-06);
a ``500`` or an answer that is not 9/TSP raises ``TitanicError``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from domo.runtime.errors import DomoError, RemoteError, parse_error_body

from .protocol import CLOSE, OK, PENDING, REPLY, REQUEST, UNKNOWN, is_request_id, status_code

__all__ = [
    "AsyncTitanicClient",
    "FetchState",
    "Fetched",
    "SyncTitanicClient",
    "TitanicError",
    "close_request",
    "fetch_request",
    "parse_close",
    "parse_fetch",
    "parse_submit",
    "poll_delays",
    "request_id_bytes",
    "submit_request",
]


class TitanicError(DomoError):
    """Titanic could not do what was asked (``500``: retry later) or answered outside 9/TSP.

    ``status`` is the status frame as received (empty if there was none).
    """

    def __init__(self, message: str, status: bytes = b"") -> None:
        super().__init__(message)
        self.status = status


class FetchState(Enum):
    """What ``fetch`` found (TSP-F-01, TSP-F-02, TSP-F-03)."""

    PENDING = "pending"  # stored, not answered yet: fetch again later (300)
    DONE = "done"  # answered: ``body`` is the reply (200)
    UNKNOWN = "unknown"  # never stored, closed, expired or given up: do not retry (400)


@dataclass(frozen=True, slots=True)
class Fetched:
    """The answer to ``fetch``: its state, the reply's frames if done, and the status text."""

    state: FetchState
    body: list[bytes]
    text: str = ""

    @property
    def done(self) -> bool:
        return self.state is FetchState.DONE

    @property
    def pending(self) -> bool:
        return self.state is FetchState.PENDING

    @property
    def unknown(self) -> bool:
        return self.state is FetchState.UNKNOWN

    def reply(self, service: str | bytes = b"titanic.reply") -> list[bytes]:
        """The reply's frames; ``RemoteError`` if the worker's handler failed (MDP-D-23)."""
        if not self.done:
            raise TitanicError(f"no reply: the request is {self.state.value}")
        error = parse_error_body(self.body)
        if error is not None:
            name = service.encode("ascii") if isinstance(service, str) else service
            raise RemoteError(name, 1, *error)
        return self.body


def request_id_bytes(request_id: str | bytes) -> bytes:
    """An id as sent: ``str`` ids are ASCII."""
    return request_id.encode("ascii") if isinstance(request_id, str) else request_id


def _status(answer: Sequence[bytes], service: bytes) -> tuple[bytes, str]:
    if not answer:
        raise TitanicError(f"{service.decode()} answered with no frame")
    code = status_code(answer[0])
    text = bytes(answer[0][4:]).decode("utf-8", "replace")
    if code is None:
        raise TitanicError(f"{service.decode()} answered {bytes(answer[0])!r}: not a status")
    return code, text


def submit_request(service: str | bytes, frames: Sequence[bytes]) -> tuple[bytes, list[bytes]]:
    """The MDP request that stores ``service`` and ``frames`` (TSP-S-02)."""
    name = service.encode("ascii") if isinstance(service, str) else service
    return REQUEST, [name, *frames]


def parse_submit(answer: Sequence[bytes]) -> str:
    """The id in ``titanic.request``'s answer; ``TitanicError`` if it was not stored."""
    code, _ = _status(answer, REQUEST)
    if code == OK and len(answer) >= 2 and is_request_id(answer[1]):
        return bytes(answer[1]).decode("ascii")
    if code == OK:
        raise TitanicError("titanic.request answered 200 without a request id", answer[0])
    raise TitanicError(f"not stored: {bytes(answer[0]).decode('utf-8', 'replace')}", code)


def fetch_request(request_id: str | bytes) -> tuple[bytes, list[bytes]]:
    """The MDP request that asks for ``request_id``'s reply (TSP-S-06)."""
    return REPLY, [request_id_bytes(request_id)]


def parse_fetch(answer: Sequence[bytes]) -> Fetched:
    """``titanic.reply``'s answer as a ``Fetched``; ``TitanicError`` for ``500``."""
    code, text = _status(answer, REPLY)
    if code == OK:
        return Fetched(FetchState.DONE, [bytes(frame) for frame in answer[1:]], text)
    if code == PENDING:
        return Fetched(FetchState.PENDING, [], text)
    if code == UNKNOWN:
        return Fetched(FetchState.UNKNOWN, [], text)
    raise TitanicError(f"titanic.reply failed: {bytes(answer[0]).decode('utf-8', 'replace')}", code)


def close_request(request_id: str | bytes) -> tuple[bytes, list[bytes]]:
    """The MDP request that closes ``request_id`` (TSP-S-10)."""
    return CLOSE, [request_id_bytes(request_id)]


def parse_close(answer: Sequence[bytes]) -> None:
    """Check ``titanic.close``'s answer: ``200``, else ``TitanicError``."""
    code, _ = _status(answer, CLOSE)
    if code != OK:
        text = bytes(answer[0]).decode("utf-8", "replace")
        raise TitanicError(f"titanic.close failed: {text}", code)


FIRST_POLL = 0.005  # seconds before the first fetch again
POLL_GROWTH = 2.0
MAX_POLL = 1.0  # fetch at least this often while pending


def poll_delays(limit: float = MAX_POLL) -> Iterator[float]:
    """How long to wait before each fetch again while a request is pending (TSP-F-02): from
    5 ms, doubling, to ``limit``: quick for quick work, one fetch a second for slow work."""
    delay = FIRST_POLL
    while True:
        yield min(delay, limit)
        delay *= POLL_GROWTH


def _waited_too_long(deadline: float, request_id: str | bytes) -> TitanicError:
    return TitanicError(f"{request_id!r} still pending after the wait (deadline {deadline:.3f})")


class AsyncRequests(Protocol):
    """What ``AsyncTitanicClient`` needs: the ``request`` of ``domo.trio`` or ``domo.asyncio``."""

    async def request(self, service: str | bytes, *frames: bytes) -> list[bytes]: ...


class SyncRequests(Protocol):
    """What ``SyncTitanicClient`` needs: the ``request`` of ``domo.sync.Client``."""

    def request(self, service: str | bytes, *frames: bytes) -> list[bytes]: ...


class AsyncTitanicClient:
    """Submit now, fetch later: 9/TSP over ``client`` (its timeouts and retries apply).

    ``sleep`` is the event loop's (``trio.sleep``, ``asyncio.sleep``), for ``wait``; the
    runtime modules pass it.
    """

    def __init__(
        self, client: AsyncRequests, *, sleep: Callable[[float], Awaitable[object]]
    ) -> None:
        self.client = client
        self._sleep = sleep

    async def wait(self, request_id: str | bytes) -> Fetched:
        """Fetch until the request is no longer pending (done or unknown), polling as
        ``poll_delays`` says. Bound it with the event loop's own timeout (``trio.fail_after``,
        ``asyncio.timeout``)."""
        for delay in poll_delays():
            fetched = await self.fetch(request_id)
            if not fetched.pending:
                return fetched
            await self._sleep(delay)
        raise AssertionError("poll_delays never ends")  # pragma: no cover

    async def submit(self, service: str | bytes, *frames: bytes) -> str:
        """Store a request for ``service``; its id once it is on Titanic's disk."""
        name, body = submit_request(service, frames)
        return parse_submit(await self.client.request(name, *body))

    async def fetch(self, request_id: str | bytes) -> Fetched:
        """The request's reply if there is one yet (``Fetched.state`` says)."""
        name, body = fetch_request(request_id)
        return parse_fetch(await self.client.request(name, *body))

    async def close(self, request_id: str | bytes) -> None:
        """Forget the request and its reply (nothing happens if it is unknown)."""
        name, body = close_request(request_id)
        parse_close(await self.client.request(name, *body))


class SyncTitanicClient:
    """``AsyncTitanicClient``'s calls for blocking code, over a ``domo.sync.Client``."""

    def __init__(self, client: SyncRequests) -> None:
        self.client = client

    def wait(self, request_id: str | bytes, timeout: float | None = None) -> Fetched:
        """Fetch until the request is no longer pending (done or unknown), polling as
        ``poll_delays`` says; ``TitanicError`` if it is still pending after ``timeout``."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        for delay in poll_delays():
            fetched = self.fetch(request_id)
            if not fetched.pending:
                return fetched
            if time.monotonic() + delay > deadline:
                raise _waited_too_long(deadline, request_id)
            time.sleep(delay)
        raise AssertionError("poll_delays never ends")  # pragma: no cover

    def submit(self, service: str | bytes, *frames: bytes) -> str:
        """Store a request for ``service``; its id once it is on Titanic's disk."""
        name, body = submit_request(service, frames)
        return parse_submit(self.client.request(name, *body))

    def fetch(self, request_id: str | bytes) -> Fetched:
        """The request's reply if there is one yet (``Fetched.state`` says)."""
        name, body = fetch_request(request_id)
        return parse_fetch(self.client.request(name, *body))

    def close(self, request_id: str | bytes) -> None:
        """Forget the request and its reply (nothing happens if it is unknown)."""
        name, body = close_request(request_id)
        parse_close(self.client.request(name, *body))
