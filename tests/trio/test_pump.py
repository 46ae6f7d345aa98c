"""A worker session's tasks against a connection that consumes wake-ups the way ZeroMQ's FD does.

ZeroMQ wakes a socket's owner through an edge-triggered FD: a message that arrives while the
reader sleeps fires it once, and any call on the socket (a send too) may take that wake-up away.
A worker session's task runs the handler itself and sends the FINAL, then waits on the socket
again; its timer task reads the socket while a handler awaits. ``EdgeConnection`` makes the
race of a message arriving around a send happen every time, so the tests see that no message
waits for a deadline, that a request costs one wake-up, and that heartbeats go on both ways
while a handler works.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import trio
import trio.testing

from domo.protocol import WorkerConfig, WorkerSession
from domo.protocol.events import (
    ReconnectRequired,
    RequestAbandoned,
    RequestReceived,
    WorkerEvent,
)
from domo.trio._transport import SENT
from domo.trio.worker import _Serving

from .conftest import Recorder

REQUEST = [b"MDPW02", b"\x02", b"client", b"", b"body"]
DISCONNECT = [b"MDPW02", b"\x06"]
HEARTBEAT = [b"MDPW02", b"\x05"]
FINAL = (b"MDPW02", b"\x04", b"client", b"", b"done")


class EdgeConnection:
    """A DEALER's ``Connection`` with ZeroMQ's wake-up rules (see the module docstring)."""

    def __init__(self) -> None:
        self.arrived: deque[list[bytes]] = deque()  # its wake-up not yet taken by a call
        self.ready: deque[list[bytes]] = deque()  # seen by a call on the socket
        self.sent: list[tuple[bytes, ...]] = []
        self.wakeups = 0  # times ``wait`` returned: the pump woke up
        self.closed = False
        self._wakeup = trio.Event()
        self._reader_asleep = True

    def deliver(self, frames: list[bytes]) -> None:
        """A message arrives; it fires the FD only if the reader found nothing last time."""
        self.arrived.append(frames)
        if self._reader_asleep:
            self._reader_asleep = False
            self._wakeup.set()

    def _call(self) -> bool:
        """What every call on the socket does first: take the wake-up, see what arrived."""
        self.ready.extend(self.arrived)
        self.arrived.clear()
        self._wakeup = trio.Event()
        if not self.ready:
            self._reader_asleep = True
        return bool(self.ready)

    async def wait(self, writable: bool) -> None:
        if not (writable or self._call()):
            while True:
                wakeup = self._wakeup
                await wakeup.wait()
                if self.closed:
                    raise trio.ClosedResourceError("closed")
                # A wake-up another call took before the sleeper ran was never there for epoll.
                if wakeup is self._wakeup and self._call():
                    break
        else:
            await trio.lowlevel.checkpoint()
        self.wakeups += 1

    def receive(self, limit: int) -> list[list[bytes]]:
        self._call()
        return [self.ready.popleft() for _ in range(min(limit, len(self.ready)))]

    def readable(self) -> bool:
        return self._call()

    def send(self, frames: Sequence[bytes]) -> int:
        self._call()
        self.sent.append(tuple(frames))
        return SENT

    def close(self, linger: float) -> None:
        self.closed = True
        self._wakeup.set()


class Handler:
    """An async handler that waits until the test lets it answer ``done``."""

    def __init__(self) -> None:
        self.go = trio.Event()
        self.started = trio.Event()

    async def __call__(self, body: list[bytes]) -> bytes:
        self.started.set()
        await self.go.wait()
        return b"done"


def worker(handler: Handler) -> tuple[EdgeConnection, _Serving, Recorder[WorkerEvent]]:
    """A worker session's tasks over an ``EdgeConnection``, heartbeat interval 1 s."""
    conn = EdgeConnection()
    session = WorkerSession(b"echo", WorkerConfig(heartbeat_interval=1.0))
    events: Recorder[WorkerEvent] = Recorder()
    serving = _Serving(session, lambda: conn, handler, events, 0.0, None)
    return conn, serving, events


async def start(nursery: trio.Nursery, serving: _Serving) -> None:
    nursery.start_soon(serving.run)
    nursery.start_soon(serving.time)
    await trio.sleep(0.25)


async def test_a_message_that_comes_as_the_final_goes_out_is_handled_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The broker's DISCONNECT arrives just before the handler's FINAL is sent, and that send
    takes the FD's wake-up: the worker handles the DISCONNECT at that instant all the same, not
    at its next deadline (a heartbeat, 1 s on)."""
    handler = Handler()
    conn, serving, events = worker(handler)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await start(nursery, serving)
            conn.deliver(REQUEST)
            await handler.started.wait()
            start_at = trio.current_time()
            conn.deliver(DISCONNECT)
            handler.go.set()
            reconnect = await events.wait_for(ReconnectRequired)
            assert reconnect.at == start_at
            assert FINAL in conn.sent
            nursery.cancel_scope.cancel()


async def test_a_request_costs_one_wake_up(autojump_clock: trio.testing.MockClock) -> None:
    """A handler that does not wait answers in the task that read the REQUEST: one wake-up of
    the socket's task per request, and the FINAL goes out before any heartbeat is due."""

    async def echo(body: list[bytes]) -> list[bytes]:
        return body

    conn = EdgeConnection()
    session = WorkerSession(b"echo", WorkerConfig(heartbeat_interval=1.0))
    events: Recorder[WorkerEvent] = Recorder()
    serving = _Serving(session, lambda: conn, echo, events, 0.0, None)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await start(nursery, serving)
            for number in range(1, 4):
                wakeups = conn.wakeups
                conn.deliver(REQUEST)
                await trio.sleep(0.01)
                assert conn.wakeups == wakeups + 1
                assert conn.sent[-1] == (b"MDPW02", b"\x04", b"client", b"", b"body")
                assert [e.number for e in events.of_type(RequestReceived)][-1] == number
            nursery.cancel_scope.cancel()


async def test_heartbeats_go_on_both_ways_while_the_handler_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-H-04: a handler that waits 5 intervals: the timer sends a HEARTBEAT each interval
    and reads the broker's, so the session keeps its broker; then the FINAL goes out."""
    handler = Handler()
    conn, serving, events = worker(handler)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await start(nursery, serving)
            conn.deliver(REQUEST)
            await handler.started.wait()
            sent_before = len(conn.sent)
            for _ in range(5):
                await trio.sleep(1.0)
                conn.deliver(HEARTBEAT)
            beats = [m for m in conn.sent[sent_before:] if m == tuple(HEARTBEAT)]
            assert len(beats) >= 4
            assert not events.of_type(ReconnectRequired)
            handler.go.set()
            await trio.sleep(0.01)
            assert conn.sent[-1] == FINAL
            nursery.cancel_scope.cancel()


async def test_a_disconnect_while_the_handler_waits_ends_the_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A DISCONNECT that comes while the handler waits is read by the timer at the session's
    next deadline: the request is abandoned, the handler cancelled, no FINAL sent."""
    handler = Handler()
    conn, serving, events = worker(handler)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await start(nursery, serving)
            conn.deliver(REQUEST)
            await handler.started.wait()
            conn.deliver(DISCONNECT)
            (abandoned,) = [await events.wait_for(RequestAbandoned)]
            assert abandoned.reason == "broker-disconnect"
            await events.wait_for(ReconnectRequired)
            await trio.sleep(0.01)
            assert FINAL not in conn.sent
            assert not handler.go.is_set()
            nursery.cancel_scope.cancel()
