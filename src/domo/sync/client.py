"""``Client``: MDP/0.2 requests from blocking code (threads, Flask, Django, scripts).

::

    with Client("tcp://127.0.0.1:5555", timeout=2.5, retries=3) as client:
        body = client.request("echo", b"hello")                  # the FINAL body
        with client.stream("count", b"3") as replies:             # every PARTIAL, then the FINAL
            for reply in replies:
                print(reply.body, reply.final)

It drives the same ``ClientSession`` as ``domo.trio.Client`` over plain pyzmq: the calling thread
owns a session and its DEALER for the length of one request, sends, and sleeps in ``zmq_poll``
until a reply or the session's deadline. No thread of its own, nothing running between requests
(MDP/Client has no heartbeat).

MDP/0.2 has no request id, so a socket carries one request at a time (MDP-C-07): the ``Client``
keeps a pool of up to ``concurrency`` sessions, each with its own socket, made when first needed.
A request takes a free session or waits (up to its timeout budget) for one to be released.

Thread safety: ``request``, ``stream`` and ``close`` may be called from any number of threads at
once; each request uses its session from one thread at a time, handed over under a lock (ZeroMQ
sockets may move between threads that way). A ``ReplyStream`` is read by one thread.

Timeouts and retries are the session's (MDP-C-08, MDP-D-19): on a timeout the socket is closed, a
new one opened and the request resent; after ``retries`` resends the request raises
``RequestTimeout``. A FINAL that reports a handler error raises ``RemoteError`` (MDP-D-23).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Final, Self

import zmq

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import ClientConfig, ClientSession, ClientState, mdp
from domo.protocol.events import ClientEvent, PartialReceived, ReconnectRequired
from domo.runtime import (
    REPLY_EVENTS,
    ClientClosed,
    Reply,
    final_body,
    log_event,
    service_name,
)

from ._socket import readable, receive, send

__all__ = ["Client", "ReplyStream", "call"]

logger = logging.getLogger("domo.client")

_POLLIN: Final = int(zmq.POLLIN)  # ints: an enum costs a Python call per operation
_POLLOUT: Final = int(zmq.POLLOUT)
_poll: Any = zmq.zmq_poll


class _Slot:
    """One session and its DEALER, used by one thread at a time."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.session = ClientSession(client.config)
        self.endpoints = EndpointRing(client.endpoints)  # each slot moves on by itself
        self.socket: zmq.Socket[bytes] | None = None
        self.reconnect = True  # open a new socket before the next use
        self.unsent: deque[tuple[bytes, ...]] = deque()  # taken from the outbox; pipe was full
        self.replies: deque[ClientEvent] = deque()
        self.collecting = False

    def now(self) -> float:
        return max(time.monotonic(), self.session.now)

    def handle(self, events: list[ClientEvent]) -> None:
        for event in events:
            if isinstance(event, ReconnectRequired):
                self.reconnect = True
                self.unsent.clear()  # they belonged to the socket being given up
            if self.collecting and isinstance(event, REPLY_EVENTS):
                self.replies.append(event)
                self.collecting = isinstance(event, PartialReceived)
            else:
                log_event(logger, event)

    def connect(self) -> zmq.Socket[bytes]:
        """The socket, replaced first (linger 0) if the session gave the old one up."""
        if self.reconnect or self.socket is None:
            self.drop()
            self.client._check_open()
            self.socket = self.client._context.socket(zmq.DEALER)
            if self.client.curve is not None:
                self.client.curve.apply(self.socket)
            self.socket.connect(self.endpoints.next())  # failover: MDP-D-28
            self.reconnect = False
            self.handle(self.session.connected(self.now()))
        return self.socket

    def drop(self) -> None:
        socket, self.socket = self.socket, None
        if socket is not None:
            socket.close(linger=0)

    def start(self, service: bytes, body: mdp.Frames) -> None:
        socket = self.connect()
        # A stray reply that reached the idle socket is read now, with no request outstanding,
        # so that it is dropped (MDP-D-20) rather than taken for this request's.
        while readable(socket):
            self.handle(self.session.receive(receive(socket), self.now()))
        self.collecting = True
        self.handle(self.session.request(service, body, self.now()))

    def next_reply(self) -> ClientEvent:
        """Send what the session queued, wait for a reply or a deadline; the next reply event."""
        replies = self.replies
        session = self.session
        while not replies:
            socket = self.connect()
            unsent = self.unsent
            unsent.extend(session.take_outgoing())
            full = False
            while unsent:
                if not send(socket, unsent[0]):  # the pipe is full: wait for room
                    full = True
                    break
                unsent.popleft()
            deadline = session.next_deadline()
            timeout = -1
            if deadline is not None:
                timeout = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            if self.client._closed:
                raise ClientClosed("the client was closed")
            events = _poll([(socket, _POLLIN | _POLLOUT if full else _POLLIN)], timeout)
            now = self.now()
            if events and events[0][1] & _POLLIN:
                self.handle(session.receive(receive(socket), now))
            else:
                self.handle(session.tick(now))
        return replies.popleft()

    def cancel(self) -> None:
        """Give up the request in progress; the socket is replaced before the next one."""
        if self.session.state in (ClientState.WAITING, ClientState.RECONNECTING):
            self.handle(self.session.cancel(self.now()))
        self.collecting = False
        self.replies.clear()

    def close(self) -> None:
        if self.session.state is not ClientState.CLOSED:
            self.handle(self.session.close(self.now()))
        self.drop()


class Client:
    """A blocking MDP/0.2 client with up to ``concurrency`` requests in flight (see the module).

    ``timeout``: seconds without a reply before a resend; ``retries``: resends before
    ``RequestTimeout``. ``context`` (for ``inproc://``) replaces the fresh ZeroMQ context the
    client otherwise makes and terminates on ``close``. Use it as a context manager, or call
    ``close``. ``curve`` (``domo.curve.CurveClient``) encrypts the connection to a CURVE broker.
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
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
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
        self._context: zmq.Context[zmq.Socket[bytes]] = (
            zmq.Context() if context is None else context
        )
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._idle: list[_Slot] = []
        self._slots: list[_Slot] = []
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every idle session's socket and the context (if the client made it).

        A request in progress in another thread fails with ``ClientClosed`` at its next wake-up
        (at the latest its reply deadline); its socket is closed when it ends.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
            busy = len(self._slots) - len(idle)
            self._released.notify_all()
        for slot in idle:
            slot.close()
        if self._owned and busy == 0:
            self._context.term()

    def request(self, service: str | bytes, *frames: bytes) -> list[bytes]:
        """Send a request and return the body of its FINAL (PARTIALs are skipped)."""
        name = service_name(service)
        slot = self._acquire()
        try:
            slot.start(name, frames)  # the session checks the service and the body
            event = slot.next_reply()
            while isinstance(event, PartialReceived):
                event = slot.next_reply()
        except BaseException:
            slot.cancel()  # KeyboardInterrupt, say: the socket is replaced before the next use
            self._release(slot)
            raise
        self._release(slot)
        return final_body(name, event)

    def stream(self, service: str | bytes, *frames: bytes) -> ReplyStream:
        """The replies to a request: each PARTIAL, then the FINAL (``Reply.final`` is true).

        Use ``with`` around it to cancel the request if you stop reading early. The timeout
        restarts with each reply received.
        """
        name = service_name(service)
        return ReplyStream(self, mdp.check_service(name), mdp.check_body(frames))

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")

    def _acquire(self) -> _Slot:
        with self._lock:
            while True:
                self._check_open()
                if self._idle:
                    return self._idle.pop()
                if len(self._slots) < self.concurrency:
                    slot = _Slot(self)
                    self._slots.append(slot)
                    return slot
                self._released.wait()

    def _release(self, slot: _Slot) -> None:
        slot.collecting = False
        slot.replies.clear()
        if slot.reconnect:
            slot.drop()  # not left open until the next request replaces it
        with self._lock:
            if not self._closed:
                self._idle.append(slot)
                self._released.notify()
                return
            self._slots.remove(slot)
            last = len(self._slots) == len(self._idle)
        slot.close()
        if last and self._owned:
            self._context.term()


class ReplyStream:
    """The replies of one request, as an iterator; see ``Client.stream``."""

    def __init__(self, client: Client, service: bytes, body: mdp.Frames) -> None:
        self._client = client
        self._service = service
        self._body = body
        self._slot: _Slot | None = None
        self._done = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.abort()

    def __iter__(self) -> Iterator[Reply]:
        return self

    def __next__(self) -> Reply:
        if self._done:
            raise StopIteration
        try:
            slot = self._slot
            if slot is None:
                slot = self._slot = self._client._acquire()
                slot.start(self._service, self._body)
            event = slot.next_reply()
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


def call(
    endpoint: str,
    service: str | bytes,
    *frames: bytes,
    timeout: float = 2.5,
    retries: int = 3,
) -> list[bytes]:
    """One request from blocking code: returns the FINAL body or raises a ``DomoError``."""
    with Client(endpoint, timeout=timeout, retries=retries) as client:
        return client.request(service, *frames)
