"""The broker's flush and the event log, shared by every runtime.

``flush_router`` sends a broker's outbox through any connection whose ``send`` answers ``SENT``,
``EAGAIN`` (the peer's pipe is full) or ``EHOSTUNREACH`` (no such peer) without blocking,
reports each failing peer to the broker with the message it did not get (MDP-D-15), and then
tells the broker the flush is done, which completes the requests whose FINAL was sent
(MDP-D-24). ``log_event`` (from ``domo.eventlog``) logs a core event as one readable line at a
level that fits its kind.
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
    """Send the broker's outbox; report each peer that cannot take a message; then ``flushed``.

    A peer is reported once per outbox, with the index of the first message it did not get
    (``unsent``); its later messages in that outbox are not tried (they would overtake the one
    that failed). The broker then knows which request each message that was not sent belonged
    to, and completes only those whose FINAL went out (MDP-D-24).
    """
    while outbox := broker.take_outgoing():
        failed: set[bytes] = set()
        for index, (peer, frames) in enumerate(outbox):
            if peer in failed:
                continue  # the broker was told: everything from ``unsent`` on is not sent
            result = conn.send((peer, *frames))
            if result == SENT:
                continue
            failed.add(peer)
            if result == EAGAIN:
                emit(broker.peer_congested(peer, now, unsent=index))
            else:
                assert result == EHOSTUNREACH
                emit(broker.peer_unreachable(peer, now, unsent=index))
    emit(broker.flushed())
