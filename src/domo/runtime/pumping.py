"""The broker's flush and the event log, shared by every runtime.

``flush_router`` sends a broker's outbox through any connection whose ``send`` answers ``SENT``,
``EAGAIN`` (the peer's pipe is full) or ``EHOSTUNREACH`` (no such peer) without blocking, and
reports each failing peer to the broker once per flush (MDP-D-15). ``log_event`` (from
``domo.eventlog``) logs a core event as one readable line at a level that fits its kind.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from domo.eventlog import log_event
from domo.protocol import Broker
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame

__all__ = ["EAGAIN", "EHOSTUNREACH", "SENT", "Sender", "flush_router", "log_event"]

SENT: Final = 0
EAGAIN: Final = errno.EAGAIN  # the peer's pipe is full (high-water mark)
EHOSTUNREACH: Final = errno.EHOSTUNREACH  # a ROUTER has no peer with that identity


class Sender(Protocol):
    """A ROUTER that sends one message (peer identity first) without blocking."""

    def send(self, frames: Sequence[BodyFrame], /) -> int: ...


def flush_router(
    broker: Broker | FamilyBroker,
    conn: Sender,
    now: float,
    emit: Callable[[Iterable[BrokerEvent]], None],
) -> None:
    """Send the broker's outbox; report each peer that cannot take a message, once per flush."""
    failed: set[bytes] = set()
    while outbox := broker.take_outgoing():
        for peer, frames in outbox:
            if peer in failed:
                continue  # the broker was told; the rest of its messages are stale
            result = conn.send((peer, *frames))
            if result == SENT:
                continue
            failed.add(peer)
            if result == EAGAIN:
                emit(broker.peer_congested(peer, now))
            else:
                assert result == EHOSTUNREACH
                emit(broker.peer_unreachable(peer, now))
