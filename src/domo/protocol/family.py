"""``FamilyBroker``: one broker for the Majordomo family, on one neutral routing core.

The routing core (``Broker``: services, queues, dispatch, heartbeats, expiry) takes neutral
commands (``Broker.command``) and sends neutral commands to every peer it knows by a key; this
is the public broker that puts the dialects (``domo.protocol.dialects``, and the layers of the
stateful ones, ``domo.protocol.layers``) and several sockets around it, with the core's sans-IO
contract (``receive``, ``tick``, ``take_outgoing``, ``next_deadline``, ``flushed``, ``peer_*``,
``shutdown``, the views) plus a *connection*: the number of the socket (or other transport
link) a message came on, 0 for the first, numbered by the runtime. A peer is (connection,
routing id); what the broker sends goes to a (connection, routing id). It names no dialect: a
message's dialect is the registry's, and a layer serves the dialects ``layers`` names.

- An MDP/0.2 peer on connection 0 goes straight to the core under its own routing id, whose
  own fast path reads and writes its frames: nothing is added on its path but two comparisons.
- Any other peer is known to the core by a *peer key* made from its connection, routing id,
  envelope (the 28/REQREP address stack) and dialect, so that two clients behind one proxy are
  two peers (REQREP-02), and two sockets' peers never mix though ZeroMQ may give them the same
  routing id. The key is a pure function of these (no counter, no clock): the same peer gets the
  same key in every process, and a key can never equal a routing id libzmq makes (5 bytes,
  ``\\x00`` first) or one an application may set (never ``\\x00`` first).
- A peer's dialect is the registry's (``Registry.detect``) from its message, which its codec
  decodes into a neutral command for the core; what the core sends to a key (a neutral
  command) goes out in that peer's dialect (its codec's ``encode``, or its layer's), on its
  connection, to its routing id, behind its envelope, and a PARTIAL never to a client whose
  dialect has none (``dialects.withheld``). The I/O layer's word that a routing id on a
  connection is unreachable or congested reaches every key behind it.
- A key is forgotten once the core holds nothing of it (no request, not a worker, not silenced)
  and the flush that carried its last reply is done (``flushed``, MDP-D-24), so a stream of
  short-lived REQ clients behind a proxy does not grow the broker.

A dialect that needs state of its own (eMQP: credits, message ids, receipts) has a *layer*
(``domo.protocol.layers``): its messages go to the layer, which speaks to the core in the
core's neutral terms; what the core sends its keys is encoded by the layer; what the core did
is shown to it (``follow``); what it sends itself goes out first.

Cross-dialect routing is the core's: a worker of any dialect serves the clients of every dialect,
and MMI answers every client (``specs/mdp-0.1.md``, ``specs/majortomo.md``, ``specs/reqrep.md``,
``specs/dcp-v1.md``, ``specs/emqp-1.0.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from enum import Enum

from .broker import Broker, BrokerConfig, Outbound, PeerState, PeerTraits, WorkerView
from .commands import Command, CoreCommand, Role
from .dialects import (
    CODECS,
    MDPC02,
    MDPW02,
    REGISTRY,
    Capabilities,
    Dialect,
    DialectCodec,
    Invalid,
    Reading,
    Registry,
    withheld,
)
from .dialects.mdp02 import MDP02
from .events import (
    BrokerEvent,
    MmiReplied,
    ProtocolViolation,
    RequestCompleted,
    RequestDropped,
    RequestExpired,
    RequestRefused,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from .layers import LAYERS, Layer, LayerFactory
from .mdp import BodyFrame, Relayed

__all__ = [
    "FamilyBroker",
    "Outgoing",
    "PeerRoute",
    "peer_key",
    "request_key_of",
    "split_peer_key",
    "traits_of",
]

Outgoing = tuple[int, bytes, Relayed]  # (connection, routing id, frames): one message to send

_KEY_PREFIX = b"\x00\xffdomo:"
_REGISTERED = (PeerState.IDLE, PeerState.BUSY)
_UNKNOWN = (MDP02, 0, Role.WORKER)  # not a family message: refused as MDP/0.2's garbage
_MDP02_HEADERS = (MDPC02, MDPW02)  # an MDP/0.2 message's first frame
_CLIENT, _PARTIAL = Role.CLIENT, Command.PARTIAL
# Routes of peers that hold nothing now, kept for their next request (REQREP-06): a REQ client
# asks again and again, under the same key; beyond this many, the oldest is forgotten.
IDLE_KEYS = 4096
_KEY_CACHE = 8192  # (connection, routing id, envelope, dialect) -> key, cleared when full
# What ``_note`` looks for: events that end a client's request, or a worker, or register one.
_ENDED, _GONE, _REGISTERS = 1, 2, 3
_NOTED: dict[type[BrokerEvent], int] = {
    RequestCompleted: _ENDED,
    RequestExpired: _ENDED,
    RequestDropped: _ENDED,
    MmiReplied: _ENDED,
    WorkerExpired: _GONE,
    WorkerDisconnected: _GONE,
    WorkerRegistered: _REGISTERS,
}
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
    name = _NAMES.get(dialect)  # length-prefixed
    if name is None:
        named = str(dialect.value).encode()
        name = _NAMES[dialect] = len(named).to_bytes(4, "big") + named
    framed = [_KEY_PREFIX, connection.to_bytes(4, "big"), len(routing_id).to_bytes(4, "big")]
    framed.append(routing_id)
    for part in envelope:
        framed += (len(part).to_bytes(4, "big"), part)
    framed.append(name)
    key = b"".join(framed)
    if request_key is not None:  # one client's requests are clients of their own to the core
        key = request_key_of(key, request_key)
    return key


_NAMES: dict[Enum, bytes] = {}  # a dialect's name as a peer key has it, length-prefixed


def _address(connection: int, peer: bytes) -> bytes | tuple[int, bytes]:
    """A routing id on a connection, as ``FamilyBroker._keys_of`` holds it: the routing id
    alone on connection 0 (a bytes never equals a tuple)."""
    return peer if connection == 0 else (connection, peer)


def _numbered(serial: int) -> tuple[bytes, bytes]:
    """The request key of a client's request number ``serial`` (FAM-08), and what it adds to
    its client's peer key (``request_key_of``)."""
    request_key = b"#%d" % serial
    return request_key, len(request_key).to_bytes(4, "big") + request_key


_NUMBERED_MADE = 64  # the first numbers' keys, made once
_NUMBERED = [_numbered(serial) for serial in range(_NUMBERED_MADE)]


def request_key_of(client: bytes, request_key: bytes) -> bytes:
    """The peer key of request ``request_key`` of the client whose own key is ``client``."""
    return client + len(request_key).to_bytes(4, "big") + request_key


def _service_and_size(codec: DialectCodec, message: Sequence[BodyFrame]) -> tuple[bytes, int]:
    """The service and body bytes of a client's request of ``codec``'s dialect, for a
    refusal's event (FAM-07)."""
    decoded = codec.decode(message)
    if isinstance(decoded, Invalid):
        return b"", 0
    return decoded.service, sum(len(frame) for frame in decoded.body)


def split_peer_key(key: bytes) -> tuple[int, list[bytes]] | None:
    """What ``peer_key`` put in ``key``: its connection and its parts (routing id, envelope...,
    dialect, request key if any); None for an MDP/0.2 peer's plain routing id. For logs."""
    start = len(_KEY_PREFIX) + 4
    if not key.startswith(_KEY_PREFIX) or len(key) < start:
        return None
    connection = int.from_bytes(key[len(_KEY_PREFIX) : start], "big")
    parts, at = [], start
    while at < len(key):
        size = int.from_bytes(key[at : at + 4], "big")
        if at + 4 + size > len(key):
            return None
        parts.append(key[at + 4 : at + 4 + size])
        at += 4 + size
    return connection, parts


def traits_of(capabilities: Capabilities) -> PeerTraits:
    """What the core acts on of a dialect's capabilities (``specs/family.md``)."""
    return PeerTraits(
        neutral=True,  # FAM-10: the core sends it neutral commands, its codec encodes them
        heartbeats_expected=capabilities.worker_heartbeats,  # FAM-02
        heartbeats_sent=capabilities.broker_heartbeats,  # FAM-01
        disconnect=capabilities.disconnect,  # FAM-03
        mmi=capabilities.mmi,  # FAM-04
        busy_heartbeats=capabilities.busy_heartbeats,  # FAM-09
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
        "layer",
        "once",
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
        # For a client's request key: the client it counts against (FAM-05, FAM-07).
        self.client: bytes | None = None
        self.layer: Layer | None = None  # the stateful dialect's layer that encodes for it
        # The key names one request or seat alone (a memo01 job's, an eMQP MSGID's or slot's):
        # forgotten when it is over, not kept idle for a next request that cannot come
        # (REQREP-06's idle keys are for peers).
        self.once = False


class FamilyBroker:
    """The family's broker: every dialect of ``registry`` (MDP/0.2, MDP/0.1, majortomo's, REQ
    clients behind proxies, DCP v1, eMQP/1.0 by default), and the stateful ones through their
    ``layers``, on one routing core, on any number of connections.

    >>> broker = FamilyBroker(BrokerConfig(heartbeat_interval=1.0))
    >>> _ = broker.receive(b"W", [b"MDPW02", b"\\x01", b"echo"], now=0.0)
    >>> _ = broker.receive(b"C", [b"", b"MDPC01", b"echo", b"hi"], now=0.1)  # RFC 7's client
    >>> ((connection, peer, frames),) = broker.take_outgoing()
    >>> connection, peer, frames[:2]
    (0, b'W', (b'MDPW02', b'\\x02'))
    """

    def __init__(
        self,
        config: BrokerConfig | None = None,
        registry: Registry = REGISTRY,
        layers: Mapping[Enum, LayerFactory] = LAYERS,
    ) -> None:
        self.core = Broker(config)
        self.config = self.core.config
        self.registry = registry  # the dialects this broker speaks, in detection order
        self._routes: dict[bytes, PeerRoute] = {}  # peer key -> route
        # The peer keys behind each (connection, routing id), by ``_address``: one key as itself,
        # several in a dict (made per peer and kept, so no record the collector must follow).
        self._keys_of: dict[bytes | tuple[int, bytes], bytes | dict[bytes, None]] = {}
        self._maybe_done: dict[bytes, None] = {}  # keys to forget once their messages are out
        self._idle: dict[
            bytes, None
        ] = {}  # routes kept for their peers' next request, oldest first
        self._key_cache: dict[tuple[int, bytes, tuple[bytes, ...], Enum], bytes] = {}
        # The same for a peer with no envelope on connection 0, the usual: routing id -> key,
        # per dialect (bytes alone: no tuple kept per peer for the collector to follow).
        self._plain_keys: dict[Enum, dict[bytes, bytes]] = {
            codec.dialect: {} for codec in registry.codecs
        }
        self._live = 0  # routes not kept idle: len(_routes) - len(_idle), counted as they change
        self._withheld: list[int] = []  # core outbox indexes of the last outbox not sent at all
        # Messages a dialect's ``answer`` sends, ahead of the core's next outbox.
        self._answers: list[Outgoing] = []
        # Dialects that need state of their own (eMQP: domo.protocol.layers) get a layer, made
        # here for each of the registry's dialects that ``layers`` names; what a layer sends
        # itself goes out before the core's, after the answers.
        self._layers: dict[Enum, Layer] = {}
        self._sent_by_layers: list[Outgoing] = []  # what the layers send themselves, in order
        for codec in registry.codecs:
            factory = layers.get(codec.dialect)
            if factory is not None:
                self._layers[codec.dialect] = factory(self)
        # The layers that have had a message, in the order of ``_layers``: only they can have
        # peers, so only they follow what the core does (``_note``).
        self._following: dict[Enum, Layer] = {}
        self._answered = 0  # how many answers and layer messages led the outbox last taken
        self._placed = False  # _withheld, _answered or _refusals_at say something
        # A keyed dialect's client -> how many request keys the broker holds (FAM-05, FAM-07), and
        # the number of its last request, for a dialect whose requests name none (FAM-08).
        self._requests_of: dict[bytes, int] = {}
        self._serials: dict[bytes, int] = {}
        self._client_limit = self.config.max_client_requests
        # Refusals of requests beyond a client's bound, sent after the core's outbox (FAM-05);
        # and where they began in the outbox last taken, for ``_core_index``.
        self._refusals: list[Outgoing] = []
        self._refusals_at: int | None = None
        self._core_taken = 0  # how many messages the core's outbox last taken had
        self._traits: dict[Enum, PeerTraits] = {}  # per dialect

    # -- the sans-IO contract, as Broker's, with the connection ---------------------------------

    def receive(
        self, peer: bytes, frames: Sequence[BodyFrame], now: float, connection: int = 0
    ) -> list[BrokerEvent]:
        """Handle one message from routing id ``peer`` on ``connection``, in whatever dialect
        it speaks."""
        if connection == 0:
            # The hot path: an MDP/0.2 peer's frames go to the core as they are.
            if frames and frames[0] in _MDP02_HEADERS:
                events = self.core.receive(peer, frames, now)
                # A worker's FINAL may end a dialect client's request; idle routes hold none.
                if events and self._live:
                    self._note(events)
                return events
            found = self.registry.find(frames)
            if found is None:
                return self.core.receive(peer, frames, now)  # garbage: the core says why
        else:
            found = self.registry.find(frames) or _UNKNOWN
        codec, hops, role = found
        if self._layers and codec.dialect in self._layers:
            if codec.dialect not in self._following:
                self._follow_from_now(codec.dialect)  # its first message
            events = self._layers[codec.dialect].receive(peer, frames[hops + 1 :], now, connection)
            self._note(events, follow=False)  # the layer followed what it made the core do
            return events
        envelope = tuple(bytes(frame) for frame in frames[:hops]) if hops else ()
        message: Sequence[BodyFrame] = frames[hops + 1 :] if codec.delimited else frames
        decoded: CoreCommand | Invalid | None
        request_key: bytes | None  # the request key it names, if any
        context: tuple[bytes, ...] | None  # what the reply carries back; None: not read yet
        if codec.read is not None:  # the codec reads the message once (DialectCodec.read)
            reading = codec.read(message)
            if reading.__class__ is not Reading:  # malformed in its own terms: dropped, named
                return self._malformed(peer, reading, now)  # type: ignore[arg-type]
            # One unpacking: a named tuple's fields, read one by one, are each a slow lookup.
            decoded, request_key, context = reading
        else:
            decoded = request_key = context = None
            if codec.check is not None:
                wrong = codec.check(message)
                if wrong is not None:  # malformed in the dialect's own terms: dropped, named
                    return self._malformed(peer, wrong, now)
            if codec.request_key is not None:  # a dialect with several requests per client
                split = codec.request_key(message)
                if split is not None:
                    request_key, message = split
        if hops or connection:
            own = self._key_cache.get((connection, peer, envelope, codec.dialect))
            if own is None:
                own = self._key_of(peer, envelope, codec.dialect, connection)
        else:
            plain = self._plain_keys[codec.dialect]
            own = plain.get(peer)
            if own is None:
                if len(plain) >= _KEY_CACHE:
                    plain.clear()
                own = plain[peer] = peer_key(peer, (), codec.dialect)
        client = None
        key = own
        if request_key is not None:
            if not request_key:  # a request that names none: numbered per client (FAM-08)
                serial = self._serials.get(own, 0) + 1
                self._serials[own] = serial
                request_key, suffix = (
                    _NUMBERED[serial] if serial < _NUMBERED_MADE else _numbered(serial)
                )
                key = own + suffix  # request_key_of
            else:
                key = own + len(request_key).to_bytes(4, "big") + request_key  # request_key_of
            if role is _CLIENT:  # a client's request counts against it; a worker's not
                client = own
        route = self._routes.get(key)
        if route is None or key in self._idle:
            parked = route is not None
            if route is None:
                if context is None:
                    context = () if codec.reply_context is None else codec.reply_context(message)
                route = PeerRoute(
                    peer, envelope, codec.dialect, connection, request_key, codec, context
                )
            else:
                del self._idle[key]
            if client is not None:  # FAM-05, FAM-07: counted against its client
                if client not in self._requests_of:  # its first: within every bound
                    self._requests_of[client] = 1
                    route.client = client
                else:
                    refused = self._count(route, key, client, now, message)
                    if refused is not None:  # nothing more is kept of it
                        if parked:
                            self._idle[key] = None
                        return refused
            if not parked:
                self._routes[key] = route
                if connection or peer in self._keys_of:
                    self._keep_behind(connection, peer, key)
                else:  # as ``_keep_behind``: its first key on connection 0, the usual
                    self._keys_of[peer] = key
                traits = self._traits.get(codec.dialect)  # ``_traits_of``, inline
                self.core.set_traits(key, traits or self._traits_of(codec))
            self._maybe_done[key] = None  # a first message that was refused leaves nothing
            self._live += 1
        if decoded is None:
            decoded = codec.decode(message)  # FAM-10
        if codec.answer is None or role is _CLIENT:  # an answer is to a worker's message
            if decoded.__class__ is Invalid:  # as ``_to_core``
                events = self.core.invalid(key, decoded.rule, decoded.reason, now)
            else:
                events = self.core.command(key, decoded, now)  # type: ignore[arg-type]
        else:
            before = self.core.worker_state(key)
            events = self._to_core(key, decoded, now)
            answer = codec.answer(message, before, self.core.worker_state(key))
            if answer is not None:
                self._answers.append((connection, peer, answer))
        if self._following:
            self._note(events)
        else:  # ``_note``'s look, inline: a request's queueing and dispatch are not noted
            for event in events:
                if event.__class__ in _NOTED:
                    self._note(events)
                    break
        return events

    def _malformed(self, peer: bytes, wrong: tuple[str, str], now: float) -> list[BrokerEvent]:
        """A message malformed in its dialect's own terms: dropped with a violation naming the
        rule (DCP-23), after the core's timers (MDP-D-03)."""
        events = self.core.tick(now)
        events.append(ProtocolViolation(peer, wrong[0], wrong[1], "dropped", now))
        return events

    def tick(self, now: float) -> list[BrokerEvent]:
        """Fire every timer due at or before ``now``: the core's, then the layers'."""
        events = self.core.tick(now)
        self._note(events)
        for layer in self._layers.values():
            own = layer.tick(now)
            self._note(own, follow=False)
            events += own
        return events

    def next_deadline(self) -> float | None:
        """When ``tick`` should next be called (it may be early; never late), or None."""
        deadline = self.core.next_deadline()
        for layer in self._layers.values():
            own = layer.next_deadline()
            if own is not None and (deadline is None or own < deadline):
                deadline = own
        return deadline

    def take_outgoing(self) -> list[Outgoing]:
        """The core's outbox, each message to a (connection, routing id) in its peer's dialect,
        after what the dialects answered and the layers sent themselves, and before the
        refusals of requests past a client's bound (FAM-05, FAM-07)."""
        outbox = self.core.take_outbox()
        if self._placed:  # the last outbox's placing, for ``_core_index``, is forgotten
            self._withheld, self._answered, self._refusals_at = [], 0, None
            self._placed = False
        # MDP/0.2 peers alone (idle routes hold nothing): the frames as the core wrote them.
        if self._live or self._answers or self._sent_by_layers:
            if (  # one message and nothing of the family's to add: as ``_translate``, inline
                len(outbox) == 1
                and not self._refusals
                and not self._answers
                and not self._sent_by_layers
            ):
                key, payload = outbox[0]
                routes = self._routes
                route = routes.get(key)
                if route is None:
                    return [(0, key, payload)]  # type: ignore[list-item]  # MDP/0.2's frames
                if route.layer is None and payload.command is not _PARTIAL:  # type: ignore[union-attr]
                    encoded = route.codec.encode(route, payload, routes.get)  # type: ignore[arg-type]
                    if encoded is None:
                        self._withheld.append(0)
                        self._placed = True
                        return []
                    return [(route.connection, route.routing_id, encoded)]
            out = self._translate(outbox)
            if self._answers or self._sent_by_layers:  # they lead: DCP's answers, the layers'
                own = self._answers + self._sent_by_layers
                self._answers, self._sent_by_layers = [], []
                self._answered = len(own)
                self._placed = True
                out = own + out
            if self._refusals:  # FAM-05: after the core's, in the order they were made
                self._core_taken = len(outbox)
                self._refusals_at = len(out)
                self._placed = True
                out += self._refusals
                self._refusals = []
            return out
        # Only MDP/0.2 peers on connection 0: their frames, as the core wrote them.
        if len(outbox) == 1:  # the request cycle's usual outbox, without a comprehension
            peer, frames = outbox[0]
            return [(0, peer, frames)]  # type: ignore[list-item]
        return [(0, peer, frames) for peer, frames in outbox]  # type: ignore[misc]

    def flushed(self) -> list[RequestCompleted]:
        """As ``Broker.flushed``: the FINALs the runtime sent are completed (MDP-D-24)."""
        events = self.core.flushed()
        maybe_done = self._maybe_done
        if events and self._live:
            # Completions (nothing for a layer to do): their clients may be done with.
            routes = self._routes
            for event in events:
                if event.client in routes:
                    maybe_done[event.client] = None
        # Only after the flush: a send that failed was reported to the keys behind its routing id.
        if not maybe_done:
            return events
        # The keys the core now holds nothing of are parked (once a method of their own, here
        # to save a call per flush).
        core, routes, idle, requests_of = self.core, self._routes, self._idle, self._requests_of
        for key in maybe_done:
            # A silenced key is parked too: the core sends nothing to it, and if it speaks
            # again its address and envelope give it the same key.
            if key in idle or core.retains(key):
                continue
            route = routes.get(key)
            if route is None:
                continue
            client = route.client
            if client is not None:  # FAM-05, FAM-07: no longer counted against it
                held = requests_of[client] - 1
                if held:  # as ``_uncount``
                    requests_of[client] = held
                else:
                    del requests_of[client]
                    self._serials.pop(client, None)  # FAM-08: numbered afresh
                route.client = None
            # A key that names one request or seat alone is forgotten, not parked.
            if route.once:
                self._forget_key(key)
                continue
            idle[key] = None  # REQREP-06: kept for the peer's next request, bounded
            self._live -= 1
            if len(idle) > IDLE_KEYS:
                self._forget_key(next(iter(idle)))
        maybe_done.clear()
        return events

    def peer_unreachable(
        self, peer: bytes, now: float, connection: int = 0, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        """Routing id ``peer`` on ``connection`` is gone: so is every peer behind it
        (REQREP-02). ``unsent`` as for ``Broker.peer_unreachable``, an index in the outbox last
        taken from this broker."""
        at = self._core_index(unsent)
        events = self.core.peer_unreachable(peer, now, unsent=at) if connection == 0 else []
        for key in self._behind(connection, peer):
            if key in self._idle:
                self._forget_key(key)  # a peer that holds nothing and is gone: forgotten
            else:
                events += self.core.peer_unreachable(key, now, unsent=at)
        for layer in self._layers.values():
            layer.peer_gone(peer, connection)
        self._note(events)
        return events

    def peer_congested(
        self, peer: bytes, now: float, connection: int = 0, *, unsent: int | None = None
    ) -> list[BrokerEvent]:
        """Routing id ``peer``'s pipe on ``connection`` is full: every peer behind it is
        congested."""
        at = self._core_index(unsent)
        events = self.core.peer_congested(peer, now, unsent=at) if connection == 0 else []
        for key in self._behind(connection, peer):
            events += self.core.peer_congested(key, now, unsent=at)
        self._note(events)
        return events

    def _core_index(self, index: int | None) -> int | None:
        """The core's index of message ``index`` of the outbox last taken (some are withheld)."""
        if index is None:
            return None
        if self._refusals_at is not None and index >= self._refusals_at:
            return self._core_taken  # a refusal: every message of the core's was sent before it
        # A dialect's answers and the layers' messages lead the outbox: if one of them failed,
        # so did every later message to that peer, the core's first included.
        index = max(0, index - self._answered)
        for skipped in self._withheld:  # ascending
            if skipped <= index:
                index += 1
        return index

    def shutdown(self, now: float) -> list[BrokerEvent]:
        """Give up every request and send DISCONNECT to every registered worker (MDP-W-14),
        each in its dialect; the layers say goodbye in theirs."""
        events = self.core.shutdown(now)
        for layer in self._layers.values():
            events += layer.shutdown(now)
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
        keys = self._behind(connection, peer)
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
        its routing id) and for a key whose peer holds nothing now (REQREP-06)."""
        return None if key in self._idle else self._routes.get(key)

    def address(self, key: bytes) -> tuple[int, bytes]:
        """The (connection, routing id) of the peer the core knows as ``key``."""
        route = self._routes.get(key)
        return (0, key) if route is None else (route.connection, route.routing_id)

    def dialect_of(self, key: bytes) -> str:
        """The name of the dialect the peer the core knows as ``key`` speaks (``"mdp02"``,
        ``"mdp01"``, ...): what a trace record says of a request's client."""
        route = self._routes.get(key)
        return _MDP02_NAME if route is None else str(route.dialect.value)

    def idle(self) -> int:
        """How many routes are kept for idle peers' next request (at most ``IDLE_KEYS``)."""
        return len(self._idle)

    def keys(self) -> int:
        """How many peers the broker holds something of by a key now (bounded: see the module
        docstring); not counting the routes kept for idle peers' next request (REQREP-06)."""
        return self._live

    # -- for layers (domo.protocol.layers: the LayerHost protocol) --------------------------

    def key_for(
        self,
        peer: bytes,
        codec: DialectCodec,
        connection: int,
        request_key: bytes | None,
        traits: PeerTraits | None = None,
        once: bool = False,
    ) -> bytes:
        """The peer key of (``connection``, ``peer``) speaking ``codec`` with no envelope, for
        ``request_key``; its route is made if it is new (encoded by the dialect's layer), and
        forgotten as any key's. ``traits``: the key's in the core (None: the dialect's), always
        neutral (FAM-10). ``once``: the key names one request or one seat alone, never asked for
        again, so its route is forgotten when the core is done with it, not kept idle."""
        key = peer_key(peer, (), codec.dialect, connection, request_key)
        if key in self._idle:
            del self._idle[key]
            self._maybe_done[key] = None
            self._live += 1
        elif key not in self._routes:
            route = PeerRoute(peer, (), codec.dialect, connection, request_key, codec)
            route.layer = self._layers.get(codec.dialect)
            route.once = once
            self._routes[key] = route
            self._keep_behind(connection, peer, key)
            self._maybe_done[key] = None
            self._live += 1
            own = self._traits_of(codec) if traits is None else replace(traits, neutral=True)
            self.core.set_traits(key, own)
        return key

    def send(self, connection: int, peer: bytes, frames: Relayed) -> None:
        """A layer's own message, sent ahead of the core's next outbox."""
        self._sent_by_layers.append((connection, peer, frames))

    def forget_later(self, key: bytes) -> None:
        """Forget ``key`` after the next flush if the core then holds nothing of it."""
        if key in self._routes:
            self._maybe_done[key] = None

    # -- inside -----------------------------------------------------------------------------------

    def _to_core(self, key: bytes, decoded: CoreCommand | Invalid, now: float) -> list[BrokerEvent]:
        """Hand a dialect peer's message to the core as the neutral command its codec made of
        it, or as the invalid message it is (FAM-10)."""
        if type(decoded) is Invalid:
            return self.core.invalid(key, decoded.rule, decoded.reason, now)
        return self.core.command(key, decoded, now)  # type: ignore[arg-type]

    def _traits_of(self, codec: DialectCodec) -> PeerTraits:
        """The core's traits for a peer of ``codec``'s dialect, worked out once per dialect."""
        traits = self._traits.get(codec.dialect)
        if traits is None:
            traits = self._traits[codec.dialect] = traits_of(codec.capabilities)
        return traits

    def _count(
        self,
        route: PeerRoute,
        key: bytes,
        client: bytes,
        now: float,
        message: Sequence[BodyFrame] | None = None,
        service: bytes = b"",
    ) -> list[BrokerEvent] | None:
        """Count request ``key`` against ``client`` (FAM-05, FAM-07), or refuse it: the events
        of the refusal, nothing kept of it. ``message`` (the codec's) or ``service`` name the
        request's service for the refusal."""
        held = self._requests_of.get(client, 0)  # its first is within every bound
        if held and (
            held >= self._client_limit
            or held >= (route.codec.capabilities.outstanding_per_client or self._client_limit)
        ):
            size = 0
            if message is not None:
                service, size = _service_and_size(route.codec, message)
            return self._refuse_beyond_bound(route, key, held, now, service, size)
        self._requests_of[client] = held + 1
        route.client = client
        return None

    def count_request(
        self, key: bytes, service: bytes, size: int, now: float
    ) -> list[BrokerEvent] | None:
        """For a dialect layer that makes its request keys itself (``key_for``): count request
        ``key`` (for ``service``, a body of ``size`` bytes) against its client, as ``receive``
        counts a codec's (FAM-07); None if it may go to the core, else the events of its
        refusal, and the layer keeps nothing of it (nor is its ``refuse`` answer sent: the
        layer answers in its own terms)."""
        route = self._routes[key]
        if route.client is not None:
            return None  # counted already
        envelope = tuple(bytes(frame) for frame in route.envelope)
        client = peer_key(route.routing_id, envelope, route.dialect, route.connection)
        held = self._requests_of.get(client, 0)
        if held and held >= self._client_limit:
            self._forget_key(key)
            events = self.core.tick(now)
            held_bytes = self.core.held_bytes()
            events.append(
                RequestRefused(key, service, "client-limit", size, held_bytes, "FAM-07", now)
            )
            return events
        self._requests_of[client] = held + 1
        route.client = client
        return None

    def _refuse_beyond_bound(
        self, route: PeerRoute, key: bytes, held: int, now: float, service: bytes, size: int
    ) -> list[BrokerEvent]:
        """A request beyond its client's bound: the dialect's answer, if any, and a violation
        (FAM-05: beyond the dialect's own bound) or a refusal (FAM-07: beyond the broker's
        ``max_client_requests``). The core does not see it, and nothing is kept of it, so the
        same key asked again is counted again; the core's timers still come first (MDP-D-03)."""
        events = self.core.tick(now)
        assert route.request_key is not None
        answer = (
            None
            if route.codec.refuse is None
            else route.codec.refuse(route.envelope, route.request_key)
        )
        if answer is not None:
            self._refusals.append((route.connection, route.routing_id, answer))
        bound = route.codec.capabilities.outstanding_per_client
        if bound is not None and held >= bound and bound <= self._client_limit:
            reason = f"a request beyond the {bound} its client may have outstanding"
            events.append(ProtocolViolation(key, "FAM-05", reason, "dropped", now))
        else:
            refused = RequestRefused(
                key, service, "client-limit", size, self.core.held_bytes(), "FAM-07", now
            )
            events.append(refused)
        self._note(events)
        return events

    def _translate(self, outbox: list[tuple[bytes, Outbound]]) -> list[Outgoing]:
        """The core's outbox for the wire: MDP/0.2 frames to a routing id on connection 0 as
        they are, a neutral command to a key in its peer's dialect (FAM-10)."""
        routes = self._routes
        out: list[Outgoing] = []
        for index, (key, payload) in enumerate(outbox):
            route = routes.get(key)
            if route is None:
                out.append((0, key, payload))  # type: ignore[arg-type]  # MDP/0.2's frames
                continue
            command: CoreCommand = payload  # type: ignore[assignment]  # a key is neutral
            if route.layer is not None:
                encoded = route.layer.encode(key, route, command)
            elif command.command is _PARTIAL and withheld(route.codec, command):
                encoded = None  # MDP01-05, REQREP-05, DCP-25: its client takes no PARTIAL
            else:
                encoded = route.codec.encode(route, command, routes.get)
            if encoded is not None:
                out.append((route.connection, route.routing_id, encoded))
            else:
                self._withheld.append(index)
                self._placed = True
        return out

    def _follow_from_now(self, dialect: Enum) -> None:
        """The layer of ``dialect`` has had a message: it follows what the core does from now
        on, in the order of ``_layers``."""
        engaged = {*self._following, dialect}
        self._following = {each: self._layers[each] for each in self._layers if each in engaged}

    def _note(self, events: list[BrokerEvent], follow: bool = True) -> None:
        """Remember the keys whose request or worker just ended: maybe the core forgot them.
        Layers see what the core did first (``follow``), and add what that makes it do."""
        routes = self._routes
        if not routes:
            return
        if follow and self._following:
            for layer in self._following.values():
                layer.follow(events)
        maybe_done, noted = self._maybe_done, _NOTED
        for event in events:
            if event.__class__ not in noted:  # most are not: one look, no call
                continue
            kind = noted[event.__class__]
            if kind == _ENDED:
                peer = event.client  # type: ignore[union-attr]
            elif kind == _GONE:
                peer = event.worker  # type: ignore[union-attr]
            else:  # WorkerRegistered
                assert isinstance(event, WorkerRegistered)
                route = routes.get(event.worker)
                if route is not None:
                    route.service = event.service  # a dialect may name it in each request
                continue
            if peer in routes:
                maybe_done[peer] = None

    def _uncount(self, client: bytes) -> None:
        held = self._requests_of[client] - 1
        if held:
            self._requests_of[client] = held
        else:
            del self._requests_of[client]
            self._serials.pop(client, None)  # FAM-08: numbered afresh

    def _forget_key(self, key: bytes) -> None:
        route = self._routes.pop(key, None)
        if route is None:
            return
        if key in self._idle:
            del self._idle[key]
        else:
            self._live -= 1
        self.core.set_traits(key, None)
        if route.client is not None:
            self._uncount(route.client)
        address = _address(route.connection, route.routing_id)
        keys = self._keys_of[address]
        if isinstance(keys, bytes):  # its only key
            del self._keys_of[address]
        else:
            del keys[key]
            if not keys:
                del self._keys_of[address]

    def _keep_behind(self, connection: int, peer: bytes, key: bytes) -> None:
        """Remember that ``key`` is behind routing id ``peer`` on ``connection``."""
        address = _address(connection, peer)
        keys = self._keys_of.get(address)
        if keys is None:
            self._keys_of[address] = key  # the usual: one key
        elif isinstance(keys, bytes):
            self._keys_of[address] = {keys: None, key: None}
        else:
            keys[key] = None

    def _behind(self, connection: int, peer: bytes) -> list[bytes]:
        """The peer keys behind routing id ``peer`` on ``connection``, oldest first."""
        keys = self._keys_of.get(_address(connection, peer))
        if keys is None:
            return []
        return [keys] if isinstance(keys, bytes) else list(keys)

    def _key_of(
        self, peer: bytes, envelope: tuple[bytes, ...], dialect: Enum, connection: int
    ) -> bytes:
        """``peer_key``, remembered for the peers seen last (a key is costly to make)."""
        at = (connection, peer, envelope, dialect)
        key = self._key_cache.get(at)
        if key is None:
            if len(self._key_cache) >= _KEY_CACHE:
                self._key_cache.clear()
            key = self._key_cache[at] = peer_key(peer, envelope, dialect, connection)
        return key
