"""The broker's flush and the event log, shared by every runtime.

``flush_router`` sends a broker's outbox through any connection whose ``send`` answers ``SENT``,
``EAGAIN`` (the peer's pipe is full), ``PENDING_FULL`` (the pipes of all peers hold all they may,
MDP-D-30) or ``EHOSTUNREACH`` (no such peer) without blocking,
reports each failing peer to the broker with the message it did not get (MDP-D-15), and then
tells the broker the flush is done, which completes the requests whose FINAL was sent
(MDP-D-24). It serves a broker on one socket (connection 0). A broker on several sockets, one
pump per socket, flushes through a ``RoutedOutbox``: each pump sends only on its own socket, and
what the broker sends to a peer on another connection waits there for that connection's pump,
which is woken; the broker hears ``flushed`` once nothing waits for any pump. Where every socket
lives on one thread (Trio), any pump may send on any socket, so a ``RoutedOutbox`` given the
sockets sends at once what is for another one, and wakes that socket's pump only if the send left
a message there to read (a send may take the edge its pump sleeps on). ``log_event``
(from ``domo.eventlog``) logs a core event as one readable line at a level that fits its kind.
"""

from __future__ import annotations

import dataclasses
import errno
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from domo.eventlog import log_event
from domo.protocol.events import BrokerEvent, RequestDropped, WorkerDisconnected
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame, Relayed

from .pending import PENDING_FULL

__all__ = [
    "EAGAIN",
    "EHOSTUNREACH",
    "SENT",
    "RoutedOutbox",
    "Sender",
    "SharedSender",
    "flush_router",
    "log_event",
]

SENT: Final = 0
EAGAIN: Final = errno.EAGAIN  # the peer's pipe is full (high-water mark)
EHOSTUNREACH: Final = errno.EHOSTUNREACH  # a ROUTER has no peer with that identity


class Sender(Protocol):
    """A ROUTER that sends one message (peer identity first) without blocking."""

    def send(self, frames: Sequence[BodyFrame], /) -> int: ...


class SharedSender(Sender, Protocol):
    """A socket that any task of its thread may send on; ``readable`` says whether a message
    waits to be read (re-reading the state a send may have taken from the socket's pump)."""

    def readable(self) -> bool: ...


def flush_router(
    broker: FamilyBroker,
    conn: Sender,
    now: float,
    emit: Callable[[Iterable[BrokerEvent]], None],
) -> None:
    """Send the broker's outbox on its one socket; report each peer that cannot take a
    message; then ``flushed``. A broker driven through one socket only hears of connection 0.

    A peer is reported once per outbox, with the index of the first message it did not get
    (``unsent``); its later messages in that outbox are not tried (they would overtake the one
    that failed). The broker then knows which request each message that was not sent belonged
    to, and completes only those whose FINAL went out (MDP-D-24).
    """
    while outbox := broker.take_outgoing():
        failed: set[bytes] = set()
        for index, (_, peer, frames) in enumerate(outbox):
            if peer in failed:
                continue  # the broker was told: everything from ``unsent`` on is not sent
            result = conn.send((peer, *frames))
            if result == SENT:
                continue
            failed.add(peer)
            emit(_report(broker, result, peer, now, 0, index))
    emit(broker.flushed())


def _report(
    broker: FamilyBroker,
    result: int,
    peer: bytes,
    now: float,
    connection: int,
    unsent: int | None,
) -> list[BrokerEvent]:
    if result == EAGAIN:
        return broker.peer_congested(peer, now, connection, unsent=unsent)
    if result == PENDING_FULL:
        # The broker's outbound pipes hold all they may (MDP-D-30): for the core, the same as
        # this peer's pipe being full (MDP-D-15); the events name the rule that decided it.
        events = broker.peer_congested(peer, now, connection, unsent=unsent)
        return [_as_pending_full(event) for event in events]
    assert result == EHOSTUNREACH
    return broker.peer_unreachable(peer, now, connection, unsent=unsent)


def _as_pending_full(event: BrokerEvent) -> BrokerEvent:
    """A request dropped or a worker unregistered at a full pipe, renamed for MDP-D-30."""
    if isinstance(event, RequestDropped) and event.reason == "client-congested":
        return dataclasses.replace(event, reason="pending-full", rule="MDP-D-30")
    if isinstance(event, WorkerDisconnected) and event.reason == "congested":
        return dataclasses.replace(event, reason="pending-full")
    return event


class RoutedOutbox:
    """A broker's outbox routed by connection, for a broker on several sockets.

    Each socket (connection ``0 .. connections - 1``) is owned by one pump: only that pump sends
    on it. ``flush(connection, ...)`` first sends what other pumps left for ``connection``, in
    the order the broker produced it, then the broker's outbox: what is for ``connection`` is
    sent, what is for another connection is queued for it and ``wake(other)`` is called once per
    flush, so that connection's pump comes and flushes. Nothing is dropped but the stale
    messages to a peer the broker has just been told cannot take them (MDP-D-15).

    With ``shared`` (every socket, for pumps that all run on one thread), nothing waits: what is
    for another connection is sent at once on its socket, and its pump is woken only if a
    message now waits to be read there. A request that crosses sockets then no longer waits for
    the other pump's turn, twice per round trip: under a flood on one socket, its pump's turns
    come seldom (issue 27, fairness across transports).

    A failure is reported with the message's index in the broker's outbox while that outbox is
    the last taken; a message that waited for its pump is reported without one (the broker then
    takes every reply to that peer not yet confirmed as not sent). ``flushed`` is called once no
    message waits for any pump, so a FINAL counts as delivered only once it was sent (MDP-D-24).
    """

    def __init__(
        self,
        broker: FamilyBroker,
        connections: int,
        wake: Callable[[int], None],
        shared: Sequence[SharedSender] | None = None,
    ) -> None:
        assert shared is None or len(shared) == connections
        self._broker = broker
        self._queued: list[deque[tuple[bytes, Relayed]]] = [deque() for _ in range(connections)]
        self._wake = wake
        self._shared = shared

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
        broker, queued, shared = self._broker, self._queued, self._shared
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
                    emit(_report(broker, result, peer, now, connection, None))
            outbox = broker.take_outgoing()
            if not outbox:
                break
            failed = set()  # a peer is reported once per outbox, as flush_router does
            failed_there: set[tuple[int, bytes]] = set()  # (connection, peer), as ``failed``
            for index, (to, peer, frames) in enumerate(outbox):
                if to != connection:
                    others.add(to)
                    if shared is None:
                        queued[to].append((peer, frames))
                    elif (to, peer) not in failed_there:
                        result = shared[to].send((peer, *frames))
                        if result != SENT:
                            failed_there.add((to, peer))
                            emit(_report(broker, result, peer, now, to, index))
                    continue
                if peer in failed:
                    continue  # the broker was told; the rest of its messages are stale
                result = conn.send((peer, *frames))
                if result != SENT:
                    failed.add(peer)
                    emit(_report(broker, result, peer, now, connection, index))
        if not any(queued):
            emit(broker.flushed())
        for other in sorted(others):
            if shared is None or shared[other].readable():
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
