"""``Client``: MDP/0.2 requests from asyncio code (FastAPI, aiohttp, ...), on pyzmq.

::

    async with Client("tcp://127.0.0.1:5555", timeout=2.5, retries=3) as client:
        body = await client.request("echo", b"hello")            # the FINAL body
        async with client.stream("count", b"3") as replies:       # every PARTIAL, then the FINAL
            async for reply in replies:
                print(reply.body, reply.final)

The same ``ClientSession`` as ``domo.trio.Client`` and ``domo.sync.Client``. MDP/0.2 has no request
id, so a socket carries one request at a time (MDP-C-07): the client keeps up to ``concurrency``
sessions, each on its own DEALER; a request takes a free one or waits for one. The task making a
request drives its session and socket: it sends, awaits the reply bounded by the session's
deadline (asyncio's loop waits on the socket's FD), and on a timeout the session resends on a new
socket (MDP-C-08) until ``retries`` are spent (``RequestTimeout``). Cancelling the task cancels
the request; the socket is then replaced, so a late reply cannot reach the next request. A FINAL
reporting a handler error raises ``RemoteError`` (MDP-D-23). Use it from one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import zmq

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import ClientConfig, ClientSession, ClientState, mdp
from domo.protocol.events import ClientEvent, PartialReceived, ReconnectRequired
from domo.runtime import (
    REPLY_EVENTS,
    SENT,
    ClientClosed,
    DomoError,
    Reply,
    final_body,
    log_event,
    service_name,
)

from ._socket import AsyncConnection

__all__ = ["Client", "ReplyStream"]

logger = logging.getLogger("domo.client")


class _Slot:
    """One session and its DEALER, used by one task at a time."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.session = ClientSession(client.config)
        self.endpoints = EndpointRing(client.endpoints)  # each slot moves on by itself
        self.socket: AsyncConnection | None = None
        self.reconnect = True
        self.unsent: deque[tuple[bytes, ...]] = deque()
        self.replies: deque[ClientEvent] = deque()
        self.collecting = False
        self.loop = asyncio.get_running_loop()

    def now(self) -> float:
        return max(self.loop.time(), self.session.now)

    def handle(self, events: list[ClientEvent]) -> None:
        for event in events:
            if isinstance(event, ReconnectRequired):
                self.reconnect = True
                self.unsent.clear()
            if self.collecting and isinstance(event, REPLY_EVENTS):
                self.replies.append(event)
                self.collecting = isinstance(event, PartialReceived)
            else:
                log_event(logger, event)

    def connect(self) -> AsyncConnection:
        if self.reconnect or self.socket is None:
            self.drop()
            self.client._check_open()
            self.socket = AsyncConnection(self.client._context, zmq.DEALER)
            if self.client.curve is not None:
                self.client.curve.apply(self.socket.socket)
            self.socket.socket.connect(self.endpoints.next())  # failover: MDP-D-28
            self.reconnect = False
            self.handle(self.session.connected(self.now()))
        return self.socket

    def drop(self) -> None:
        socket, self.socket = self.socket, None
        if socket is not None:
            socket.close(0.0)

    def start(self, service: bytes, body: mdp.Frames) -> None:
        socket = self.connect()
        # A stray reply that reached the idle socket is dropped now (MDP-D-20).
        for message in socket.receive(256):
            self.handle(self.session.receive(message, self.now()))
        self.collecting = True
        self.handle(self.session.request(service, body, self.now()))

    async def next_reply(self) -> ClientEvent:
        replies = self.replies
        session = self.session
        while not replies:
            socket = self.connect()
            unsent = self.unsent
            unsent.extend(session.take_outgoing())
            while unsent and socket.send(unsent[0]) == SENT:
                unsent.popleft()
            # With a full pipe (unsent left), room to send wakes it too.
            await socket.wait(session.next_deadline(), writable=bool(unsent))
            self.client._check_open()
            messages = socket.receive(1)
            now = self.now()
            for message in messages:
                self.handle(session.receive(message, now))
            if not messages:
                self.handle(session.tick(now))
        return replies.popleft()

    def cancel(self) -> None:
        if self.session.state in (ClientState.WAITING, ClientState.RECONNECTING):
            self.handle(self.session.cancel(self.now()))
        self.collecting = False
        self.replies.clear()

    def close(self) -> None:
        if self.session.state is not ClientState.CLOSED:
            self.handle(self.session.close(self.now()))
        self.drop()


class Client:
    """MDP/0.2 client for asyncio with up to ``concurrency`` requests in flight; ``async with``.

    ``timeout``: seconds without a reply before a resend; ``retries``: resends before
    ``RequestTimeout``. ``context`` (any ``zmq.Context``, ``zmq.asyncio.Context`` too; for
    ``inproc://``) replaces the fresh context the client otherwise makes and terminates on exit.
    ``curve`` (``domo.curve.CurveClient``) encrypts the connection to a CURVE broker.
    ``endpoint`` may be several brokers' endpoints, in failover order (MDP-D-28). Each resend after
    a timeout goes on a new socket to the next; give ``retries`` at least the number of brokers.
    """

    def __init__(
        self,
        endpoint: str | Sequence[str],
        *,
        timeout: float = 2.5,
        retries: int = 3,
        concurrency: int = 1,
        context: zmq.Context[Any] | None = None,
        curve: CurveClient | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.endpoints = EndpointRing(endpoint).endpoints  # in failover order (MDP-D-28)
        self.endpoint = self.endpoints[0]
        self.curve = curve
        self.config = ClientConfig(timeout=timeout, retries=retries)
        self.concurrency = concurrency
        self._owned = context is None
        self._given_context = context
        self._context: zmq.Context[Any]
        self._idle: list[_Slot] = []
        self._slots: list[_Slot] = []
        self._free: asyncio.Semaphore | None = None  # one unit per session not in use
        self._entered = False
        self._closed = False

    async def __aenter__(self) -> Self:
        if self._entered:
            raise DomoError("a Client is entered once")
        self._entered = True
        given = self._given_context
        self._context = zmq.Context() if given is None else given
        self._free = asyncio.Semaphore(self.concurrency)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        try:
            for slot in self._slots:
                slot.close()
        finally:
            if self._owned:
                self._context.term()  # every socket is closed: returns at once

    async def request(self, service: str | bytes, *frames: bytes) -> list[bytes]:
        """Send a request and return the body of its FINAL (PARTIALs are skipped)."""
        name = service_name(service)
        slot = await self._acquire()
        try:
            slot.start(name, frames)
            event = await slot.next_reply()
            while isinstance(event, PartialReceived):
                event = await slot.next_reply()
        except BaseException:
            slot.cancel()  # cancelled: the session forgets the request and replaces its socket
            self._release(slot)
            raise
        self._release(slot)
        return final_body(name, event)

    def stream(self, service: str | bytes, *frames: bytes) -> ReplyStream:
        """The replies to a request: each PARTIAL, then the FINAL (``Reply.final`` is true).

        Use ``async with`` around it to cancel the request if you stop reading early.
        """
        name = service_name(service)
        return ReplyStream(self, mdp.check_service(name), mdp.check_body(frames))

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")

    async def _acquire(self) -> _Slot:
        """A free session: at once if one is free (no yield), else the first one released."""
        if not self._entered:
            raise DomoError("a Client is used inside 'async with Client(...) as client:'")
        self._check_open()
        assert self._free is not None
        await self._free.acquire()
        try:
            self._check_open()
        except ClientClosed:
            self._free.release()
            raise
        if self._idle:
            return self._idle.pop()
        slot = _Slot(self)
        self._slots.append(slot)
        return slot

    def _release(self, slot: _Slot) -> None:
        slot.collecting = False
        slot.replies.clear()
        if slot.reconnect:
            slot.drop()
        if self._closed:
            slot.close()
        else:
            self._idle.append(slot)
        assert self._free is not None
        self._free.release()


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
            slot = self._slot
            if slot is None:
                slot = self._slot = await self._client._acquire()
                slot.start(self._service, self._body)
            event = await slot.next_reply()
        except BaseException:
            self.abort()
            raise
        if isinstance(event, PartialReceived):
            return Reply(list(event.body), final=False)
        self._finish()
        return Reply(final_body(self._service, event), final=True)

    def abort(self) -> None:
        """Cancel the request if it is still in progress (nothing more will be read)."""
        if self._slot is not None:
            self._slot.cancel()
        self._finish()

    def _finish(self) -> None:
        self._done = True
        slot, self._slot = self._slot, None
        if slot is not None:
            self._client._release(slot)
