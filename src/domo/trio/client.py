"""``Client``: MDP/0.2 requests from Trio code, and ``call`` for synchronous scripts.

::

    async with Client("tcp://127.0.0.1:5555", timeout=2.5, retries=3) as client:
        body = await client.request("echo", b"hello")            # the FINAL body
        async with client.stream("count", b"3") as replies:       # every PARTIAL, then the FINAL
            async for reply in replies:
                print(reply.body, reply.final)

MDP/0.2 has no request id, so a socket carries one request at a time (MDP-C-07). A ``Client``
runs ``concurrency`` sessions, each a ``ClientSession`` on its own DEALER with its own pump;
a request waits for a free session. Timeouts and retries are the session's (MDP-C-08, MDP-D-19):
on a timeout it closes the socket, opens a new one and resends; after ``retries`` resends the
request raises ``RequestTimeout``. A FINAL reporting a handler error raises ``RemoteError``
(MDP-D-23). Cancelling a request (any enclosing cancel scope) cancels it in the session, whose
socket is then replaced, so a late reply cannot reach the next request; the ``Client`` stays
usable.
"""

from __future__ import annotations

import logging
import math
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import trio
import zmq

from domo.protocol import ClientConfig, ClientSession, ClientState, mdp
from domo.protocol.events import ClientEvent, FinalReceived, PartialReceived, RequestFailed

from ._pump import SessionPump, log_event
from ._transport import Transport, ZmqTransport
from .errors import ClientClosed, DomoError, RemoteError, RequestTimeout, parse_error_body

__all__ = ["Client", "Reply", "ReplyStream", "call"]

logger = logging.getLogger("domo.client")


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply to a request: a PARTIAL (``final`` false) or the FINAL."""

    body: list[bytes]
    final: bool


class _Slot:
    """One session, its pump, and where its replies go while a request is in progress."""

    def __init__(self, client: Client, transport: Transport) -> None:
        self.session = ClientSession(client.config)
        self.pump: SessionPump[ClientEvent] = SessionPump(
            self.session,
            lambda: transport.connect(client.endpoint),
            lambda event: client._route(self, event),
            self.session.close,
            linger=0.0,  # a request left on an abandoned socket must not be delivered
        )
        self.sink: trio.MemorySendChannel[ClientEvent] | None = None


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
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        if self.transport is None:
            self.transport = ZmqTransport(self._context)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(self.transport.aclose)  # after every socket is closed
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            for _ in range(self.concurrency):
                slot = _Slot(self, self.transport)
                self._nursery.start_soon(slot.pump.run)
                self._idle_send.send_nowait(slot)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        self._idle_send.close()  # requests waiting for a session get ClientClosed
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()  # each pump closes its session and socket
        try:
            return await self._stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The nursery wraps what the body raised; give the caller its own exception back.
            if exc is not None and group.exceptions == (exc,):
                raise exc from None
            raise

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

    def _route(self, slot: _Slot, event: ClientEvent) -> None:
        sink = slot.sink
        if sink is None or not isinstance(event, PartialReceived | FinalReceived | RequestFailed):
            log_event(logger, event)
            return
        sink.send_nowait(event)
        if not isinstance(event, PartialReceived):  # the request is over: free the session
            slot.sink = None
            if not self._closed:
                self._idle_send.send_nowait(slot)


class ReplyStream:
    """The replies of one request, as an async iterator; see ``Client.stream``."""

    def __init__(self, client: Client, service: bytes, body: mdp.Frames) -> None:
        self._client = client
        self._service = service
        self._body = body
        self._slot: _Slot | None = None
        self._sink: trio.MemorySendChannel[ClientEvent] | None = None
        self._events: trio.MemoryReceiveChannel[ClientEvent] | None = None
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
            if self._events is None:
                self._events = await self._start()
            event = await self._events.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._done = True
            raise ClientClosed("the client was closed") from None
        except BaseException:
            self.abort()  # cancelled: the session forgets the request and replaces its socket
            raise
        if isinstance(event, PartialReceived):
            return Reply(list(event.body), final=False)
        self._done = True
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
        self._done = True
        slot = self._slot
        if slot is not None and slot.sink is self._sink and slot.session.service is not None:
            slot.pump.call(slot.session.cancel)

    async def _start(self) -> trio.MemoryReceiveChannel[ClientEvent]:
        client = self._client
        if client._nursery is None:
            raise DomoError("a Client is used inside 'async with Client(...) as client:'")
        if client._closed:
            raise ClientClosed("the client is closed")
        slot = await client._idle.receive()
        try:
            while slot.session.state is not ClientState.IDLE:  # its socket is being replaced
                if client._closed:
                    raise ClientClosed("the client is closed")
                await slot.pump.ready.wait()
        except BaseException:
            if not client._closed:
                client._idle_send.send_nowait(slot)
            raise
        self._sink, events = trio.open_memory_channel[ClientEvent](math.inf)
        self._slot, slot.sink = slot, self._sink
        slot.pump.call(slot.session.request, self._service, self._body)
        return events


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
