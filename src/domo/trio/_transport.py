"""The two things the Trio runtime needs from a network, and their ZeroMQ implementation.

A ``Connection`` is one socket, used by one task at a time (its pump, mostly): it can wait for
something to do, hand over the messages that are ready, and try to send one message without
blocking. A ``Transport`` makes connections: one ROUTER bound to endpoints (the broker) or one
DEALER connected to an endpoint (a client or worker session). ``ZmqTransport`` does this over
pyzmq; ``domo.trio.testing.FakeNetwork`` does it in memory, so the same pumps run in virtual time.

A DEALER's connection gives ``bytes`` (``Connection[bytes]``). The broker's ROUTER gives a large
frame (64 KiB or more) as a read-only ``memoryview`` of the frame ZeroMQ received
(``Connection[BodyFrame]``), and a large frame is sent without a copy too: the broker core relays
bodies without reading them, so a body crosses the broker without a copy (MDP-S-03).

ZeroMQ's ``ZMQ_FD`` is edge-triggered and every call on the socket may consume the edge, so the
only place a pump sleeps is ``ZmqConnection.wait``: it reads ``EVENTS`` and, if nothing is ready,
waits for the FD with no checkpoint in between. Everything else is non-blocking.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar, cast

import trio
import zmq
import zmq.backend

from domo.curve import CurveClient, CurveServer
from domo.endpoints import check_endpoint
from domo.protocol.mdp import BodyFrame
from domo.runtime.pending import PENDING_FROM, PENDING_FULL, PendingBytes
from domo.runtime.pumping import EAGAIN, EHOSTUNREACH, SENT

__all__ = [
    "EAGAIN",
    "EHOSTUNREACH",
    "PENDING_FULL",
    "SENT",
    "Connection",
    "Transport",
    "ZmqTransport",
]

logger = logging.getLogger("domo.transport")


FrameT = TypeVar("FrameT", bound=BodyFrame)  # what a connection's messages are made of


class Connection(Protocol[FrameT]):
    """One socket, used by one task at a time; its messages are lists of ``FrameT``."""

    async def wait(self, writable: bool) -> None:
        """Return when a message may be received (or, if ``writable``, sent). Always checkpoints."""

    def receive(self, limit: int) -> list[list[FrameT]]:
        """Up to ``limit`` messages that are ready now, without blocking."""

    def readable(self) -> bool:
        """Is a message ready now? For a task that sent on a connection another task waits on.

        A send may consume the wake-up of a message that has just arrived (ZeroMQ's FD is
        edge-triggered); if this says True after such a send, the waiting task must be woken.
        """

    def send(self, frames: Sequence[FrameT]) -> int:
        """Send one message without blocking: ``SENT``, ``EAGAIN`` or ``EHOSTUNREACH``.

        A ROUTER takes the peer identity as the first frame.
        """

    def close(self, linger: float) -> None:
        """Close; queued outgoing messages get up to ``linger`` seconds to leave."""


class Transport(Protocol):
    """Makes connections; ``aclose`` once every connection it made is closed."""

    def bind(self, endpoints: Sequence[str], hwm: int) -> tuple[Connection[BodyFrame], list[str]]:
        """A ROUTER bound to every endpoint; also returns the endpoints as actually bound."""

    def connect(self, endpoint: str) -> Connection[bytes]:
        """A DEALER connected to ``endpoint``."""

    async def aclose(self) -> None:
        """Release what the transport holds (a ZeroMQ context it created)."""


# The socket methods of pyzmq's compiled backend, called directly on the hot path: the
# ``zmq.Socket`` wrappers re-check their arguments on every frame. Typed ``Any`` so that their
# results need no ``typing.cast``, which is a function call too: (socket, flags, copy) -> Frame,
# (socket, option) -> int, (socket, data, flags[, copy]).
_COPY_BELOW: Final = zmq.COPY_THRESHOLD  # 64 KiB: a smaller frame is copied, a larger one is not
_send: Any = zmq.backend.Socket.send
_recv: Any = zmq.backend.Socket.recv
_get: Any = zmq.backend.Socket.get
_NOBLOCK: Final = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_POLLIN_POLLOUT: Final = int(zmq.POLLIN | zmq.POLLOUT)


class ZmqConnection(Generic[FrameT]):
    """A pyzmq socket driven the edge-triggered way (see the module docstring).

    A frame of ``views_from`` bytes or more is received as a read-only memoryview of the
    ``zmq.Frame`` (``FrameT`` must then be ``BodyFrame``); the others as ``bytes``.
    """

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        views_from: float = math.inf,
        pending: PendingBytes | None = None,
    ) -> None:
        self._socket = socket
        self._views_from = views_from
        self._pending = pending  # a broker's ROUTER: large messages count against it (MDP-D-30)
        # Set by the broker: is this routing id only a worker? A worker's pipe holds one
        # REQUEST at most, whose body the broker holds anyway (MDP-D-26): not counted (MDP-D-30).
        self.uncounted: Callable[[bytes], bool] | None = None
        self._fd = cast(int, socket.getsockopt(zmq.FD))
        self._has_message = False  # EVENTS showed a message, and no receive has run since

    async def wait(self, writable: bool) -> None:
        mask = _POLLIN_POLLOUT if writable else _POLLIN
        socket = self._socket
        events: int = _get(socket, _EVENTS)
        if events & mask:
            self._has_message = bool(events & _POLLIN)
            await trio.lowlevel.checkpoint()  # a busy socket must not starve other tasks
            return
        while True:
            # Reading EVENTS just now re-armed the edge; nothing may touch the socket until
            # wait_readable is entered, so no checkpoint in between.
            await trio.lowlevel.wait_readable(self._fd)
            events = _get(socket, _EVENTS)
            if events & mask:
                self._has_message = bool(events & _POLLIN)
                return

    def receive(self, limit: int) -> list[list[FrameT]]:
        # pyzmq's recv_multipart, without its per-call checks: this runs for every message.
        # EVENTS says whether a message is there: cheaper than the zmq.Again an empty socket
        # raises (pyzmq builds that exception with an import and an errno lookup). It is not
        # read again for the first message when ``wait`` has just seen one (only a receive
        # takes a message away). Frames come as zmq.Frame, whose ``more`` is read in C:
        # ``get(RCVMORE)`` goes through a Python enum on every call.
        # A large frame stays in ZeroMQ's buffer, seen through a memoryview, on a connection
        # made with ``views_from`` (typed Connection[BodyFrame]: the frames are Any here).
        messages: list[list[Any]] = []
        socket = self._socket
        recv, get, views_from = _recv, _get, self._views_from
        ready, self._has_message = self._has_message, False
        for _ in range(limit):
            if not ready and not get(socket, _EVENTS) & _POLLIN:
                break
            ready = False
            frame: zmq.Frame = recv(socket, _NOBLOCK, False)
            frames = [frame.bytes if len(frame) < views_from else _view(frame)]
            while frame.more:
                frame = recv(socket, _NOBLOCK, False)
                frames.append(frame.bytes if len(frame) < views_from else _view(frame))
            messages.append(frames)
        return messages

    def readable(self) -> bool:
        self._has_message = bool(_get(self._socket, _EVENTS) & _POLLIN)
        return self._has_message

    def send(self, frames: Sequence[FrameT]) -> int:
        socket = self._socket
        send = _send
        pending = self._pending
        if pending is not None:
            size = sum(map(len, frames))
            if size >= PENDING_FROM and not (
                self.uncounted is not None and self.uncounted(cast(bytes, frames[0]))
            ):
                return self._send_tracked(frames, size, pending)
        try:
            # A multipart send is atomic: it fails on the first frame or not at all.
            last = len(frames) - 1
            for index, frame in enumerate(frames):
                flags = _NOBLOCK_SNDMORE if index < last else _NOBLOCK
                if len(frame) < _COPY_BELOW:
                    send(socket, frame, flags)
                else:  # a large body leaves without a copy: ZeroMQ keeps a reference
                    send(socket, frame, flags, False)
        except zmq.Again:
            return EAGAIN
        except zmq.ZMQError as error:
            if error.errno == zmq.EHOSTUNREACH:
                return EHOSTUNREACH
            raise
        return SENT

    def watch_closed(self) -> ZmqConnection[bytes]:
        """A connection on this socket's monitor, which says when one of its connections closes.

        libzmq's monitor events for a closed connection (``ZMQ_EVENT_DISCONNECTED``) come as
        two-frame messages (``zmq.utils.monitor.parse_monitor_message``). Close it before this
        socket: its ``close`` stops the monitor, then closes the receiving socket.

        libzmq's I/O thread sends each event with a *blocking* send, holding the lock that
        stopping the monitor takes (libzmq issue 3575). It would block for ever, and with it
        every connection of that I/O thread and whoever then stops the monitor, if the
        receiving socket were closed first (the send then has no peer) or let its queue fill
        (a broker too busy to read). So the receiving socket is made here, with no receive
        high-water mark, and its ``close`` stops the monitor while it is still open.
        """
        return _MonitorConnection(self._socket)

    def _send_tracked(self, frames: Sequence[FrameT], size: int, pending: PendingBytes) -> int:
        """Send a large message counted against the pending bound (MDP-D-30), or refuse it.

        Its last frame goes without a copy and tracked: ZeroMQ lets go of a peer's messages in
        order, so once that frame is let go of, the whole message has left the broker.
        """
        if not pending.admit(size):
            return PENDING_FULL
        socket = self._socket
        last = len(frames) - 1
        try:
            for index in range(last):
                frame = frames[index]
                _send(socket, frame, _NOBLOCK_SNDMORE, len(frame) < _COPY_BELOW)
            tracked = zmq.Frame(frames[last], track=True, copy=False)
            _send(socket, tracked, _NOBLOCK, False)
        except zmq.Again:
            return EAGAIN
        except zmq.ZMQError as error:
            if error.errno == zmq.EHOSTUNREACH:
                return EHOSTUNREACH
            raise
        tracker = tracked.tracker
        assert tracker is not None
        pending.add(tracker, size)
        return SENT

    def close(self, linger: float) -> None:
        if not self._socket.closed:
            trio.lowlevel.notify_closing(self._fd)  # wake (with an error) anyone waiting on it
            self._socket.close(linger=int(linger * 1000))


class _MonitorConnection(ZmqConnection[bytes]):
    """The receiving end of a socket's monitor (``ZmqConnection.watch_closed``).

    A PAIR connected to the monitor's inproc endpoint, made by hand rather than by pyzmq's
    ``get_monitor_socket`` so that its receive high-water mark is set (to none) before it
    connects: an inproc pipe takes its bound from both ends when it is made, and a full pipe
    would block libzmq's I/O thread in its event send.
    """

    def __init__(self, watched: zmq.Socket[bytes]) -> None:
        self._watched = watched
        endpoint = f"inproc://domo-monitor-{id(watched):x}"
        watched.monitor(endpoint, zmq.EVENT_DISCONNECTED)
        try:
            receiver = watched.context.socket(zmq.PAIR)
            try:
                receiver.setsockopt(zmq.RCVHWM, 0)
                receiver.setsockopt(zmq.LINGER, 0)
                receiver.connect(endpoint)
            except BaseException:
                receiver.close(linger=0)
                raise
        except BaseException:
            watched.monitor(None, 0)
            raise
        super().__init__(receiver)

    def close(self, linger: float) -> None:
        """Stop the monitor, then close the receiving socket: in this order only (see
        ``ZmqConnection.watch_closed``). Stopping takes the lock an event send holds, which
        is now bounded: the send has a live peer and a queue with no bound."""
        if not self._socket.closed and not self._watched.closed:
            self._watched.monitor(None, 0)
        super().close(linger)


def _view(frame: zmq.Frame) -> memoryview:
    """A read-only view of a received frame, immutable like ``bytes``; ``obj`` is the frame."""
    return frame.buffer.toreadonly()


class ZmqTransport:
    """Connections over ZeroMQ; creates (and later terminates) a context unless given one.

    ``inproc://`` endpoints only reach sockets of the same context: give every party the same
    ``context`` to use them. ``curve``: a ``CurveServer`` makes every socket ``bind`` makes a
    CURVE server, a ``CurveClient`` every socket ``connect`` makes a CURVE client
    (``domo.curve``; the ZAP handler that checks client keys is the broker's to run).
    """

    term_timeout: float = 5.0  # seconds ``aclose`` waits for the context to terminate

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        *,
        curve: CurveServer | CurveClient | None = None,
        max_message_bytes: int | None = None,
        max_pending_bytes: int | None = None,
    ) -> None:
        self._owned = context is None
        # ZMQ_MAXMSGSIZE of the sockets ``bind`` makes: a peer sending a larger frame is
        # disconnected by ZeroMQ before the broker holds it (MDP-D-25). None: no limit.
        self.max_message_bytes = max_message_bytes
        # What the ROUTERs ``bind`` makes hold in their pipes, all together (MDP-D-30); None: the
        # pipes are bounded one by one only (MDP-D-27).
        self.pending = None if max_pending_bytes is None else PendingBytes(max_pending_bytes)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context() if context is None else context
        self.curve = curve

    def bind(self, endpoints: Sequence[str], hwm: int) -> tuple[Connection[BodyFrame], list[str]]:
        for endpoint in endpoints:
            check_endpoint(endpoint, bind=True)  # before libzmq takes a wrapped port
        socket = self.context.socket(zmq.ROUTER)
        try:
            # Without ROUTER_MANDATORY a ROUTER silently drops messages at the high-water mark.
            socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
            socket.setsockopt(zmq.SNDHWM, hwm)
            socket.setsockopt(zmq.RCVHWM, hwm)
            if self.max_message_bytes is not None:
                socket.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
            if isinstance(self.curve, CurveServer):
                self.curve.apply(socket)
            elif self.curve is not None:
                raise ValueError("a broker's socket needs a CurveServer, not a CurveClient")
            bound = []
            for endpoint in endpoints:
                socket.bind(endpoint)
                bound.append(socket.getsockopt_string(zmq.LAST_ENDPOINT))
        except BaseException:
            socket.close(linger=0)
            raise
        conn = ZmqConnection[BodyFrame](socket, views_from=_COPY_BELOW, pending=self.pending)
        return conn, bound

    def connect(self, endpoint: str) -> Connection[bytes]:
        check_endpoint(endpoint, bind=False)  # an out-of-range port would wait for ever
        socket = self.context.socket(zmq.DEALER)
        try:
            if isinstance(self.curve, CurveClient):
                self.curve.apply(socket)
            elif self.curve is not None:
                raise ValueError("a client's or worker's socket needs a CurveClient")
            socket.connect(endpoint)
        except BaseException:
            socket.close(linger=0)
            raise
        return ZmqConnection[bytes](socket)

    async def aclose(self) -> None:
        """Terminate the context this transport created, waiting at most ``term_timeout``.

        With every socket closed, ``term()`` waits at most their linger; it waits forever for
        a socket left open, and libzmq 4.3.5 was seen here, rarely, to block for longer with
        every socket closed. Rather than hang its owner's shutdown (this runs shielded, while
        the owner is being cancelled), after ``term_timeout`` seconds the context is abandoned
        with an error in the log; its thread ends when libzmq lets it, or with the process.
        """
        if not self._owned or self.context.closed:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(self.term_timeout) as waited:
            await trio.to_thread.run_sync(self.context.term, abandon_on_cancel=True)
        if waited.cancelled_caught:
            logger.error("ZeroMQ context not terminated after %.1f s; abandoned", self.term_timeout)
