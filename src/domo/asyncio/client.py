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
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import zmq

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import ClientConfig, mdp
from domo.protocol.events import ClientEvent, PartialReceived
from domo.runtime import SENT, ClientClosed, DomoError, Reply, final_body, service_name
from domo.runtime.slots import ReplyStreamBase, Slot

from ._socket import AsyncConnection

__all__ = ["Client", "ReplyStream"]


class _Slot(Slot):
    """A slot (``domo.runtime.slots``) and its DEALER, used by one task at a time."""

    def __init__(self, client: Client) -> None:
        super().__init__(client.config, client.endpoints)
        self.client = client
        self.socket: AsyncConnection | None = None
        self.loop = asyncio.get_running_loop()

    def now(self) -> float:
        return max(self.loop.time(), self.session.now)

    def transmit(self, frames: tuple[bytes, ...]) -> bool:
        return self.socket.send(frames) == SENT  # type: ignore[union-attr]

    def connect(self) -> AsyncConnection:
        socket = self.socket
        if self.reconnect_at is not None or socket is None:
            self.drop()
            self.client._check_open()
            socket = self.socket = AsyncConnection(self.client._context, zmq.DEALER)
            if self.client.curve is not None:
                self.client.curve.apply(socket.socket)
            socket.socket.connect(self.endpoints.next())  # failover: MDP-D-28
            self.connected(self.now())
        return socket

    def drop(self) -> None:
        socket, self.socket = self.socket, None
        if socket is not None:
            socket.close(0.0)

    def start(self, service: bytes, body: mdp.Frames) -> None:
        socket = self.connect()
        now = self.now()
        # A stray reply that reached the idle socket is dropped now (MDP-D-20).
        for message in socket.receive(256):
            self.received(message, now)
        self.begin(service, body, now)

    async def next_reply(self) -> ClientEvent:
        replies = self.replies
        session = self.session
        while not replies:
            socket = self.connect()
            full = not self.flush()
            # With a full pipe, room to send wakes it too.
            await socket.wait(session.next_deadline(), writable=full)
            self.client._check_open()
            messages = socket.receive(1)
            if messages:
                self.received(messages[0], self.now())
            else:
                self.ticked(self.now())
        return replies.popleft()

    def close(self) -> None:
        self.end(self.now())
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
            slot.cancel(
                slot.now()
            )  # cancelled: the session forgets the request, replaces its socket
            self._release(slot)
            raise
        self._release(slot)
        return final_body(name, event)

    def stream(self, service: str | bytes, *frames: bytes) -> ReplyStream:
        """The replies to a request: each PARTIAL, then the FINAL (``Reply.final`` is true).

        Use ``async with`` around it to cancel the request if you stop reading early.
        """
        return ReplyStream(self, service_name(service), frames)

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
        slot.finish()
        if slot.reconnect_at is not None:
            slot.drop()
        if self._closed:
            slot.close()
        else:
            self._idle.append(slot)
        assert self._free is not None
        self._free.release()


class ReplyStream(ReplyStreamBase[_Slot]):
    """The replies of one request, as an async iterator; see ``Client.stream``."""

    def __init__(self, client: Client, service: bytes, body: Sequence[bytes]) -> None:
        super().__init__(service, body)
        self._client = client

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
        return self._reply(event)

    def _cancel(self, slot: _Slot) -> None:
        slot.cancel(slot.now())

    def _release(self, slot: _Slot) -> None:
        self._client._release(slot)
