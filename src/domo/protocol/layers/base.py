"""What a stateful dialect's layer is, and what the family broker gives it (``LayerHost``).

A dialect that a pure codec cannot serve (one that keeps state per peer: eMQP's credits and
message ids, memo01's held NNG requests) has a *layer*: a sans-IO object, made once per broker
from the dialect's entry in ``domo.protocol.layers.LAYERS``, that takes the dialect's messages
instead of its codec's ``decode`` and encodes what the core sends its keys instead of its
codec's ``encode``. It speaks to the routing core in the core's own neutral terms
(``Broker.command``, ``Broker.withdraw``, ``Broker.single_use``), so queueing, dispatch, expiry
and re-dispatch stay the core's, one implementation for every dialect. ``FamilyBroker`` never
names a dialect: it asks the registry which dialect a message is, and the layers which dialect
they serve.

Like the core, a layer is driven by calls: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..broker import Broker, PeerTraits
from ..commands import CoreCommand
from ..dialects.base import DialectCodec, RouteView
from ..events import BrokerEvent
from ..mdp import BodyFrame, Relayed

__all__ = ["Layer", "LayerFactory", "LayerHost"]


class LayerHost(Protocol):
    """What a layer may ask of the broker it serves (``FamilyBroker``)."""

    @property
    def core(self) -> Broker: ...

    def key_for(
        self,
        peer: bytes,
        codec: DialectCodec,
        connection: int,
        request_key: bytes | None,
        traits: PeerTraits | None = None,
        once: bool = False,
    ) -> bytes:
        """The peer key of (``connection``, ``peer``) for ``request_key``, its route made (and
        the layer its encoder) if new, forgotten once the core holds nothing of it; kept idle
        for the peer's next request meanwhile unless ``once`` (a key never asked for again)."""
        ...

    def forget_later(self, key: bytes) -> None:
        """Forget ``key`` after the next flush if the core then holds nothing of it."""
        ...

    def count_request(
        self, key: bytes, service: bytes, size: int, now: float
    ) -> list[BrokerEvent] | None:
        """Count a client's request key against ``max_client_requests`` (FAM-07): None if it
        may go to the core, else the events of its refusal."""
        ...

    def send(self, connection: int, peer: bytes, frames: Relayed) -> None:
        """Send ``frames`` to ``peer`` on ``connection``, ahead of the core's next outbox."""
        ...


class Layer(Protocol):
    """A stateful dialect's layer; every method is the broker's, at the same moment."""

    def receive(
        self, peer: bytes, message: Sequence[BodyFrame], now: float, connection: int
    ) -> list[BrokerEvent]:
        """One message of the dialect (the frames after the envelope's delimiter)."""
        ...

    def encode(self, key: bytes, route: RouteView, command: CoreCommand) -> Relayed | None:
        """What the core sends a key the layer made, in the dialect, or None to send nothing."""
        ...

    def follow(self, events: list[BrokerEvent]) -> None:
        """What the core did (appending what that makes it do); from the layer's first
        message on (before it, the layer has no peer for the core to act on)."""
        ...

    def tick(self, now: float) -> list[BrokerEvent]:
        """The layer's own timers (its peers' liveness, its heartbeats)."""
        ...

    def next_deadline(self) -> float | None:
        """When ``tick`` is next due (possibly early), or None."""
        ...

    def peer_gone(self, peer: bytes, connection: int) -> None:
        """The I/O layer lost ``peer`` on ``connection`` (the core dropped its keys)."""
        ...

    def shutdown(self, now: float) -> list[BrokerEvent]:
        """The broker stops (MDP-W-14): say goodbye to the dialect's peers."""
        ...


LayerFactory = Callable[[LayerHost], Layer]
"""What ``LAYERS`` holds per dialect: made once per broker, given the broker."""
