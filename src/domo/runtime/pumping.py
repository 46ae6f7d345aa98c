"""The broker's flush and the event log, shared by every runtime.

``flush_router`` sends a broker's outbox through any connection whose ``send`` answers ``SENT``,
``EAGAIN`` (the peer's pipe is full) or ``EHOSTUNREACH`` (no such peer) without blocking, and
reports each failing peer to the broker once per flush (MDP-D-15). It serves a broker on one
socket (connection 0). A broker on several sockets, one pump per socket, flushes through a
``RoutedOutbox``: each pump sends only on its own socket, and what the broker sends to a peer on
another connection waits there for that connection's pump, which is woken. ``log_event`` (from
``domo.eventlog``) logs a core event as one readable line at a level that fits its kind.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from domo.eventlog import log_event
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame, Relayed

__all__ = [
    "EAGAIN",
    "EHOSTUNREACH",
    "SENT",
    "RoutedOutbox",
    "Sender",
    "flush_router",
    "log_event",
]

SENT: Final = 0
EAGAIN: Final = errno.EAGAIN  # the peer's pipe is full (high-water mark)
EHOSTUNREACH: Final = errno.EHOSTUNREACH  # a ROUTER has no peer with that identity


class Sender(Protocol):
    """A ROUTER that sends one message (peer identity first) without blocking."""

    def send(self, frames: Sequence[BodyFrame], /) -> int: ...


def flush_router(
    broker: FamilyBroker,
    conn: Sender,
    now: float,
    emit: Callable[[Iterable[BrokerEvent]], None],
) -> None:
    """Send the broker's outbox on its one socket; report each peer that cannot take a message,
    once per flush. A broker driven through one socket only hears of connection 0, so every
    message is for it."""
    failed: set[bytes] = set()
    while outbox := broker.take_outgoing():
        for _, peer, frames in outbox:
            if peer in failed:
                continue  # the broker was told; the rest of its messages are stale
            result = conn.send((peer, *frames))
            if result == SENT:
                continue
            failed.add(peer)
            emit(_report(broker, result, peer, now, 0))


def _report(
    broker: FamilyBroker, result: int, peer: bytes, now: float, connection: int
) -> list[BrokerEvent]:
    if result == EAGAIN:
        return broker.peer_congested(peer, now, connection)
    assert result == EHOSTUNREACH
    return broker.peer_unreachable(peer, now, connection)


class RoutedOutbox:
    """A broker's outbox routed by connection, for a broker on several sockets.

    Each socket (connection ``0 .. connections - 1``) is owned by one pump: only that pump sends
    on it. ``flush(connection, ...)`` first sends what other pumps left for ``connection``, in
    the order the broker produced it, then the broker's outbox: what is for ``connection`` is
    sent, what is for another connection is queued for it and ``wake(other)`` is called once per
    flush, so that connection's pump comes and flushes. Nothing is dropped but the stale
    messages to a peer the broker has just been told cannot take them (MDP-D-15).
    """

    def __init__(self, broker: FamilyBroker, connections: int, wake: Callable[[int], None]) -> None:
        self._broker = broker
        self._queued: list[deque[tuple[bytes, Relayed]]] = [deque() for _ in range(connections)]
        self._wake = wake

    def queued(self, connection: int) -> int:
        """How many messages wait for ``connection``'s pump."""
        return len(self._queued[connection])

    def flush(
        self,
        connection: int,
        conn: Sender,
        now: float,
        emit: Callable[[Iterable[BrokerEvent]], None],
    ) -> None:
        """Send on ``conn`` (connection ``connection``'s socket) what is for it; see the class."""
        broker, queued = self._broker, self._queued
        mine = queued[connection]
        failed: set[bytes] = set()
        others: set[int] = set()
        while True:
            while mine:
                peer, frames = mine.popleft()
                if peer in failed:
                    continue
                result = conn.send((peer, *frames))
                if result != SENT:
                    failed.add(peer)
                    emit(_report(broker, result, peer, now, connection))
            outbox = broker.take_outgoing()
            if not outbox:
                break
            for to, peer, frames in outbox:
                if to != connection:
                    queued[to].append((peer, frames))
                    others.add(to)
                    continue
                if peer in failed:
                    continue  # the broker was told; the rest of its messages are stale
                result = conn.send((peer, *frames))
                if result != SENT:
                    failed.add(peer)
                    emit(_report(broker, result, peer, now, connection))
        for other in sorted(others):
            self._wake(other)

    def flush_all(
        self,
        conns: Sequence[Sender],
        now: float,
        emit: Callable[[Iterable[BrokerEvent]], None],
    ) -> None:
        """Flush every connection, for a caller that owns every socket (at shutdown, once the
        pumps have stopped), until nothing is left for any of them."""
        while True:
            for connection, conn in enumerate(conns):
                self.flush(connection, conn, now, emit)
            if not any(self._queued):  # each flush empties the broker's outbox
                return
