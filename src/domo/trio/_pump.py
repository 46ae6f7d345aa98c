"""The broker's pumps: the one task per ROUTER that moves frames between it and the core.

A pump sleeps in one place, ``Connection.wait``, bounded by the broker's ``next_deadline()``
(through one cancel scope per deadline, not one per wait); when it wakes it reads the time with
``trio.current_time()`` (so a ``MockClock`` applies), feeds the ready messages to the broker,
ticks it and flushes its outbox without blocking, and repeats this while messages keep coming,
flushing after every ``SLICE`` messages so that a reply never waits behind a flood, up to
``BATCH`` of them per checkpoint. (A worker's session has its own task, in ``worker.py``; a
client's request drives its session itself, in ``client.py``.)

``RouterPump`` drives one of the broker's ROUTERs (``pump_router`` the only one): a peer whose
pipe is full (EAGAIN) or gone (EHOSTUNREACH) is reported to the broker, which decides what that
means; the pump never waits for a ROUTER to become writable (POLLOUT on a ROUTER means "some pipe
has room", not this peer's). A broker on several sockets has one pump per socket, each the only
reader of its socket; what the broker sends to another socket's peer is sent there at once
through a ``RoutedOutbox`` given every socket (one thread: no two tasks use a socket at once),
which wakes that socket's pump if the send took the wake-up of a message waiting there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import trio

from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame
from domo.runtime.pumping import RoutedOutbox, flush_router, log_event

from ._transport import Connection

__all__ = ["BATCH", "RouterPump", "flush_router", "log_event", "pump_router"]

BATCH = 256  # messages handled per wake-up: one checkpoint per batch, and a flood can't hog us
SLICE = 4  # messages handled between two flushes: replies never wait behind a flood (fairness)
# Seconds a pump may run between two checkpoints when the broker has several sockets: another
# socket's pump (or the NNG completions Trio runs) runs only at this pump's checkpoints, and a
# request that crosses sockets needs several such turns; 256 messages of a flood per turn cut a
# memo01 client on another socket to 0.04-0.08 of its throughput (issue 27). The time is read
# after every SLICE anyway, so the turn costs nothing to keep.
SHARED_TURN = 0.0001


async def pump_router(
    broker: FamilyBroker,
    conn: Connection[BodyFrame],
    emit: Callable[[Iterable[BrokerEvent]], None],
) -> None:
    """Run ``broker`` on one bound ROUTER until cancelled (the caller shuts down and closes)."""
    await RouterPump(broker, conn, emit).run()


class RouterPump:
    """Runs a broker on one of its ROUTERs, connection ``connection``; the only reader of ``conn``.

    With several sockets (``outbox`` given), the pumps share the broker and a ``RoutedOutbox``:
    each flushes through it, and ``wake`` is how another pump tells this one that its socket
    needs it (a message to read whose wake-up a send took, or messages queued for its socket);
    it ends the wait early, and an early tick is harmless.
    """

    def __init__(
        self,
        broker: FamilyBroker,
        conn: Connection[BodyFrame],
        emit: Callable[[Iterable[BrokerEvent]], None],
        connection: int = 0,
        outbox: RoutedOutbox | None = None,
    ) -> None:
        self.broker = broker
        self.conn = conn
        self.connection = connection
        self._emit = emit
        self._outbox = outbox
        self._scope: trio.CancelScope | None = None
        self.turn = math.inf if outbox is None else SHARED_TURN

    def wake(self) -> None:
        """Make the pump flush soon: messages for its socket were queued by another pump."""
        if self._scope is not None:
            self._scope.cancel()

    def flush(self, now: float) -> None:
        """Send what the broker has for this socket (the caller must be this socket's user)."""
        if self._outbox is None:
            flush_router(self.broker, self.conn, now, self._emit)
        else:
            self._outbox.flush(self.connection, self.conn, now, self._emit)

    async def run(self) -> None:
        """Serve the socket until cancelled."""
        broker, conn, emit, connection = self.broker, self.conn, self._emit, self.connection
        receive = broker.receive
        while True:
            # One cancel scope until the broker's deadline passes (or a wake), not one per
            # wake-up: entering and leaving a scope costs more than the wake-up itself. The
            # scope's deadline only moves earlier; a later one is set when this one has fired
            # (an early tick is harmless, a late one is not: ``next_deadline`` may be early,
            # never late).
            with trio.CancelScope() as scope:
                self._scope = scope
                while True:
                    deadline = broker.next_deadline()
                    if deadline is not None and deadline < scope.deadline:
                        scope.deadline = deadline
                    await conn.wait(False)
                    # Drain: up to BATCH messages per checkpoint, SLICE between two flushes,
                    # re-reading the socket after each flush, since replies to what was just
                    # sent (or other peers' messages) are often there by then; a wake-up is far
                    # dearer than a message. An empty read means the socket is empty: back to
                    # ``wait``, which re-arms the edge-triggered FD before sleeping.
                    budget = BATCH
                    turn_ends = trio.current_time() + self.turn
                    while True:
                        now = trio.current_time()
                        messages = conn.receive(min(budget, SLICE))
                        for message in messages:
                            peer = message[0]
                            assert isinstance(peer, bytes)  # a routing id: 255 bytes at most
                            emit(receive(peer, message[1:], now, connection))
                        if not messages:  # a receive fires what is due at ``now`` first
                            emit(broker.tick(now))
                        self.flush(now)
                        budget -= len(messages)
                        if not messages or budget <= 0 or now >= turn_ends:
                            break
            self._scope = None
            now = trio.current_time()  # the deadline passed (or a wake): fire what is due
            emit(broker.tick(now))
            self.flush(now)
