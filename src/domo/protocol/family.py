"""``FamilyBroker``: one broker for the Majordomo family, MDP/0.2 at its core.

The MDP/0.2 ``Broker`` does the routing (services, queues, dispatch, heartbeats, expiry); this
layer lets peers of the other dialects (``domo.protocol.dialects``) reach it, and peers on
several sockets, with the same sans-IO contract (``receive``, ``tick``, ``take_outgoing``,
``next_deadline``, ``peer_*``, ``shutdown``) plus a *connection*: the number of the socket (or
other transport link) a message came on, 0 for the first, numbered by the runtime. A peer is
(connection, routing id); what the broker sends goes to a (connection, routing id).

- An MDP/0.2 peer on connection 0 goes straight to the core under its own routing id: nothing is
  added on its path but two comparisons.
- Any other peer is known to the core by a *peer key* made from its connection, routing id,
  envelope (the 28/REQREP address stack) and dialect, so that two clients behind one proxy are
  two peers (REQREP-02), and two sockets' peers never mix though ZeroMQ may give them the same
  routing id. The key is a pure function of these (no counter, no clock): the same peer gets the
  same key in every process, and a key can never equal a routing id libzmq makes (5 bytes,
  ``\\x00`` first) or one an application may set (never ``\\x00`` first).
- A peer's dialect is the registry's (``dialects.detect``) from its message; what the core sends
  to a key goes out in that peer's dialect (``dialects.encode_with`` and the dialect's
  ``Capabilities``), on its connection, to its routing id, behind its envelope. The I/O layer's
  word that a routing id on a connection is unreachable or congested reaches every key behind it.
- A key is forgotten once the core holds nothing of it (no request, not a worker, not silenced)
  and the flush that carried its last reply is done (``flushed``, MDP-D-24), so a stream of
  short-lived REQ clients behind a proxy does not grow the broker.

A dialect that needs state of its own (eMQP: credits, message ids, receipts) has a *bridge*
(``domo.protocol.emqp_bridge``): its messages go to the bridge, which speaks to the core in the
core's terms; what the core sends its keys is encoded by the bridge; what the core did is shown
to it (``follow``); what it sends itself goes out first.

Cross-dialect routing is the core's: a worker of any dialect serves the clients of every dialect,
and MMI answers every client (``specs/mdp-0.1.md``, ``specs/majortomo.md``, ``specs/reqrep.md``,
``specs/dcp-v1.md``, ``specs/emqp-1.0.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from .broker import Broker, BrokerConfig, PeerState, PeerTraits, WorkerView
from .dialects import (
    CODECS,
    MDPC02,
    MDPW02,
    REGISTRY,
    Capabilities,
    Dialect,
    DialectCodec,
    Registry,
    encode_with,
)
from .dialects.mdp02 import MDP02
from .emqp_bridge import EmqpBridge
from .events import (
    BrokerEvent,
    MmiReplied,
    ProtocolViolation,
    RequestCompleted,
    RequestDropped,
    RequestExpired,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from .mdp import BodyFrame, Relayed

__all__ = ["FamilyBroker", "Outgoing", "PeerRoute", "peer_key", "traits_of"]

Outgoing = tuple[int, bytes, Relayed]  # (connection, routing id, frames): one message to send

_KEY_PREFIX = b"\x00\xffdomo:"
_REGISTERED = (PeerState.IDLE, PeerState.BUSY)
_UNKNOWN = (MDP02, 0)  # not a family message: the core refuses it, as MDP/0.2's
_MDP02_HEADERS = (MDPC02, MDPW02)  # an MDP/0.2 message's first frame
_MDP02_NAME = str(Dialect.MDP02.value)


def peer_key(
    routing_id: bytes,
    envelope: Sequence[bytes],
    dialect: Enum,
    connection: int = 0,
    request_key: bytes | None = None,
) -> bytes:
    """The id the core knows a peer by, unless it is an MDP/0.2 peer on connection 0: its
    connection, routing id, envelope, dialect and (for a dialect that keys its requests) the
    request's key, each length-prefixed, so that distinct peers never share a key."""
    parts = [routing_id, *envelope, str(dialect.value).encode()]
    if request_key is not None:
        parts.append(request_key)  # one client's requests are clients of their own to the core
    prefix = _KEY_PREFIX + connection.to_bytes(4, "big")
    return prefix + b"".join(len(p).to_bytes(4, "big") + bytes(p) for p in parts)


def traits_of(capabilities: Capabilities) -> PeerTraits:
    """What the core acts on of a dialect's capabilities (``specs/family.md``)."""
    return PeerTraits(
        heartbeats_expected=capabilities.worker_heartbeats,  # FAM-02
        heartbeats_sent=capabilities.broker_heartbeats,  # FAM-01
        disconnect=capabilities.disconnect,  # FAM-03
        mmi=capabilities.mmi,  # FAM-04
    )


class PeerRoute:
    """Where and how to send what the core sends to one peer key."""

    __slots__ = (
        "client",
        "codec",
        "connection",
        "context",
        "dialect",
        "envelope",
        "request_key",
        "routing_id",
        "service",
    )

    def __init__(
        self,
        routing_id: bytes,
        envelope: Relayed,
        dialect: Enum,
        connection: int = 0,
        request_key: bytes | None = None,
        codec: DialectCodec | None = None,
        context: tuple[bytes, ...] = (),
    ) -> None:
        self.connection = connection
        self.routing_id = routing_id
        self.envelope = envelope
        self.dialect = dialect
        self.request_key = request_key  # the request this key stands for, in a keyed dialect
        # The registry's record, looked up once.
        self.codec: DialectCodec = codec if codec is not None else CODECS[Dialect(dialect.value)]
        self.context = context  # what the dialect keeps for the reply (its ``reply_context``)
        self.service: bytes | None = None  # the service it registered, while a worker
        # For a request key of a bounded dialect: the client it counts against (FAM-05).
        self.client: bytes | None = None


class FamilyBroker:
    """An MDP/0.2 ``Broker`` that also serves MDP/0.1, majortomo's dialect, REQ clients and
    DCP v1, on any number of connections."""

    def __init__(self, config: BrokerConfig | None = None, registry: Registry = REGISTRY) -> None:
        self.core = Broker(config)
        self.config = self.core.config
        self.registry = registry  # the dialects this broker speaks, in detection order
        self._routes: dict[bytes, PeerRoute] = {}  # peer key -> route
        # (connection, routing id) -> the peer keys behind it
        self._keys_of: dict[tuple[int, bytes], dict[bytes, None]] = {}
        self._maybe_done: dict[bytes, None] = {}  # keys to forget once their messages are out
        self._withheld: list[int] = []  # core outbox indexes of the last outbox not sent at all
        # Messages a dialect's ``answer`` sends, ahead of the core's next outbox.
        self._answers: list[Outgoing] = []
        # Dialects that need state of their own (eMQP: domo.protocol.emqp_bridge) get a bridge;
        # what it sends itself goes out before the core's, after the answers.
        self._bridges: dict[Enum, EmqpBridge] = {
            codec.dialect: EmqpBridge(self)
            for codec in registry.codecs
            if codec.dialect is Dialect.EMQP
        }
        self.bridged_out: list[Outgoing] = []  # what the bridges send themselves, in order
        self._answered = 0  # how many answers and bridge messages led the outbox last taken
        # A bounded keyed dialect's client -> its request keys the broker holds (FAM-05).
        self._requests_of: dict[bytes, dict[bytes, None]] = {}
        # Refusals of requests beyond a client's bound, sent after the core's outbox (FAM-05);
        # and where they began in the outbox last taken, for ``_core_index``.
        self._refusals: list[Outgoing] = []
        self._refusals_at: int | None = None
        self._core_taken = 0  # how many messages the core's outbox last taken had
        self._traits: dict[Enum, PeerTraits | None] = {}  # per dialect, None for MDP/0.2's

    # -- the sans-IO contract, as Broker's, with the connection ---------------------------------

    def receive(
        self, peer: bytes, frames: Sequence[BodyFrame], now: float, connection: int = 0
    ) -> list[BrokerEvent]:
        """Handle one message from routing id ``peer`` on ``connection``, in whatever dialect
        it speaks."""
        if connection == 0:
            # The hot path: an MDP/0.2 header needs no detection.
            mdp02 = frames and frames[0] in _MDP02_HEADERS
            found = None if mdp02 else self.registry.detect(frames)
            if found is None or found[0].dialect is Dialect.MDP02:
                events = self.core.receive(peer, frames, now)  # garbage too: the core says why
                if self._routes:  # a worker's FINAL may end a dialect client's request
                    self._note(events)
                return events
        else:
            found = self.registry.detect(frames) or _UNKNOWN
        codec, hops = found
        if self._bridges and codec.dialect in self._bridges:
            events = self._bridges[codec.dialect].receive(peer, frames[hops + 1 :], now, connection)
            self._note(events, follow=False)  # the bridge followed what it made the core do
            return events
        envelope = tuple(bytes(frame) for frame in frames[:hops])
        message: Sequence[BodyFrame] = frames[hops + 1 :] if codec.delimited else frames
        if codec.check is not None:
            wrong = codec.check(message)
            if wrong is not None:  # malformed in the dialect's own terms: dropped, named
                events = self.core.tick(now)
                events.append(ProtocolViolation(peer, wrong[0], wrong[1], "dropped", now))
                return events
        request_key = None
        if codec.request_key is not None:  # a dialect with several requests per client
            split = codec.request_key(message)
            if split is not None:
                request_key, message = split
        key = peer_key(peer, envelope, codec.dialect, connection, request_key)
        route = self._routes.get(key)
        if route is None:
            context = () if codec.reply_context is None else codec.reply_context(message)
            route = PeerRoute(
                peer, envelope, codec.dialect, connection, request_key, codec, context
            )
            bound = codec.capabilities.outstanding_per_client
            if request_key is not None and bound is not None:
                client = peer_key(peer, envelope, codec.dialect, connection)
                held = self._requests_of.get(client)
                if held is not None and len(held) >= bound:  # no route is kept for it
                    return self._refuse_beyond_bound(route, key, bound, now)
                self._requests_of.setdefault(client, {})[key] = None
                route.client = client
            self._routes[key] = route
            self._keys_of.setdefault((connection, peer), {})[key] = None
            self._maybe_done[key] = None  # a first message that was refused leaves nothing
            self.core.set_traits(key, self._traits_of(codec))
        if codec.answer is None:
            events = self._to_core(key, codec, message, now)
        else:
            before = self.core.worker_state(key)
            events = self._to_core(key, codec, message, now)
            answer = codec.answer(message, before, self.core.worker_state(key))
            if answer is not None:
                self._answers.append((connection, peer, answer))
        self._note(events)
        return events

    def tick(self, now: float) -> list[BrokerEvent]:
        events = self.core.tick(now)
        self._note(events)
        for bridge in self._bridges.values():
            bridged = bridge.tick(now)
            self._note(bridged, follow=False)
            events += bridged
        return events

    def next_deadline(self) -> float | None:
        deadline = self.core.next_deadline()
        for bridge in self._bridges.values():
            own = bridge.next_deadline()
            if own is not None and (deadline is None or own < deadline):
                deadline = own
        return deadline

    def take_outgoing(self) -> list[Outgoing]:
        """The core's outbox, each message to a (connection, routing id) in its peer's dialect."""
        outbox = self.core.take_outgoing()
        if self._withheld:
            self._withheld = []
        if self._answered:
            self._answered = 0
        if self._refusals_at is not None:  # this outbox's refusals, if any, are placed below
            self._refusals_at = None
        if self._routes or self._answers or self.bridged_out:
            self._core_taken = len(outbox)
            out = self._translate(outbox)
            if self._answers or self.bridged_out:  # they lead: DCP's answers, the bridges'
                own = self._answers + self.bridged_out
                self._answers, self.bridged_out = [], []
                self._answered = len(own)
                out = own + out
            if self._refusals:  # FAM-05: after the core's, in the order they were made
                self._refusals_at = len(out)
                out += self._refusals
                self._refusals = []
            return out
        if len(outbox) == 1:  # the request cycle's usual outbox, without a comprehension
            peer, frames = outbox[0]
            return [(0, peer, frames)]
        return [(0, peer, frames) for peer, frames in outbox]

    def flushed(self) -> list[RequestCompleted]:
        """As ``Broker.flushed``: the FINALs the runtime sent are completed (MDP-D-24)."""
        events = self.core.flushed()
        if self._routes:
            self._note(events, follow=False)  # completions: nothing for a bridge to do
        # Only after the flush: a send that failed was reported to the keys behind its routing id.
        if self._maybe_done:
            self._forget_idle_keys()
        return events

    def peer_unreachable(
        self, peer: bytes, now: float, connection: int = 0, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        """Routing id ``peer`` on ``connection`` is gone: so is every peer behind it
        (REQREP-02). ``unsent`` as for ``Broker.peer_unreachable``, an index in the outbox last
        taken from this broker."""
        at = self._core_index(unsent)
        events = self.core.peer_unreachable(peer, now, unsent=at) if connection == 0 else []
        for key in list(self._keys_of.get((connection, peer), ())):
            events += self.core.peer_unreachable(key, now, unsent=at)
        for bridge in self._bridges.values():
            bridge.peer_gone(peer, connection)
        self._note(events)
        return events

    def peer_congested(
        self, peer: bytes, now: float, connection: int = 0, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        """Routing id ``peer``'s pipe on ``connection`` is full: every peer behind it is
        congested."""
        at = self._core_index(unsent)
        events = self.core.peer_congested(peer, now, unsent=at) if connection == 0 else []
        for key in list(self._keys_of.get((connection, peer), ())):
            events += self.core.peer_congested(key, now, unsent=at)
        self._note(events)
        return events

    def _core_index(self, index: int | None) -> int | None:
        """The core's index of message ``index`` of the outbox last taken (some are withheld)."""
        if index is None:
            return None
        if self._refusals_at is not None and index >= self._refusals_at:
            return self._core_taken  # a refusal: every message of the core's was sent before it
        # A dialect's answers and the bridges' messages lead the outbox: if one of them failed,
        # so did every later message to that peer, the core's first included.
        index = max(0, index - self._answered)
        for withheld in self._withheld:  # ascending
            if withheld <= index:
                index += 1
        return index

    def shutdown(self, now: float) -> list[BrokerEvent]:
        events = self.core.shutdown(now)
        for bridge in self._bridges.values():
            bridge.shutdown()
        return events

    # -- views ------------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.core.now

    def workers(self) -> dict[bytes, WorkerView]:
        return self.core.workers()

    def only_serves(self, peer: bytes, connection: int = 0) -> bool:
        """Whether routing id ``peer`` on ``connection`` is a registered worker (any dialect)
        that holds nothing as a client (MDP-A-02): every message to it is then a worker's."""
        core = self.core
        keys = list(self._keys_of.get((connection, peer), ()))
        if connection == 0:
            keys.append(peer)
        serving = False
        for key in keys:
            if core.holds(key):
                return False
            serving = serving or core.worker_state(key) in _REGISTERED
        return serving

    def route(self, key: bytes) -> PeerRoute | None:
        """How a peer key is reached, or None for an MDP/0.2 peer on connection 0 (its key is
        its routing id)."""
        return self._routes.get(key)

    def address(self, key: bytes) -> tuple[int, bytes]:
        """The (connection, routing id) of the peer the core knows as ``key``."""
        route = self._routes.get(key)
        return (0, key) if route is None else (route.connection, route.routing_id)

    def dialect_of(self, key: bytes) -> str:
        """The name of the dialect the peer the core knows as ``key`` speaks (``"mdp02"``,
        ``"mdp01"``, ...): what a trace record says of a request's client."""
        route = self._routes.get(key)
        return _MDP02_NAME if route is None else str(route.dialect.value)

    def keys(self) -> int:
        """How many peers the broker knows by a key now (bounded: see the module docstring)."""
        return len(self._routes)

    # -- for bridges (domo.protocol.emqp_bridge) ----------------------------------------------

    def key_for(
        self,
        peer: bytes,
        codec: DialectCodec,
        connection: int,
        request_key: bytes | None,
        traits: PeerTraits | None = None,
    ) -> bytes:
        """The peer key of (``connection``, ``peer``) speaking ``codec`` with no envelope, for
        ``request_key``; its route is made if it is new, and forgotten as any key's. ``traits``:
        the key's in the core (None: MDP/0.2's)."""
        key = peer_key(peer, (), codec.dialect, connection, request_key)
        if key not in self._routes:
            self._routes[key] = PeerRoute(peer, (), codec.dialect, connection, request_key, codec)
            self._keys_of.setdefault((connection, peer), {})[key] = None
            self._maybe_done[key] = None
            self.core.set_traits(key, traits)
        return key

    def forget_later(self, key: bytes) -> None:
        """Forget ``key`` after the next flush if the core then holds nothing of it."""
        if key in self._routes:
            self._maybe_done[key] = None

    # -- inside -----------------------------------------------------------------------------------

    def _to_core(
        self, key: bytes, codec: DialectCodec, message: Sequence[BodyFrame], now: float
    ) -> list[BrokerEvent]:
        """Hand a dialect peer's message to the core: as frames, or as the neutral command a
        dialect with ``decode_command`` makes of it."""
        if codec.decode_command is None:
            return self.core.receive(key, codec.decode(message), now)
        command = codec.decode_command(message)
        if command is None:
            return self.core.receive(key, (), now)  # none of its commands: garbage
        return self.core.command(key, command, now)

    def _traits_of(self, codec: DialectCodec) -> PeerTraits | None:
        """The core's traits for a peer of ``codec``'s dialect, worked out once per dialect."""
        if codec.dialect not in self._traits:
            self._traits[codec.dialect] = traits_of(codec.capabilities)
        return self._traits[codec.dialect]

    def _refuse_beyond_bound(
        self, route: PeerRoute, key: bytes, bound: int, now: float
    ) -> list[BrokerEvent]:
        """A request beyond its client's bound: the dialect's answer, if any, and a violation
        (FAM-05). The core does not see it, and nothing is kept of it, so the same key asked
        again is counted again; the core's timers still come first (MDP-D-03)."""
        events = self.core.tick(now)
        assert route.request_key is not None
        answer = (
            None
            if route.codec.refuse is None
            else route.codec.refuse(route.envelope, route.request_key)
        )
        if answer is not None:
            self._refusals.append((route.connection, route.routing_id, answer))
        reason = f"a request beyond the {bound} its client may have outstanding"
        events.append(ProtocolViolation(key, "FAM-05", reason, "dropped", now))
        self._note(events)
        return events

    def _translate(self, outbox: list[tuple[bytes, Relayed]]) -> list[Outgoing]:
        routes = self._routes
        out: list[Outgoing] = []
        for index, (key, frames) in enumerate(outbox):
            route = routes.get(key)
            if route is None:
                out.append((0, key, frames))
                continue
            bridge = self._bridges.get(route.dialect) if self._bridges else None
            encode_route = route.codec.encode_route
            if bridge is not None:
                encoded = bridge.encode(key, route, frames)
            elif encode_route is None:
                encoded = encode_with(route.codec, route.envelope, frames, route.request_key)
            else:
                encoded = encode_route(route, frames, routes.get)
            if encoded is not None:
                out.append((route.connection, route.routing_id, encoded))
            else:
                self._withheld.append(index)
        return out

    def _note(self, events: Sequence[BrokerEvent], follow: bool = True) -> None:
        """Remember the keys whose request or worker just ended: maybe the core forgot them.
        Bridges see what the core did first (``follow``), and add what that makes it do."""
        if not self._routes:
            return
        if follow and self._bridges:
            assert isinstance(events, list)  # a bridge appends what it makes the core do
            for bridge in self._bridges.values():
                bridge.follow(events)
        for event in events:
            if isinstance(event, RequestCompleted | RequestExpired | RequestDropped | MmiReplied):
                peer = event.client
            elif isinstance(event, WorkerExpired | WorkerDisconnected):
                peer = event.worker
            elif isinstance(event, WorkerRegistered):
                route = self._routes.get(event.worker)
                if route is not None:
                    route.service = event.service  # a dialect may name it in each request
                continue
            else:
                continue
            if peer in self._routes:
                self._maybe_done[peer] = None

    def _forget_idle_keys(self) -> None:
        for key in self._maybe_done:
            # A silenced key is forgotten too: the core sends nothing to it, and if it speaks
            # again its address and envelope give it the same key.
            if self.core.holds(key) or self.core.worker_state(key) in _REGISTERED:
                continue
            route = self._routes.pop(key, None)
            if route is not None:
                self.core.set_traits(key, None)
                if route.client is not None:  # FAM-05: no longer counted against its client
                    held = self._requests_of[route.client]
                    del held[key]
                    if not held:
                        del self._requests_of[route.client]
                address = (route.connection, route.routing_id)
                keys = self._keys_of[address]
                del keys[key]
                if not keys:
                    del self._keys_of[address]
        self._maybe_done.clear()
