"""``Client``: MDP/0.2 requests from Trio code, and ``call`` for synchronous scripts.

::

    async with Client("tcp://127.0.0.1:5555", timeout=2.5, retries=3) as client:
        body = await client.request("echo", b"hello")            # the FINAL body
        async with client.stream("count", b"3") as replies:       # every PARTIAL, then the FINAL
            async for reply in replies:
                print(reply.body, reply.final)

MDP/0.2 has no request id, so a socket carries one request at a time (MDP-C-07). A ``Client``
has ``concurrency`` sessions, each a ``ClientSession`` on its own DEALER; a request waits for a
free session. MDP/Client has no heartbeat, so a session's socket has nothing to do between
requests: the task making a request owns the session and its socket for that request (it sends,
waits and reads itself; no other task touches that socket meanwhile), then hands both back. That
is one task switch per reply instead of the three a separate socket task would cost. Timeouts and
retries are the session's (MDP-C-08, MDP-D-19): on a timeout it closes the socket, opens a new
one and resends; after ``retries`` resends the request raises ``RequestTimeout``. A FINAL
reporting a handler error raises ``RemoteError`` (MDP-D-23). Cancelling a request (any enclosing
cancel scope) cancels it in the session, whose socket is then replaced, so a late reply cannot
reach the next request; the ``Client`` stays usable. Closing the ``Client`` closes every socket,
waking a request that waits on one with ``ClientClosed``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import trio
import zmq

from domo.protocol import ClientConfig, ClientSession, ClientState, mdp
from domo.protocol.events import (
    ClientEvent,
    FinalReceived,
    PartialReceived,
    ReconnectRequired,
    RequestFailed,
)

from ._pump import BATCH, log_event
from ._transport import SENT, Connection, Transport, ZmqTransport
from .errors import ClientClosed, DomoError, RemoteError, RequestTimeout, parse_error_body

__all__ = ["Client", "Reply", "ReplyStream", "call"]

logger = logging.getLogger("domo.client")

_REPLY_EVENTS = (PartialReceived, FinalReceived, RequestFailed)  # what a request's reader gets


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply to a request: a PARTIAL (``final`` false) or the FINAL."""

    body: list[bytes]
    final: bool


class _Slot:
    """One session and its socket, owned by one request at a time (see the module docstring)."""

    def __init__(self, client: Client, transport: Transport) -> None:
        self.client = client
        self.transport = transport
        self.session = ClientSession(client.config)
        self.conn: Connection | None = None
        self.reconnect_at: float | None = -math.inf  # None: keep this socket
        self.unsent: deque[tuple[bytes, ...]] = deque()  # taken from the outbox, pipe was full
        self.replies: deque[ClientEvent] = deque()  # the current request's, not yet read
        self.collecting = False  # a request is in progress: its replies go to ``replies``
        self.closed = False

    def handle(self, events: list[ClientEvent]) -> None:
        for event in events:
            if isinstance(event, ReconnectRequired):
                self.reconnect_at = event.reconnect_at
                self.unsent.clear()  # they belonged to the socket being given up
            if self.collecting and isinstance(event, _REPLY_EVENTS):
                self.replies.append(event)
                self.collecting = isinstance(event, PartialReceived)
            else:
                log_event(logger, event)

    async def connection(self) -> Connection:
        """The socket, replaced first if the session asked for a new one."""
        if self.reconnect_at is not None:
            self.drop_connection()
            if self.reconnect_at > trio.current_time():
                await trio.sleep_until(self.reconnect_at)
            self.check_open()
            self.conn = self.transport.connect(self.client.endpoint)
            self.reconnect_at = None
            self.handle(self.session.connected(trio.current_time()))
        assert self.conn is not None
        return self.conn

    async def step(self) -> None:
        """Send what the session queued, wait for a reply or the timeout, and handle it."""
        conn = await self.connection()
        full = not self.flush(conn)
        if not self.receive(conn):
            deadline = self.session.next_deadline()
            with trio.CancelScope(deadline=math.inf if deadline is None else deadline):
                try:
                    await conn.wait(full)  # with a full pipe, room to send wakes it too
                except trio.ClosedResourceError:
                    self.check_open()
                    raise
            self.check_open()
            self.receive(conn)
        self.handle(self.session.tick(trio.current_time()))

    def check_open(self) -> None:
        if self.closed:
            raise ClientClosed("the client was closed")

    def receive(self, conn: Connection) -> bool:
        """Hand the messages that are ready to the session; were there any?"""
        messages = conn.receive(BATCH)
        now = trio.current_time()
        for message in messages:
            self.handle(self.session.receive(message, now))
        return bool(messages)

    def flush(self, conn: Connection) -> bool:
        """Send the session's outbox; False if the socket's pipe is full (EAGAIN)."""
        self.unsent.extend(self.session.take_outgoing())
        while self.unsent and self.reconnect_at is None:
            if conn.send(self.unsent[0]) != SENT:
                return False
            self.unsent.popleft()
        return True

    def drop_connection(self) -> None:
        """Close the socket at once: what is still queued on it must not be delivered."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close(0.0)

    def cancel(self) -> None:
        """Give up the request in progress; the socket is replaced before the next one."""
        busy = self.session.state in (ClientState.WAITING, ClientState.RECONNECTING)
        if busy and not self.closed:
            self.handle(self.session.cancel(trio.current_time()))
        self.collecting = False

    def release(self) -> None:
        """The request is over: hand the session back to the client."""
        self.replies.clear()
        self.collecting = False
        if self.reconnect_at is not None:
            self.drop_connection()  # not left open until the next request replaces it
        if not self.closed:
            self.client._idle_send.send_nowait(self)

    def close(self) -> None:
        """The client closes: end the session and close the socket, waking a request on it."""
        self.closed = True
        self.handle(self.session.close(trio.current_time()))
        self.drop_connection()


class Client:
    """MDP/0.2 client with up to ``concurrency`` requests in flight; use ``async with``.

    ``timeout``: seconds without a reply before a resend; ``retries``: resends before
    ``RequestTimeout``. ``context`` (for ``inproc://``) or ``transport`` (for
    ``domo.trio.testing``) replace the default fresh ZeroMQ context.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = 2.5,
        retries: int = 3,
        concurrency: int = 1,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        transport: Transport | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.endpoint = endpoint
        self.config = ClientConfig(timeout=timeout, retries=retries)
        self.concurrency = concurrency
        self._context = context
        self.transport = transport  # a ZmqTransport is made on entry, so its context is closed
        self._idle_send, self._idle = trio.open_memory_channel[_Slot](concurrency)
        self._slots: list[_Slot] = []
        self._entered = False
        self._closed = False

    async def __aenter__(self) -> Self:
        if self._entered:
            raise DomoError("a Client is entered once")
        if self.transport is None:
            self.transport = ZmqTransport(self._context)
        self._entered = True
        for _ in range(self.concurrency):
            slot = _Slot(self, self.transport)
            self._slots.append(slot)
            self._idle_send.send_nowait(slot)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self._idle_send.close()  # requests waiting for a session get ClientClosed
        try:
            for slot in self._slots:
                slot.close()  # a request waiting on a socket wakes with ClientClosed
        finally:
            assert self.transport is not None
            await self.transport.aclose()  # after every socket is closed

    async def request(self, service: str | bytes, *frames: bytes) -> list[bytes]:
        """Send a request and return the body of its FINAL (PARTIALs are skipped)."""
        async with self.stream(service, *frames) as replies:
            async for reply in replies:
                if reply.final:
                    return reply.body
        raise AssertionError("a reply stream ends with its FINAL or raises")  # pragma: no cover

    def stream(self, service: str | bytes, *frames: bytes) -> ReplyStream:
        """The replies to a request: each PARTIAL, then the FINAL (``Reply.final`` is true).

        Use ``async with`` around it to cancel the request if you stop reading early;
        otherwise the request runs to its end in the background before its session is free.
        Replies wait in memory until read: the session keeps receiving, so its timeout (which
        restarts with each PARTIAL) is not tripped by a slow reader.
        """
        name = service.encode("ascii") if isinstance(service, str) else service
        return ReplyStream(self, mdp.check_service(name), mdp.check_body(frames))


class ReplyStream:
    """The replies of one request, as an async iterator; see ``Client.stream``."""

    def __init__(self, client: Client, service: bytes, body: mdp.Frames) -> None:
        self._client = client
        self._service = service
        self._body = body
        self._slot: _Slot | None = None
        self._done = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.abort()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Reply:
        if self._done:
            raise StopAsyncIteration
        try:
            slot = self._slot if self._slot is not None else await self._start()
            while not slot.replies:
                await slot.step()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self.abort()
            raise ClientClosed("the client was closed") from None
        except BaseException:
            self.abort()  # cancelled: the session forgets the request and replaces its socket
            raise
        event = slot.replies.popleft()
        if isinstance(event, PartialReceived):
            return Reply(list(event.body), final=False)
        self._finish()
        if isinstance(event, RequestFailed):
            if event.reason == "cancelled":
                raise ClientClosed("the client was closed")
            raise RequestTimeout(self._service, event.attempts, event.reason)
        assert isinstance(event, FinalReceived)
        body = list(event.body)
        error = parse_error_body(body)
        if error is not None:
            raise RemoteError(self._service, event.attempt, *error)
        return Reply(body, final=True)

    def abort(self) -> None:
        """Cancel the request if it is still in progress (nothing more will be read)."""
        if self._slot is not None:
            self._slot.cancel()
        self._finish()

    def _finish(self) -> None:
        self._done = True
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    async def _start(self) -> _Slot:
        client = self._client
        if not client._entered:
            raise DomoError("a Client is used inside 'async with Client(...) as client:'")
        if client._closed:
            raise ClientClosed("the client is closed")
        slot = await client._idle.receive()
        self._slot = slot
        conn = await slot.connection()  # the session must be connected (IDLE) to take a request
        # Whatever arrived while the session was idle (a stray reply) is read now, with no
        # request outstanding, so that it is dropped (MDP-D-20) rather than taken for this
        # request's reply.
        slot.receive(conn)
        slot.collecting = True
        slot.handle(slot.session.request(self._service, self._body, trio.current_time()))
        return slot


def call(
    endpoint: str,
    service: str | bytes,
    *frames: bytes,
    timeout: float = 2.5,
    retries: int = 3,
) -> list[bytes]:
    """One request from synchronous code: runs Trio, returns the FINAL body or raises."""

    async def one_request() -> list[bytes]:
        async with Client(endpoint, timeout=timeout, retries=retries) as client:
            return await client.request(service, *frames)

    return trio.run(one_request)
