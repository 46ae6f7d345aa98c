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

import contextlib
import math
import select
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Final, Self

import zmq
import zmq.backend

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import ClientConfig, mdp
from domo.protocol.events import ClientEvent, PartialReceived
from domo.runtime import Body, ClientClosed, Reply, as_frames, final_body, service_name
from domo.runtime.slots import ReplyStreamBase, Slot

from ._socket import readable, ready, receive, send

_get: Any = zmq.backend.Socket.get
_FD: Final = int(zmq.FD)

__all__ = ["Client", "ReplyStream", "call"]

_POLLIN: Final = int(zmq.POLLIN)  # ints: an enum costs a Python call per operation
_POLLOUT: Final = int(zmq.POLLOUT)
_poll: Any = zmq.zmq_poll


class _Slot(Slot):
    """A slot (``domo.runtime.slots``) and its DEALER, used by one thread at a time."""

    def __init__(self, client: Client) -> None:
        super().__init__(client.config, client.endpoints)
        self.client = client
        self.socket: zmq.Socket[bytes] | None = None
        self.mask = _POLLIN  # what to wait for: with messages left unsent, room to send too

    def now(self) -> float:
        now = time.monotonic()
        last = self.session.now
        return last if last > now else now

    def connect(self) -> zmq.Socket[bytes]:
        """The socket, replaced first (linger 0) if the session gave the old one up."""
        socket = self.socket
        if self.reconnect_at is not None or socket is None:
            self.drop()
            self.client._check_open()
            socket = self.socket = self.client._context.socket(zmq.DEALER)
            if self.client.curve is not None:
                self.client.curve.apply(socket)
            socket.connect(self.endpoints.next())  # failover: MDP-D-28
            self.connected(self.now())
        return socket

    def drop(self) -> None:
        socket, self.socket = self.socket, None
        if socket is not None:
            socket.close(linger=0)

    def start(self, service: bytes, body: mdp.Frames) -> None:
        """Hand a request to the session and send it (what does not fit waits for room)."""
        socket = self.socket
        if self.reconnect_at is not None or socket is None:
            socket = self.connect()
        now = time.monotonic()  # ``now()``, one call less
        last = self.session.now
        if last > now:
            now = last
        # A stray reply that reached the idle socket is read now, with no request outstanding,
        # so that it is dropped (MDP-D-20) rather than taken for this request's.
        while readable(socket):
            self.received(receive(socket), now)
        self.begin(service, body, now)
        self.mask = _POLLIN if self.flush() else _BOTH

    def transmit(self, frames: tuple[bytes, ...]) -> bool:
        return send(self.socket, frames)  # type: ignore[arg-type]

    def send(self) -> zmq.Socket[bytes]:
        """Send what the session queued, on a new socket if it gave the old one up."""
        socket = self.connect()
        self.mask = _POLLIN if self.flush() else _BOTH
        return socket

    def step(self, readable: bool) -> None:
        """After a wait: read the message that is ready, or tick the session; then send."""
        now = time.monotonic()  # ``now()``, one call less
        last = self.session.now
        if last > now:
            now = last
        if readable:  # ``received``, one call less
            self.handle(self.session.receive(receive(self.socket), now))  # type: ignore[arg-type]
        else:
            self.ticked(now)
        if self.reconnect_at is None:
            self.mask = _POLLIN if self.flush() else _BOTH
        elif self.collecting:  # a resend, on a new socket (none for a request that is over)
            self.send()

    def next_reply(self) -> ClientEvent:
        """Wait for a reply or a deadline until the request has its next reply event."""
        replies = self.replies
        session = self.session
        while not replies:
            socket = self.send() if self.reconnect_at is not None else self.socket
            timeout = _timeout(session.next_deadline())
            if self.client._closed:
                raise ClientClosed("the client was closed")
            events = _poll([(socket, self.mask)], timeout)
            self.step(bool(events) and bool(events[0][1] & _POLLIN))
        return replies.popleft()

    def close(self) -> None:
        self.end(self.now())
        self.drop()


_BOTH: Final = _POLLIN | _POLLOUT


def _timeout(deadline: float | None) -> int:
    """zmq_poll's timeout (ms, -1 for none) until ``deadline``."""
    if deadline is None or deadline == math.inf:
        return -1
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


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
        slot = self._take()
        try:
            slot.start(name, frames)  # the session checks the service and the body
            event = slot.next_reply()
            while isinstance(event, PartialReceived):
                event = slot.next_reply()
        except BaseException:
            slot.cancel(slot.now())  # Ctrl-C, say: the socket is replaced before the next use
            self._release(slot)
            raise
        self._release(slot)
        return final_body(name, event)

    def map(
        self, service: str | bytes, bodies: Iterable[Body], *, window: int | None = None
    ) -> Generator[list[bytes], None, None]:
        """One request per body, up to ``window`` in flight (default: ``concurrency``) from the
        calling thread alone; yields each FINAL body in the order of ``bodies``.

        A body is ``bytes`` (one frame) or a sequence of ``bytes``. Each request is sent as soon
        as a session is free, and all the sessions' sockets are waited on at once, so one thread
        keeps ``window`` requests going without a thread per request. A request that fails
        raises at its place in the order (``RequestTimeout``, ``RemoteError``); closing the
        iterator early, or an error, cancels the requests still in flight.
        """
        name = mdp.check_service(service_name(service))
        window = self.concurrency if window is None else window
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        return self._map(name, iter(bodies), min(window, self.concurrency))

    def _map(
        self, name: bytes, bodies: Iterator[Body], window: int
    ) -> Generator[list[bytes], None, None]:
        taken: list[_Slot] = []  # the sessions this map holds
        free: list[_Slot] = []
        busy: dict[_Slot, int] = {}  # session -> the index of its request
        done: dict[int, ClientEvent] = {}  # index -> the event that ended its request
        sent = yielded = 0
        more = True
        earliest = math.inf  # no later than the earliest deadline of the sessions in ``busy``
        sockets = _Sockets()
        try:
            while True:
                while yielded in done:
                    event = done.pop(yielded)
                    yielded += 1
                    yield final_body(name, event)
                # Keep ``window`` requests in flight while there are bodies.
                while more and (free or len(taken) < window):
                    if free:
                        slot = free.pop()
                    else:
                        got = self._acquire(wait=not taken)
                        if got is None:
                            break
                        slot = got
                        taken.append(slot)
                    try:
                        body = next(bodies)
                    except StopIteration:
                        more = False
                        free.append(slot)
                        break
                    slot.start(name, as_frames(body))
                    sockets.touched(slot)
                    busy[slot] = sent
                    sent += 1
                    due = slot.session.next_deadline()
                    if due is not None and due < earliest:
                        earliest = due
                if not busy:
                    if more:
                        continue
                    return
                # Wait on every busy session's socket at once, until the earliest deadline.
                # ``earliest`` is never later than it: a reply or a failure only takes a
                # deadline away, and every deadline set since (a request, a resend, a PARTIAL)
                # is now + timeout, later than those already there. A wake-up at ``earliest``
                # may find nothing due; it then looks at every session's deadline again.
                if self._closed:
                    raise ClientClosed("the client was closed")
                for slot, events in sockets.wait(_timeout(earliest)):
                    if slot in busy:
                        slot.step(bool(events & _POLLIN))
                        _collect(slot, busy, done, free, sockets)
                if earliest <= time.monotonic():
                    earliest = math.inf
                    for slot in list(busy):
                        due = slot.session.next_deadline()
                        if due is not None and due <= slot.now():
                            slot.step(False)
                            _collect(slot, busy, done, free, sockets)
                            due = slot.session.next_deadline() if slot in busy else None
                        if due is not None and due < earliest:
                            earliest = due
        finally:
            for slot in taken:
                if slot in busy:
                    slot.cancel(slot.now())
                slot.finish()
                self._release(slot)

    def stream(self, service: str | bytes, *frames: bytes) -> ReplyStream:
        """The replies to a request: each PARTIAL, then the FINAL (``Reply.final`` is true).

        Use ``with`` around it to cancel the request if you stop reading early. The timeout
        restarts with each reply received.
        """
        return ReplyStream(self, service_name(service), frames)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the client is closed")

    def _acquire(self, wait: bool = True) -> _Slot | None:
        with self._lock:
            while True:
                self._check_open()
                if self._idle:
                    return self._idle.pop()
                if len(self._slots) < self.concurrency:
                    slot = _Slot(self)
                    self._slots.append(slot)
                    return slot
                if not wait:
                    return None
                self._released.wait()

    def _take(self) -> _Slot:
        slot = self._acquire()
        assert slot is not None
        return slot

    def _release(self, slot: _Slot) -> None:
        slot.finish()
        if slot.reconnect_at is not None:
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


def _collect(
    slot: _Slot,
    busy: dict[_Slot, int],
    done: dict[int, ClientEvent],
    free: list[_Slot],
    sockets: _Sockets,
) -> None:
    """After ``slot`` stepped: move its request's ending event (PARTIALs are skipped) to
    ``done``, or have its socket checked before the next wait."""
    replies = slot.replies
    while replies:
        event = replies.popleft()
        if not isinstance(event, PartialReceived):
            done[busy.pop(slot)] = event
            slot.finish()
            free.append(slot)
            return
    sockets.touched(slot)


class _Sockets:
    """Several slots' sockets waited on at once, for ``Client.map``.

    ``zmq_poll`` reads every socket's EVENTS before it sleeps and again when it wakes (each
    read is two system calls in libzmq). Here the sockets' ZMQ_FDs are waited on in one
    ``poll(2)``, and EVENTS is read only for a socket that was used since it was last read
    (``touched``: a send or receive may have consumed its FD's wake-up) or whose FD fired.
    """

    def __init__(self) -> None:
        self._poller = select.poll()
        self._by_fd: dict[int, _Slot] = {}
        self._fd_of: dict[_Slot, tuple[zmq.Socket[bytes], int]] = {}
        self._check: dict[_Slot, None] = {}  # in order, once each

    def touched(self, slot: _Slot) -> None:
        """``slot`` used its socket (or has a new one): read its EVENTS before the next sleep."""
        socket = slot.socket
        assert socket is not None
        known = self._fd_of.get(slot)
        if known is None or known[0] is not socket:
            if known is not None:
                self._by_fd.pop(known[1], None)
                with contextlib.suppress(KeyError):
                    self._poller.unregister(known[1])
            fd: int = _get(socket, _FD)
            self._poller.register(fd, select.POLLIN)
            self._by_fd[fd] = slot
            self._fd_of[slot] = (socket, fd)
        self._check[slot] = None

    def wait(self, timeout: int) -> list[tuple[_Slot, int]]:
        """The slots whose socket is ready (for what their ``mask`` says), with its EVENTS;
        sleeps up to ``timeout`` ms (-1: no limit) first if none is. May be empty."""
        found = self._ready(list(self._check))
        self._check.clear()
        if found:
            return found
        by_fd = self._by_fd
        woken = [slot for fd, _ in self._poller.poll(timeout) if (slot := by_fd.get(fd))]
        return self._ready(woken)

    @staticmethod
    def _ready(slots: list[_Slot]) -> list[tuple[_Slot, int]]:
        if len(slots) == 1:  # the usual case: one socket touched, or one woken
            slot = slots[0]
            socket = slot.socket
            if socket is None:
                return []
            found = _poll([(socket, slot.mask)], 0)  # ``ready``, one call less
            return [(slot, found[0][1])] if found else []
        items = []
        owner = {}
        for slot in slots:
            socket = slot.socket
            if socket is not None:
                items.append((socket, slot.mask))
                owner[id(socket)] = slot
        if not items:
            return []
        return [(owner[id(socket)], events) for socket, events in ready(items)]


class ReplyStream(ReplyStreamBase[_Slot]):
    """The replies of one request, as an iterator; see ``Client.stream``."""

    def __init__(self, client: Client, service: bytes, body: Sequence[bytes]) -> None:
        super().__init__(service, body)
        self._client = client

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
                slot = self._slot = self._client._take()
                slot.start(self._service, self._body)
            event = slot.next_reply()
        except BaseException:
            self.abort()
            raise
        return self._reply(event)

    def _cancel(self, slot: _Slot) -> None:
        slot.cancel(slot.now())

    def _release(self, slot: _Slot) -> None:
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
