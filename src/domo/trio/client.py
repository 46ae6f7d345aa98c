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
is one task switch per reply instead of the three a separate socket task would cost; a free
session is taken without a yield, and ``request`` reads the FINAL without the iterator layers of
``stream``.

Timeouts and retries are the session's (MDP-C-08, MDP-D-19): on a timeout it closes the socket,
opens a new one and resends; after ``retries`` resends the request raises ``RequestTimeout``.
The timeout counts from the request, or from the last reply handed to the reader: a ``stream``
reader that pauses longer than ``timeout`` between replies makes its request time out (after a
PARTIAL that is a failure, as a resend could repeat it). One watchdog task per ``Client`` keeps
those deadlines, rather than a cancel scope per request (entering and leaving one costs about a
fifth of a request's CPU here): it sleeps until the earliest reply deadline of its sessions and
ticks each session whose deadline has come; if the request's task is waiting on the socket, the
watchdog closes it, which wakes that task to the session's verdict (resend on a new socket, or
fail). Every new deadline is ``now + timeout``, later than every other deadline of the
``Client``, so a request only has to wake the watchdog when it had nothing to watch.

A FINAL reporting a handler error raises ``RemoteError`` (MDP-D-23). Cancelling a request (any
enclosing cancel scope) cancels it in the session, whose socket is then replaced, so a late reply
cannot reach the next request; the ``Client`` stays usable. Closing the ``Client`` closes every
socket, waking a request that waits on one with ``ClientClosed``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Self

import trio
import zmq

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import ClientConfig, mdp
from domo.protocol.events import ClientEvent, PartialReceived
from domo.runtime.replies import Reply
from domo.runtime.replies import final_body as _final_body
from domo.runtime.replies import service_name as _service_name
from domo.runtime.slots import ReplyStreamBase, Slot

from ._pump import BATCH
from ._transport import SENT, Connection, Transport, ZmqTransport
from .errors import ClientClosed, DomoError

__all__ = ["Client", "Reply", "ReplyStream", "call"]

_now = trio.current_time


class _Slot(Slot):
    """A slot (``domo.runtime.slots``) and its socket, owned by one request at a time (see the
    module docstring)."""

    def __init__(self, client: Client, transport: Transport) -> None:
        super().__init__(client.config, client.endpoints)
        self.client = client
        self.transport = transport
        self.conn: Connection[bytes] | None = None
        self.waiting = False  # the request's task is waiting on ``conn``
        self.closed = False

    def sent(self) -> None:
        self.client._watchdog.expect(self.session.next_deadline())

    def transmit(self, frames: tuple[bytes, ...]) -> bool:
        return self.conn.send(frames) == SENT  # type: ignore[union-attr]

    async def connection(self) -> Connection[bytes]:
        """The socket, replaced first if the session asked for a new one."""
        if self.reconnect_at is not None:
            self.drop_connection()
            if self.reconnect_at > _now():
                await trio.sleep_until(self.reconnect_at)
            self.check_open()
            self.conn = self.transport.connect(self.endpoints.next())  # failover: MDP-D-28
            self.connected(_now())
        assert self.conn is not None
        return self.conn

    async def start(self, service: bytes, body: mdp.Frames) -> None:
        """Hand a request to the session (which must be connected, IDLE, to take it)."""
        conn = self.conn if self.reconnect_at is None else await self.connection()
        assert conn is not None
        now = _now()
        # Whatever arrived while the session was idle (a stray reply) is read now, with no
        # request outstanding, so that it is dropped (MDP-D-20) rather than taken for this
        # request's reply.
        for message in conn.receive(BATCH):
            self.received(message, now)
        self.begin(service, body, now)

    async def next_reply(self) -> ClientEvent:
        """The next of this request's replies: PartialReceived, FinalReceived or RequestFailed."""
        replies = self.replies
        while not replies:
            await self.step()
        return replies.popleft()

    async def step(self) -> None:
        """Send what the session queued, then wait for a reply (or the watchdog) and read it."""
        conn = self.conn if self.reconnect_at is None else await self.connection()
        assert conn is not None
        full = not self.flush()
        self.waiting = True
        try:
            await conn.wait(full)  # with a full pipe, room to send wakes it too
        except trio.ClosedResourceError:
            self.check_open()
            if self.conn is conn:
                raise
            return  # the watchdog gave this socket up (a timeout): the session says what next
        finally:
            self.waiting = False
        if self.closed:
            raise ClientClosed("the client was closed")
        # One message per step: a reply is handed to its reader at once; a further one is
        # read by the next step, whose ``wait`` returns at once (with a checkpoint).
        messages = conn.receive(1)
        if messages:
            self.received(messages[0], _now())

    def expire(self, now: float) -> None:
        """The watchdog's call: the session's reply deadline has come (see the module docstring)."""
        self.ticked(now)
        if self.waiting and self.reconnect_at is not None:
            self.drop_connection()  # wakes the request's task, which reconnects or fails

    def check_open(self) -> None:
        if self.closed:
            raise ClientClosed("the client was closed")

    def drop_connection(self) -> None:
        """Close the socket at once: what is still queued on it must not be delivered."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close(0.0)

    def abandon(self) -> None:
        """Give up the request in progress; the socket is replaced before the next one."""
        if not self.closed:
            self.cancel(_now())
        self.finish()

    def release(self) -> None:
        """The request is over: hand the session back to the client."""
        self.finish()
        if self.reconnect_at is not None:
            self.drop_connection()  # not left open until the next request replaces it
        if not self.closed:
            self.client._give_back(self)

    def close(self) -> None:
        """The client closes: end the session and close the socket, waking a request on it."""
        self.closed = True
        self.end(_now())
        self.drop_connection()


class _Watchdog:
    """Ticks each session of a ``Client`` when its reply deadline comes (MDP-C-08)."""

    def __init__(self, slots: list[_Slot]) -> None:
        self._slots = slots
        self._alarm = trio.CancelScope()  # the current sleep; its deadline is the next check
        self.stopped = trio.CancelScope()

    def expect(self, deadline: float | None) -> None:
        """A session has a new reply deadline; make sure the watchdog wakes for it."""
        # Every other deadline is earlier: only a watchdog with nothing to watch sleeps longer.
        if deadline is not None and deadline < self._alarm.deadline:
            self._alarm.deadline = deadline

    async def run(self) -> None:
        """Until ``stopped`` is cancelled (the ``Client`` closes)."""
        with self.stopped:
            while True:
                with trio.CancelScope() as alarm:
                    alarm.deadline = self._check(trio.current_time())
                    self._alarm = alarm
                    await trio.sleep_forever()

    def _check(self, now: float) -> float:
        """Expire the sessions whose deadline has come; the earliest deadline left."""
        earliest = math.inf
        for slot in self._slots:
            deadline = slot.session.next_deadline()
            if deadline is not None and deadline <= now and not slot.closed:
                slot.expire(now)
                deadline = slot.session.next_deadline()  # a resend, or a PARTIAL, sets a new one
            if deadline is not None and deadline < earliest:
                earliest = deadline
        return earliest


class Client:
    """MDP/0.2 client with up to ``concurrency`` requests in flight; use ``async with``.

    ``timeout``: seconds without a reply before a resend; ``retries``: resends before
    ``RequestTimeout``. ``endpoint`` may be several brokers' endpoints: each socket connects to
    the first, and each resend after a timeout goes on a new socket to the next, round the list
    (failover, MDP-D-28); give ``retries`` at least the number of brokers. ``context`` (for
    ``inproc://``) or ``transport`` (for ``domo.trio.testing``) replace the default fresh ZeroMQ
    context. ``curve`` (``domo.curve.CurveClient``: the broker's public key and this client's key
    pair) encrypts the connection to a broker that requires CURVE (docs/security.md).
    """

    def __init__(
        self,
        endpoint: str | Sequence[str],
        *,
        timeout: float = 2.5,
        retries: int = 3,
        concurrency: int = 1,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        transport: Transport | None = None,
        curve: CurveClient | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.endpoints = EndpointRing(endpoint).endpoints  # in failover order (MDP-D-28)
        self.endpoint = self.endpoints[0]
        self.config = ClientConfig(timeout=timeout, retries=retries)
        self.concurrency = concurrency
        self._context = context
        self._curve = curve
        self.transport = transport  # a ZmqTransport is made on entry, so its context is closed
        self._idle: list[_Slot] = []
        self._waiters = trio.lowlevel.ParkingLot()  # requests waiting for a free session
        self._handed: list[_Slot] = []  # sessions released to a waiter it has not taken yet
        self._slots: list[_Slot] = []
        self._watchdog = _Watchdog(self._slots)
        self._entered = False
        self._closed = False
        self._nursery_manager: AbstractAsyncContextManager[trio.Nursery] | None = None

    async def __aenter__(self) -> Self:
        if self._entered:
            raise DomoError("a Client is entered once")
        if self.transport is None:
            self.transport = ZmqTransport(self._context, curve=self._curve)
        self._entered = True
        for _ in range(self.concurrency):
            slot = _Slot(self, self.transport)
            self._slots.append(slot)
        self._idle.extend(reversed(self._slots))
        # The watchdog runs in a nursery the Client owns, opened here and closed on exit: it
        # ends when the Client closes, and a failure of it cancels the block that uses the
        # Client instead of crashing the whole run (as a system task's would).
        self._nursery_manager = manager = trio.open_nursery()
        nursery = await manager.__aenter__()
        nursery.start_soon(self._watchdog.run, name=f"domo.Client({self.endpoint})")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self._watchdog.stopped.cancel()
        self._waiters.unpark_all()  # requests waiting for a session get ClientClosed
        try:
            for slot in self._slots:
                slot.close()  # a request waiting on a socket wakes with ClientClosed
        finally:
            try:
                assert self.transport is not None
                await self.transport.aclose()  # after every socket is closed
            finally:
                # Told nothing of the block's exception: the nursery would wrap it in an
                # ExceptionGroup. The watchdog is cancelled already, so this returns at once.
                assert self._nursery_manager is not None
                await self._nursery_manager.__aexit__(None, None, None)

    async def request(self, service: str | bytes, *frames: bytes) -> list[bytes]:
        """Send a request and return the body of its FINAL (PARTIALs are skipped)."""
        name = _service_name(service)
        slot = await self._acquire()
        try:
            await slot.start(name, frames)  # the session checks the service and the body
            event = await slot.next_reply()
            while isinstance(event, PartialReceived):
                event = await slot.next_reply()
        except BaseException:
            slot.abandon()  # cancelled: the session forgets the request and replaces its socket
            slot.release()
            raise
        slot.release()
        return _final_body(name, event)

    def stream(self, service: str | bytes, *frames: bytes) -> ReplyStream:
        """The replies to a request: each PARTIAL, then the FINAL (``Reply.final`` is true).

        Use ``async with`` around it to cancel the request if you stop reading early;
        otherwise its session stays taken until the stream is read to its end. Replies wait
        on the socket until read; the timeout restarts with each reply handed to the reader,
        so a reader that pauses longer than ``timeout`` makes the request time out.
        """
        return ReplyStream(self, _service_name(service), frames)

    async def _acquire(self) -> _Slot:
        """A free session: at once if one is idle (no yield: the wait for the reply is the
        request's checkpoint), else the first one released, in the order of the requests."""
        if not self._entered:
            raise DomoError("a Client is used inside 'async with Client(...) as client:'")
        if self._closed:
            raise ClientClosed("the client is closed")
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._idle and not self._waiters:
            return self._idle.pop()
        await self._waiters.park()
        if self._handed:
            return self._handed.pop()
        raise ClientClosed("the client was closed")

    def _give_back(self, slot: _Slot) -> None:
        """A session is free again: to the first request waiting for one, or idle."""
        if self._waiters:
            self._handed.append(slot)
            self._waiters.unpark()
        else:
            self._idle.append(slot)


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
                await slot.start(self._service, self._body)
            event = await slot.next_reply()
        except BaseException:
            self.abort()  # cancelled: the session forgets the request and replaces its socket
            raise
        return self._reply(event)

    def _cancel(self, slot: _Slot) -> None:
        slot.abandon()

    def _release(self, slot: _Slot) -> None:
        slot.release()


def call(
    endpoint: str,
    service: str | bytes,
    *frames: bytes,
    timeout: float = 2.5,
    retries: int = 3,
    curve: CurveClient | None = None,
) -> list[bytes]:
    """One request from synchronous code: runs Trio, returns the FINAL body or raises."""

    async def one_request() -> list[bytes]:
        async with Client(endpoint, timeout=timeout, retries=retries, curve=curve) as client:
            return await client.request(service, *frames)

    return trio.run(one_request)
