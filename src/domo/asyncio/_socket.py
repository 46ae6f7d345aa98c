"""One pyzmq socket driven on asyncio's event loop, the edge-triggered way.

Why not ``zmq.asyncio``: awaiting its ``recv_multipart`` under ``asyncio.timeout`` can lose the
message that completes the future as the timeout cancels the task (the first version of this
runtime stalled that way: a REQUEST taken from the socket and never handed to the session), and
its ``poll`` builds a ``Poller`` per call. So this is the pattern of ``domo.trio``'s transport,
on asyncio: a plain socket, non-blocking sends and receives, and one place to sleep (``wait``),
which reads ``EVENTS`` and, if nothing is ready, waits for ``ZMQ_FD`` (``loop.add_reader``),
with nothing touching the socket in between (the FD is edge-triggered: any call on the socket may
consume its edge). A task that sends while another waits calls ``send``, which wakes the waiter if
a message arrived meanwhile. It needs a loop with ``add_reader`` (not Windows' Proactor loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

import zmq
import zmq.backend

from domo.protocol.mdp import BodyFrame
from domo.runtime import EAGAIN, EHOSTUNREACH, SENT

__all__ = ["AsyncConnection"]

_send: Any = zmq.backend.Socket.send
_recv: Any = zmq.backend.Socket.recv
_get: Any = zmq.backend.Socket.get
_NOBLOCK: Final = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_POLLOUT: Final = int(zmq.POLLOUT)
_COPY_BELOW: Final = zmq.COPY_THRESHOLD


class AsyncConnection:
    """A ROUTER or DEALER made from ``context``; used by the tasks of one event loop."""

    def __init__(self, context: zmq.Context[Any], kind: int) -> None:
        self.socket: zmq.Socket[bytes] = zmq.Socket(context, kind)
        self._fd: int = self.socket.getsockopt(zmq.FD)  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._interrupted = False  # ``interrupt`` was called: the next ``wait`` returns at once
        # Registered once, not per wait (that is two epoll_ctl calls a wait).
        self._loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        """The FD fired: wake the waiter; with none, read EVENTS so the FD quiets down.

        asyncio's epoll is level-triggered and ZMQ_FD stays readable until EVENTS is read;
        reading it here is harmless, since ``wait`` reads EVENTS again before it sleeps.
        """
        waiter = self._waiter
        if waiter is not None:
            _wake(waiter)
        elif not self.socket.closed:
            _get(self.socket, _EVENTS)

    async def wait(self, deadline: float | None, writable: bool = False) -> bool:
        """Until a message is ready (or, if ``writable``, room to send) or ``deadline``.

        True if the socket is ready (or was closed, or ``interrupt`` called, meanwhile); False at
        the deadline. Cancellation-safe: it takes nothing from the socket.
        """
        mask = _POLLIN | _POLLOUT if writable else _POLLIN
        socket = self.socket
        loop = self._loop
        while not socket.closed and not _get(socket, _EVENTS) & mask:
            if self._interrupted:
                break
            # EVENTS was just read, which re-arms the edge: wait for the FD with no call on
            # the socket in between.
            waiter = self._waiter = loop.create_future()
            try:
                if deadline is None:
                    await waiter
                else:
                    async with asyncio.timeout_at(deadline):
                        await waiter
            except TimeoutError:
                return False
            finally:
                self._waiter = None
        self._interrupted = False
        return True

    def receive(self, limit: int) -> list[list[bytes]]:
        """Up to ``limit`` messages that are ready now, without blocking."""
        messages: list[list[bytes]] = []
        socket = self.socket
        for _ in range(limit):
            if not _get(socket, _EVENTS) & _POLLIN:
                break
            frame: zmq.Frame = _recv(socket, _NOBLOCK, False)
            frames = [frame.bytes]
            while frame.more:
                frame = _recv(socket, _NOBLOCK, False)
                frames.append(frame.bytes)
            messages.append(frames)
        return messages

    def send(self, frames: Sequence[BodyFrame]) -> int:
        """Send one message without blocking: ``SENT``, ``EAGAIN`` or ``EHOSTUNREACH``.

        If another task waits on this socket and the send took the wake-up of a message that
        has just arrived, that task is woken.
        """
        socket = self.socket
        try:
            last = len(frames) - 1
            for index, frame in enumerate(frames):
                flags = _NOBLOCK_SNDMORE if index < last else _NOBLOCK
                if len(frame) < _COPY_BELOW:
                    _send(socket, frame, flags)
                else:
                    _send(socket, frame, flags, False)
        except zmq.Again:
            return EAGAIN
        except zmq.ZMQError as error:
            if error.errno == zmq.EHOSTUNREACH:
                return EHOSTUNREACH
            raise
        finally:
            waiter = self._waiter
            if waiter is not None and _get(socket, _EVENTS) & _POLLIN:
                _wake(waiter)
        return SENT

    def wake(self) -> None:
        """Wake the task waiting on this socket (it has something new to do)."""
        waiter = self._waiter
        if waiter is not None:
            _wake(waiter)

    def interrupt(self) -> None:
        """Make the task waiting on this socket (or the next to wait) return from ``wait``:
        it has work that is not on the socket (a broker's messages queued for it)."""
        self._interrupted = True
        self.wake()

    def close(self, linger: float) -> None:
        # The socket first: waking a waiter can fail (its loop closed, when an abandoned task
        # is finalized), and an open socket would block its context's termination for ever.
        if not self.socket.closed:
            self._loop.remove_reader(self._fd)
            self.socket.close(linger=int(linger * 1000))
        waiter = self._waiter
        if waiter is not None:
            _wake(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    # A waiter of a closed loop belongs to a task that will never run again (it is being
    # finalized): there is nobody to wake, and set_result would raise.
    if not waiter.done() and not waiter.get_loop().is_closed():
        waiter.set_result(None)
