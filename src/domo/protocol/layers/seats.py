"""``Seats``: one dialect worker as several single-use registrations in the routing core.

A worker of some dialects offers several services at once, or several credits: an eMQP worker
gives a credit per READY and listens on several queues (EMQP-06); a memo01 worker serves a set
of services, one job at a time (MEMO-11). The routing core knows one service per registration,
so such a worker is, to the core, a *group* of seats: one single-use registration per service,
under a key of its own (``LayerHost.key_for``), offered in the worker's order. When the core
hands one seat of a group a request, its siblings are withdrawn (the group is one credit: one
request), and the core ends that seat with its request (``Broker.single_use``); the worker
offers a new group for its next credit. A worker that leaves or falls silent takes all its seats
back at once (``Broker.withdraw``), so its requests go back to their queues together and none
lands on a sibling of its own.

The core neither times nor heartbeats seats (their traits say so): a worker's liveness is one
clock, its layer's (EMQP-15). Sans-IO, deterministic, like the core.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..broker import PeerState, PeerTraits
from ..commands import Command, CoreCommand, Role
from ..dialects.base import DialectCodec
from ..events import BrokerEvent, RequestDispatched
from .base import LayerHost

__all__ = ["SEAT_TRAITS", "Seat", "Seats"]

# A seat's traits in the core: its worker's liveness is its layer's one clock, so the core
# neither expects nor sends heartbeats on a seat, and tells it no DISCONNECT (FAM-01..03).
SEAT_TRAITS = PeerTraits(heartbeats_expected=False, heartbeats_sent=False, disconnect=False)


@dataclass(frozen=True, slots=True)
class Seat:
    """One seat: whose it is, its group (one credit), and the service it offers."""

    owner: Hashable
    group: int
    service: bytes


class Seats:
    """The seats of a dialect's workers (see the module docstring)."""

    def __init__(
        self, host: LayerHost, codec: DialectCodec, traits: PeerTraits = SEAT_TRAITS
    ) -> None:
        self._host = host
        self._core = host.core
        self._codec = codec
        self._traits = traits
        self._seats: dict[bytes, Seat] = {}  # core key -> its seat
        # The same table, to read: whether any seat is held, without a call (``follow``).
        self.by_key: Mapping[bytes, Seat] = self._seats
        self._groups: dict[Hashable, dict[int, list[bytes]]] = {}  # owner -> group -> its keys
        self._busy: dict[Hashable, set[int]] = {}  # owner -> its groups handed a request
        self._next: dict[Hashable, int] = {}  # owner -> its next group's number

    def __bool__(self) -> bool:
        return bool(self._seats)

    def seat(self, key: bytes) -> Seat | None:
        """The seat the core knows as ``key``, if it is one."""
        return self._seats.get(key)

    def free(self, owner: Hashable) -> int:
        """How many groups of ``owner`` wait for a request."""
        return len(self._groups.get(owner, ())) - len(self._busy.get(owner, ()))

    def offer(
        self,
        owner: Hashable,
        peer: bytes,
        connection: int,
        services: Sequence[bytes],
        now: float,
        events: list[BrokerEvent],
        tag: bytes = b"",
    ) -> None:
        """A new group of ``owner`` (routing id ``peer`` on ``connection``): one seat per
        service, registered in the order given; a seat handed a request at once ends the offer
        (the group's other services are not offered)."""
        number = self._next.get(owner, 0)
        self._next[owner] = number + 1
        keys: list[bytes] = []
        self._groups.setdefault(owner, {})[number] = keys
        core, key_for = self._core, self._host.key_for
        for service in services:
            request_key = b"%s%d:%s" % (tag, number, service)
            key = key_for(peer, self._codec, connection, request_key, self._traits, once=True)
            self._seats[key] = Seat(owner, number, service)
            keys.append(key)
            got = core.command(key, CoreCommand(Role.WORKER, Command.REGISTER, service), now)
            core.single_use(key)  # its one request ends it (EMQP-07)
            events += got
            if any(isinstance(e, RequestDispatched) and e.worker == key for e in got):
                break

    def dispatched(self, key: bytes, now: float, events: list[BrokerEvent]) -> Seat | None:
        """The core handed seat ``key`` a request: its group's other seats are withdrawn (one
        request per group). A sibling handed another request in the same call gives it back,
        unsent and uncounted. None if ``key`` is no seat, or was withdrawn in the same call."""
        seat = self._seats.get(key)
        if seat is None or self._core.worker_state(key) is not PeerState.BUSY:
            return None
        keys = self._groups[seat.owner].setdefault(seat.group, [])
        siblings = [k for k in keys if k != key]
        if siblings:
            events += self._core.withdraw(siblings, now, unsent=True)
        keys[:] = [key]
        self._busy.setdefault(seat.owner, set()).add(seat.group)
        return seat

    def gone(self, key: bytes) -> Seat | None:
        """The core no longer has seat ``key`` (spent, withdrawn, expired): forgotten here."""
        seat = self._seats.pop(key, None)
        if seat is None:
            return None
        self._host.forget_later(key)  # its REQUEST, if any, is still to be encoded
        groups = self._groups.get(seat.owner, {})
        keys = groups.get(seat.group)
        if keys is not None and key in keys:
            keys.remove(key)
            if not keys:
                del groups[seat.group]
                self._busy.get(seat.owner, set()).discard(seat.group)
        return seat

    def withdraw(
        self, owner: Hashable, now: float, events: list[BrokerEvent], *, expired: bool = False
    ) -> None:
        """``owner`` leaves (or, ``expired``, fell silent by its layer's clock): all its seats
        are withdrawn at once, so its requests go back to their queues together, oldest first,
        and none goes to a sibling of its own."""
        groups = self._groups.get(owner, {})
        keys = [key for group in groups.values() for key in group]
        self.forget(owner)
        events += self._core.withdraw(keys, now, expired=expired)

    def forget(self, owner: Hashable) -> None:
        """Forget ``owner``'s bookkeeping (it left; its seats are the core's to drop). Its
        groups are numbered on from where they were until then, so no key of a seat is made
        again while the broker may still hold something of the one before."""
        self._groups.pop(owner, None)
        self._busy.pop(owner, None)
        self._next.pop(owner, None)
