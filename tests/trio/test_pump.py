"""``SessionPump`` against a connection that consumes wake-ups the way ZeroMQ's FD does.

ZeroMQ wakes a socket's owner through an edge-triggered FD: a message that arrives while the
reader sleeps fires it once, and any call on the socket (a send too) may take that wake-up away.
``SessionPump.call`` sends a handler's answer itself while the pump sleeps on the socket, so it
must wake the pump when a message is waiting that the pump will not be told of. The real race
lasts microseconds; ``EdgeConnection`` makes it happen every time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import trio
import trio.testing

from domo.protocol import WorkerConfig, WorkerSession
from domo.protocol.events import ReconnectRequired, RequestReceived, WorkerEvent
from domo.trio._pump import SessionPump
from domo.trio._transport import SENT

from .conftest import Recorder

Pump = SessionPump[WorkerEvent]
REQUEST = [b"MDPW02", b"\x02", b"client", b"", b"body"]
DISCONNECT = [b"MDPW02", b"\x06"]


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


def worker_pump() -> tuple[EdgeConnection, WorkerSession, Recorder[WorkerEvent], Pump]:
    """A worker session's pump over an ``EdgeConnection``, heartbeat interval 1 s."""
    conn = EdgeConnection()
    session = WorkerSession(b"echo", WorkerConfig(heartbeat_interval=1.0))
    events: Recorder[WorkerEvent] = Recorder()
    return conn, session, events, SessionPump(session, lambda: conn, events, session.disconnect, 0)


async def hand_a_request(
    nursery: trio.Nursery, conn: EdgeConnection, pump: Pump, events: Recorder[WorkerEvent]
) -> None:
    """Start the pump, let the broker hand it a REQUEST, return once it sleeps again."""
    nursery.start_soon(pump.run)
    await trio.sleep(0.25)
    conn.deliver(REQUEST)
    await events.wait_for(RequestReceived)
    await trio.sleep(0.25)


async def test_a_message_whose_wake_up_an_answer_took_is_still_handled_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The broker's DISCONNECT arrives just before the handler's FINAL is sent from the
    handler's task, and that send takes the FD's wake-up: the pump is woken all the same and
    handles the DISCONNECT at that instant, not at its next deadline (a heartbeat, 1 s on)."""
    conn, session, events, pump = worker_pump()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await hand_a_request(nursery, conn, pump, events)
            start = trio.current_time()
            conn.deliver(DISCONNECT)
            pump.call(session.send_final, (b"done",))
            reconnect = await events.wait_for(ReconnectRequired)
            assert reconnect.at == start
            assert conn.sent[-1] == (b"MDPW02", b"\x04", b"client", b"", b"done")
            nursery.cancel_scope.cancel()


async def test_an_answer_to_a_sleeping_pump_goes_out_without_waking_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With nothing else on the socket, the FINAL is sent by the handler's task at once and the
    pump stays asleep (its wake-up costs more than the send)."""
    conn, session, events, pump = worker_pump()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await hand_a_request(nursery, conn, pump, events)
            wakeups = conn.wakeups
            pump.call(session.send_final, (b"done",))
            assert conn.sent[-1] == (b"MDPW02", b"\x04", b"client", b"", b"done")
            await trio.sleep(0.25)  # before the heartbeat is due
            assert conn.wakeups == wakeups
            nursery.cancel_scope.cancel()
