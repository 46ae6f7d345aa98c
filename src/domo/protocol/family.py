"""``FamilyBroker``: one broker for the Majordomo family, MDP/0.2 at its core.

The MDP/0.2 ``Broker`` does the routing (services, queues, dispatch, heartbeats, expiry); this
layer lets peers of the other dialects (``domo.protocol.dialects``) reach it, with the same
sans-IO contract (``receive``, ``tick``, ``take_outgoing``, ``next_deadline``, ``peer_*``,
``shutdown``), so a runtime drives either one alike.

- An MDP/0.2 peer on the ROUTER goes straight to the core under its own routing id: nothing is
  added on its path but one comparison.
- Any other peer is known to the core by a *peer key* made from its routing id and its envelope
  (the 28/REQREP address stack), so that two clients behind one proxy are two peers (REQREP-02).
  The key is a pure function of the two (no counter, no clock): the same peer gets the same key
  in every process, and a key can never equal a routing id libzmq makes (5 bytes, ``\\x00``
  first) or one an application may set (never ``\\x00`` first).
- What the core sends to a key goes out in that peer's dialect, to its routing id, behind its
  envelope; the I/O layer's word that a routing id is unreachable or congested reaches every key
  behind it.
- A key is forgotten once the core holds nothing of it (no request, not a worker, not silenced),
  so a stream of short-lived REQ clients behind a proxy does not grow the broker.

Cross-dialect routing is the core's: a worker of any dialect serves the clients of every dialect,
and MMI answers every client (``specs/mdp-0.1.md``, ``specs/majortomo.md``, ``specs/reqrep.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .broker import Broker, BrokerConfig, PeerState, WorkerView
from .dialects import CODECS, MDPC02, MDPW02, Dialect, DialectCodec, detect, encode_with
from .events import (
    BrokerEvent,
    MmiReplied,
    RequestCompleted,
    RequestDropped,
    RequestExpired,
    WorkerDisconnected,
    WorkerExpired,
)
from .mdp import BodyFrame, Relayed

__all__ = ["FamilyBroker", "PeerRoute", "peer_key"]

_KEY_PREFIX = b"\x00\xffdomo:"
_REGISTERED = (PeerState.IDLE, PeerState.BUSY)


def peer_key(routing_id: bytes, envelope: Sequence[bytes], dialect: Dialect) -> bytes:
    """The id the core knows a non-MDP/0.2 peer by: routing id, envelope and dialect, each
    length-prefixed, so that distinct peers never share a key."""
    parts = [routing_id, *envelope, dialect.value.encode()]
    return _KEY_PREFIX + b"".join(len(p).to_bytes(4, "big") + bytes(p) for p in parts)


class PeerRoute:
    """Where and how to send what the core sends to one peer key."""

    __slots__ = ("codec", "dialect", "envelope", "routing_id")

    def __init__(self, routing_id: bytes, envelope: Relayed, dialect: Dialect) -> None:
        self.routing_id = routing_id
        self.envelope = envelope
        self.dialect = dialect
        self.codec: DialectCodec = CODECS[dialect]  # the registry's record, looked up once


class FamilyBroker:
    """An MDP/0.2 ``Broker`` that also serves MDP/0.1, majortomo's dialect and REQ clients."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.core = Broker(config)
        self.config = self.core.config
        self._routes: dict[bytes, PeerRoute] = {}  # peer key -> route
        self._keys_of: dict[bytes, dict[bytes, None]] = {}  # routing id -> its peer keys
        self._maybe_done: dict[bytes, None] = {}  # keys to forget once their messages are out

    # -- the sans-IO contract, as Broker's ------------------------------------------------------

    def receive(self, peer: bytes, frames: Sequence[BodyFrame], now: float) -> list[BrokerEvent]:
        """Handle one message from routing id ``peer``, in whatever dialect it speaks."""
        first = frames[0] if frames else None
        found = None if first in (MDPC02, MDPW02) else detect(frames)  # hot path first
        if found is None or found[0] is Dialect.MDP02:
            events = self.core.receive(peer, frames, now)  # garbage too: the core says why
            if self._routes:  # a worker's FINAL may end a dialect client's request
                self._note(events)
            return events
        dialect, hops = found
        envelope = tuple(bytes(frame) for frame in frames[:hops])
        key = peer_key(peer, envelope, dialect)
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = PeerRoute(peer, envelope, dialect)
            self._keys_of.setdefault(peer, {})[key] = None
            self._maybe_done[key] = None  # a first message that was refused leaves nothing
        events = self.core.receive(key, route.codec.decode(frames[hops + 1 :]), now)
        self._note(events)
        return events

    def tick(self, now: float) -> list[BrokerEvent]:
        events = self.core.tick(now)
        self._note(events)
        return events

    def next_deadline(self) -> float | None:
        return self.core.next_deadline()

    def take_outgoing(self) -> list[tuple[bytes, Relayed]]:
        """The core's outbox, each message to a routing id in its peer's dialect."""
        outbox = self.core.take_outgoing()
        if self._routes:
            outbox = self._translate(outbox)
        if self._maybe_done:
            self._forget_idle_keys()
        return outbox

    def peer_unreachable(self, peer: bytes, now: float) -> list[BrokerEvent]:
        """Routing id ``peer`` is gone: so is every peer behind it (REQREP-02)."""
        events = self.core.peer_unreachable(peer, now)
        for key in list(self._keys_of.get(peer, ())):
            events += self.core.peer_unreachable(key, now)
        self._note(events)
        return events

    def peer_congested(self, peer: bytes, now: float) -> list[BrokerEvent]:
        """Routing id ``peer``'s pipe is full: every peer behind it is congested."""
        events = self.core.peer_congested(peer, now)
        for key in list(self._keys_of.get(peer, ())):
            events += self.core.peer_congested(key, now)
        self._note(events)
        return events

    def shutdown(self, now: float) -> list[BrokerEvent]:
        return self.core.shutdown(now)

    # -- views ------------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.core.now

    def workers(self) -> dict[bytes, WorkerView]:
        return self.core.workers()

    def route(self, key: bytes) -> PeerRoute | None:
        """How a peer key is reached, or None for an MDP/0.2 peer (its key is its routing id)."""
        return self._routes.get(key)

    def keys(self) -> int:
        """How many non-MDP/0.2 peers the broker knows now (bounded: see the module docstring)."""
        return len(self._routes)

    # -- inside -----------------------------------------------------------------------------------

    def _translate(self, outbox: list[tuple[bytes, Relayed]]) -> list[tuple[bytes, Relayed]]:
        routes = self._routes
        out: list[tuple[bytes, Relayed]] = []
        for key, frames in outbox:
            route = routes.get(key)
            if route is None:
                out.append((key, frames))
                continue
            encoded = encode_with(route.codec, route.envelope, frames)
            if encoded is not None:
                out.append((route.routing_id, encoded))
        return out

    def _note(self, events: list[BrokerEvent]) -> None:
        """Remember the keys whose request or worker just ended: maybe the core forgot them."""
        if not self._routes:
            return
        for event in events:
            if isinstance(event, RequestCompleted | RequestExpired | RequestDropped | MmiReplied):
                peer = event.client
            elif isinstance(event, WorkerExpired | WorkerDisconnected):
                peer = event.worker
            else:
                continue
            if peer in self._routes:
                self._maybe_done[peer] = None

    def _forget_idle_keys(self) -> None:
        for key in self._maybe_done:
            # A silenced key is forgotten too: the core sends nothing to it, and if it speaks
            # again its routing id and envelope give it the same key.
            if self.core.holds(key) or self.core.worker_state(key) in _REGISTERED:
                continue
            route = self._routes.pop(key, None)
            if route is not None:
                keys = self._keys_of[route.routing_id]
                del keys[key]
                if not keys:
                    del self._keys_of[route.routing_id]
        self._maybe_done.clear()
