"""Pumps: the one task per socket that moves frames between a connection and a sans-IO machine.

A pump sleeps in one place, ``Connection.wait``, bounded by the machine's ``next_deadline()``
(through one cancel scope per deadline, not one per wait); when it wakes it reads the time with
``trio.current_time()`` (so a ``MockClock`` applies), feeds the ready messages to the machine,
ticks it and flushes its outbox without blocking (the broker's pump repeats this while messages
keep coming, flushing after every ``SLICE`` messages so that a reply never waits behind a
flood, up to ``BATCH`` of them per checkpoint).

Other tasks call a session through ``SessionPump.call``. While the pump sleeps on the socket
with nothing of its own to send, the caller sends what the call queued itself, then reads the
socket's EVENTS: a send can take the wake-up of a message that has just arrived (ZeroMQ's FD is
edge-triggered), so if a message is waiting the pump is woken (``kick``). Otherwise the pump is
woken to send it. Only one task runs at a time, so the socket is never used by two at once.

``RouterPump`` drives one of the broker's ROUTERs (``pump_router`` the only one): a peer whose
pipe is full (EAGAIN) or gone (EHOSTUNREACH) is reported to the broker, which decides what that
means; the pump never waits for a ROUTER to become writable (POLLOUT on a ROUTER means "some pipe
has room", not this peer's). A broker on several sockets has one pump per socket, each the sole
user of its socket; what the broker sends to another socket's peer waits in a ``RoutedOutbox``
for that socket's pump, which is woken.

``SessionPump`` drives a ``WorkerSession`` over a DEALER, one socket at a
time: on ``ReconnectRequired`` it sends what the session left in its outbox, closes the socket,
waits until ``reconnect_at`` and opens a new one. A DEALER has one pipe, so there EAGAIN means
"wait for room": the message is kept and the pump waits for POLLIN|POLLOUT, receiving meanwhile.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import trio

from domo.protocol.events import BrokerEvent, ReconnectRequired
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame
from domo.runtime.liveness import receive_waiting
from domo.runtime.pumping import RoutedOutbox, flush_router, log_event

from ._transport import SENT, Connection

__all__ = ["BATCH", "RouterPump", "SessionPump", "flush_router", "log_event", "pump_router"]

BATCH = 256  # messages handled per wake-up: one checkpoint per batch, and a flood can't hog us
SLICE = 4  # messages handled between two flushes: replies never wait behind a flood (fairness)
# Seconds a pump may run between two checkpoints when the broker has several sockets: another
# socket's pump (or an NNG socket's context tasks) runs only at this pump's checkpoints, and a
# request that crosses sockets needs several such turns; 256 messages of a flood per turn cut a
# memo01 client on another socket to 0.04-0.08 of its throughput (issue 27). The time is read
# after every SLICE anyway, so the turn costs nothing to keep.
SHARED_TURN = 0.0001

E = TypeVar("E")


async def pump_router(
    broker: FamilyBroker,
    conn: Connection[BodyFrame],
    emit: Callable[[Iterable[BrokerEvent]], None],
) -> None:
    """Run ``broker`` on one bound ROUTER until cancelled (the caller shuts down and closes)."""
    await RouterPump(broker, conn, emit).run()


class RouterPump:
    """Runs a broker on one of its ROUTERs, connection ``connection``; the sole user of ``conn``.

    With several sockets (``outbox`` given), the pumps share the broker and a ``RoutedOutbox``:
    each flushes through it, and ``wake`` is how another pump tells this one that messages wait
    for its socket (it ends the wait early; an early tick is harmless).
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


class Session(Protocol[E]):
    """What ``SessionPump`` needs of a ``WorkerSession``."""

    @property
    def now(self) -> float: ...
    @property
    def broker_expires_at(self) -> float | None: ...
    def connected(self, now: float) -> list[E]: ...
    def receive(self, frames: Sequence[bytes], now: float) -> list[E]: ...
    def tick(self, now: float) -> list[E]: ...
    def next_deadline(self) -> float | None: ...
    def take_outgoing(self) -> list[tuple[bytes, ...]]: ...


class SessionPump(Generic[E]):
    """Drives one session over one DEALER at a time; see the module docstring.

    ``on_event`` gets every event; the pump itself acts on ``ReconnectRequired``.
    ``farewell`` ends the session when the pump is cancelled (``disconnect`` or ``close``); the
    last socket then gets ``linger`` seconds to deliver what it says. ``on_heard``, if given, is
    called when the first message arrives on each new socket (the peer answers at last).
    """

    def __init__(
        self,
        session: Session[E],
        open_connection: Callable[[], Connection[bytes]],
        on_event: Callable[[E], None],
        farewell: Callable[[float], list[E]],
        linger: float,
        on_heard: Callable[[], None] | None = None,
    ) -> None:
        self.session = session
        self._on_heard = on_heard
        self.heard = False  # a message arrived on the current socket
        self._open = open_connection
        self._on_event = on_event
        self._farewell = farewell
        self._linger = linger
        self._conn: Connection[bytes] | None = None
        self._pending: deque[tuple[bytes, ...]] = deque()  # taken from the outbox, not yet sent
        self._reconnect_at: float | None = -math.inf  # None: keep this socket
        self._kicked = False
        self._scope: trio.CancelScope | None = None  # the pump's, while it waits on the socket
        self._drained = trio.Event()
        self.ready = trio.Event()  # set while the session has a socket, and once the pump stops

    def kick(self) -> None:
        """Wake the pump so it flushes what another task queued in the session."""
        self._kicked = True
        if self._scope is not None:
            self._scope.cancel()

    def call(self, method: Callable[..., list[E]], *args: Any) -> list[E]:
        """Call a session method with ``now`` appended, handle its events, send what it queued.

        While the pump sleeps on the socket with nothing of its own to send, the caller sends
        the session's messages itself: waking the pump costs more than the send. The pump is
        woken only if the socket holds a message it may not be told of (the send may have
        consumed the edge of ZeroMQ's FD) or the pipe is full.
        """
        events = method(*args, trio.current_time())
        self._handle(events)
        conn = self._conn
        asleep = self._scope is not None and not self._pending and self._reconnect_at is None
        # Short-circuits in order: send only to a sleeping pump's socket, and read EVENTS only
        # after a send that went through.
        if not (asleep and conn is not None and self._flush(conn) and not conn.readable()):
            self.kick()
        return events

    def catch_up(self) -> None:
        """Before another task acts on the session: if the loop was held up past the broker's
        expiry (a handler that blocked it), read what waits in the socket first, heard in time
        (``domo.runtime.liveness``). Then the session may have given its request up."""
        now = trio.current_time()
        conn = self._conn
        expires = self.session.broker_expires_at
        if self._scope is None or conn is None or expires is None or now < expires:
            return  # the pump is not asleep on the socket (it reads it itself), or in time
        messages = conn.receive(BATCH)
        for message in messages:
            self._handle(receive_waiting(self.session, message, now))
        if messages:
            self.kick()  # the edge may be gone: the pump looks at the socket again

    async def drained(self) -> None:
        """Wait until what was queued is handed to the socket, or the socket is gone."""
        if self._conn is not None and (self._pending or self._kicked):
            if self._drained.is_set():
                self._drained = trio.Event()
            await self._drained.wait()
        else:
            await trio.lowlevel.checkpoint()

    async def run(self) -> None:
        """Own the socket until cancelled; then say farewell and close it."""
        try:
            while True:
                if self._reconnect_at is not None:
                    await trio.sleep_until(self._reconnect_at)
                    self._reconnect_at = None
                    self._conn = self._open()
                    self.heard = False
                    self.ready.set()
                    self._handle(self.session.connected(trio.current_time()))
                assert self._conn is not None
                await self._pump(self._conn)
        finally:
            try:
                self._handle(self._farewell(trio.current_time()))
            finally:
                # Whatever a hook raised, the socket closes: an open one blocks its context's
                # termination forever.
                if self._conn is not None:
                    self._close()
                self.ready.set()

    async def _pump(self, conn: Connection[bytes]) -> None:
        """Serve ``conn`` until the session gives it up (it is closed then)."""
        while True:
            # One cancel scope until the session's deadline passes or a kick, not one per wait
            # (a scope costs more than the wait). Its deadline only moves earlier: a wake-up
            # before the session's deadline is harmless, one after it is not.
            with trio.CancelScope() as scope:
                while True:
                    self._step(conn)
                    if self._reconnect_at is not None:
                        self._close()
                        return
                    deadline = self.session.next_deadline()
                    if deadline is not None and deadline < scope.deadline:
                        scope.deadline = deadline
                    self._scope = scope
                    try:
                        await conn.wait(bool(self._pending))
                    finally:
                        self._scope = None

    def _step(self, conn: Connection[bytes]) -> None:
        self._kicked = False
        now = trio.current_time()
        messages = conn.receive(BATCH)
        if messages and not self.heard:
            self.heard = True
            if self._on_heard is not None:
                self._on_heard()
        session = self.session
        for message in messages:  # heard in time, even if this task woke late
            self._handle(receive_waiting(session, message, now))
        if session.now != now:  # nothing was read, or a late batch: fire what is due now
            self._handle(session.tick(now))
        self._flush(conn)

    def _handle(self, events: list[E]) -> None:
        for event in events:
            if isinstance(event, ReconnectRequired):
                self._reconnect_at = event.reconnect_at
                self.ready = trio.Event()
                self._pending.clear()  # they belonged to the socket being given up
            self._on_event(event)

    def _flush(self, conn: Connection[bytes]) -> bool:
        """Send the session's outbox; False if the pipe is full (EAGAIN): the rest waits."""
        self._pending.extend(self.session.take_outgoing())
        while self._pending:
            if conn.send(self._pending[0]) != SENT:
                return False  # keep it, wait for POLLOUT (a DEALER has a single pipe)
            self._pending.popleft()
        self._drained.set()
        return True

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        assert conn is not None
        self._pending.extend(self.session.take_outgoing())
        last_words = bool(self._pending)  # a DISCONNECT, say, that must still go out
        try:
            self._flush(conn)
        finally:
            self._pending.clear()
            self._drained.set()
            # Without last words, linger 0: stale messages of a socket given up must not reach
            # a broker that comes back while the socket lingers (it would register a dead one).
            conn.close(self._linger if last_words else 0.0)
