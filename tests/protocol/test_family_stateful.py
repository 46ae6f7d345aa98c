"""Every dialect against a model: FamilyBroker must act as an MDP/0.2 broker seen through framing.

A Hypothesis ``RuleBasedStateMachine`` plays workers and clients, each speaking one dialect
(MDP/0.2, MDP/0.1, majortomo, an RFC 18 client behind REQ, REQ clients behind hops), a clock
and near-miss garbage. The model is the routing the family shares, MDP/0.2's ``Broker`` (tested
against its own independent model in test_broker_stateful.py), fed the same conversation in
plain MDP/0.2 framing written here from the specs (specs/mdp-0.1.md, majortomo.md, reqrep.md),
sharing no code with ``domo.protocol.dialects``. After every step, everything FamilyBroker sends
must be exactly what the model sends, framed here for each destination's dialect (MDP01-03,
MDP01-05, MAJ-03, MAJ-04, REQREP-01, REQREP-05), with the client addresses in REQUESTs mapped
one to one (each peer is one client, REQREP-02). Its events must be the model's, and it must
hold no key for a peer the model has forgotten (REQREP-06).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domo.protocol.broker import Broker, BrokerConfig, PeerState, PeerTraits
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker

CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=4.0, max_redispatches=1)
C02, W02, C01, W01 = b"MDPC02", b"MDPW02", b"MDPC01", b"MDPW01"
SERVICES = (b"s0", b"s1")
WORKER_DIALECTS = ("mdp02", "mdp01", "majortomo")
CLIENT_DIALECTS = ("mdp02", "mdp01", "majortomo", "mdp02-req", "mdp01-hops")
WORKER_CODES_01 = {b"\x01": b"\x01", b"\x04": b"\x03", b"\x05": b"\x04", b"\x06": b"\x05"}
TO_01 = {b"\x02": b"\x02", b"\x05": b"\x04", b"\x06": b"\x05"}


@dataclass(frozen=True)
class Peer:
    """One simulated peer: its routing id, the address stack in front of its messages, its
    dialect, and the id the model knows it by (a plain MDP/0.2 peer)."""

    routing_id: bytes
    envelope: tuple[bytes, ...]
    dialect: str
    request: int = 0  # an MDP/0.1 client's requests are clients of their own (FAM-08)

    @property
    def model_id(self) -> bytes:
        own = b"m:" + self.routing_id + b"/" + b"/".join(self.envelope)
        return own + b"#%d" % self.request if self.request else own


def to_wire(peer: Peer, plain: tuple[bytes, ...]) -> list[bytes]:
    """An MDP/0.2 command of the peer, in its own dialect's framing (from the specs)."""
    header, code, rest = plain[0], plain[1], plain[2:]
    if peer.dialect == "mdp02":
        return list(plain)
    if peer.dialect == "majortomo":
        if header == C02:
            return [b"", C02, b"\x02", *rest]  # MAJ-02
        return [b"", *plain]  # MAJ-01
    if peer.dialect == "mdp02-req":
        return [*peer.envelope, b"", *plain]  # REQREP-04
    if header == C02:  # MDP/0.1 client (also behind hops): MDP01-01
        return [*peer.envelope, b"", C01, *rest]
    return [b"", W01, WORKER_CODES_01[code], *rest]  # MDP01-02


def expected_wire(peer: Peer, plain: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
    """What FamilyBroker must send ``peer`` for the model's MDP/0.2 message (None: nothing)."""
    header, code = plain[0], plain[1]
    if peer.dialect == "mdp02":
        return plain
    if peer.dialect == "majortomo":
        if header == C02:
            return (b"", C02, b"\x03" if code == b"\x02" else b"\x04", *plain[3:])  # MAJ-03/04
        return (b"", *plain)
    if header == C02:
        if code == b"\x02":
            return None  # MDP01-05, REQREP-05: a REQ socket takes one reply
        if peer.dialect == "mdp02-req":
            return (*peer.envelope, b"", *plain)  # REQREP-01
        return (*peer.envelope, b"", C01, *plain[2:])  # MDP01-03
    return (b"", W01, TO_01[code], *plain[2:])


def summary(events: list[BrokerEvent], names: dict[bytes, bytes]) -> list[tuple[object, ...]]:
    """Events as tuples, with every peer id replaced by the model's name for it."""
    return [
        (type(e).__name__, *(_named(getattr(e, f.name), names) for f in dataclasses.fields(e)))
        for e in events
    ]


def _named(value: object, names: dict[bytes, bytes]) -> object:
    return names.get(value, value) if isinstance(value, bytes) else value


class FamilyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.family = FamilyBroker(CONFIG)
        self.model = Broker(CONFIG)
        self.now = 0.0
        self.workers: list[Peer] = []
        self.clients: list[Peer] = []
        self.by_model_id: dict[bytes, Peer] = {}
        self.key_of: dict[bytes, bytes] = {}  # model id -> FamilyBroker's id for the peer
        self.names: dict[bytes, bytes] = {}  # FamilyBroker's id -> model id
        self.counter = 0

    # -- peers --------------------------------------------------------------------------------

    def _new_peer(self, dialect: str) -> Peer:
        self.counter += 1
        rid = b"r%d" % self.counter
        envelope: tuple[bytes, ...] = ()
        if dialect == "mdp01-hops":
            rid = b"proxy"  # several clients behind one hop (REQREP-02)
            envelope = (b"h%d" % self.counter, b"c%d" % self.counter)
        elif dialect in ("mdp01", "mdp02-req"):
            envelope = (b"c%d" % self.counter,) if self.counter % 2 else ()
        peer = Peer(rid, envelope, "mdp01" if dialect == "mdp01-hops" else dialect)
        self.by_model_id[peer.model_id] = peer
        return peer

    def _send(self, peer: Peer, plain: tuple[bytes, ...]) -> None:
        family_events = self.family.receive(peer.routing_id, to_wire(peer, plain), self.now)
        model_events = self.model.receive(peer.model_id, list(plain), self.now)
        self._learn(family_events, model_events)
        self._compare(family_events, model_events)

    def _learn(self, family: list[BrokerEvent], model: list[BrokerEvent]) -> None:
        """Map FamilyBroker's peer ids to the model's, one to one, from paired events."""
        for got, want in zip(family, model, strict=False):
            for field in ("worker", "client", "peer"):
                a, b = getattr(got, field, None), getattr(want, field, None)
                if isinstance(a, bytes) and isinstance(b, bytes):
                    assert self.names.setdefault(a, b) == b, "two peers share one id"
                    assert self.key_of.setdefault(b, a) == a, "one peer has two ids"

    def _compare(self, family: list[BrokerEvent], model: list[BrokerEvent]) -> None:
        assert summary(family, self.names) == summary(model, {}), "events differ from the model"
        sent = self.family.take_outgoing()
        expected: list[tuple[bytes, tuple[bytes, ...]]] = []
        for model_id, frames in self.model.take_outgoing():
            peer = self.by_model_id[model_id]
            plain = tuple(bytes(f) for f in frames)
            if plain[0] == W02 and plain[1] == b"\x02":  # a REQUEST: the client's address
                plain = (*plain[:2], self.key_of[plain[2]], *plain[3:])
            wire = expected_wire(peer, plain)
            if wire is not None:
                expected.append((peer.routing_id, wire))
        assert [(to, tuple(bytes(f) for f in fr)) for _, to, fr in sent] == expected
        assert all(connection == 0 for connection, _, _ in sent)
        # Everything was sent: the FINALs complete in both (MDP-D-24).
        family_done: list[BrokerEvent] = [*self.family.flushed()]
        model_done: list[BrokerEvent] = [*self.model.flushed()]
        self._learn(family_done, model_done)
        assert summary(family_done, self.names) == summary(model_done, {}), "flushed differ"

    # -- rules --------------------------------------------------------------------------------

    @rule(dialect=st.sampled_from(WORKER_DIALECTS), service=st.sampled_from(SERVICES))
    def worker_ready(self, dialect: str, service: bytes) -> None:
        worker = self._new_peer(dialect)
        self.workers.append(worker)
        if dialect in ("mdp01", "majortomo"):  # MDP01-12, MAJ-08: silent while busy (FAM-09)
            self.model.set_traits(worker.model_id, PeerTraits(busy_heartbeats=False))
        self._send(worker, (W02, b"\x01", service))

    @rule(
        dialect=st.sampled_from(CLIENT_DIALECTS),
        service=st.sampled_from((*SERVICES, b"nobody", b"mmi.service")),
        body=st.lists(st.binary(max_size=3), min_size=1, max_size=3),
    )
    def client_request(self, dialect: str, service: bytes, body: list[bytes]) -> None:
        client = self._new_peer(dialect)
        self.clients.append(client)
        self._send(client, (C02, b"\x01", service, *body))

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), body=st.binary(max_size=3))
    def client_again(self, data: st.DataObject, body: bytes) -> None:
        """A client asks again (MDP-S-02 if its first request is still outstanding; an MDP/0.1
        client's requests are numbered, each a client of its own to the model, FAM-08)."""
        client = data.draw(st.sampled_from(self.clients))
        if client.dialect == "mdp01":
            self.counter += 1
            client = dataclasses.replace(client, request=self.counter)
            self.by_model_id[client.model_id] = client
            self._forget_stale_keys()
        self._send(client, (C02, b"\x01", SERVICES[0], body))

    def _forget_stale_keys(self) -> None:
        """A numbered client's keys are numbered afresh once it holds none (FAM-08): a key
        the broker forgot may name another request later."""
        for key in list(self.names):
            if key.startswith(b"\x00\xffdomo:") and self.family.route(key) is None:
                del self.key_of[self.names.pop(key)]

    @precondition(lambda self: self.workers)
    @rule(data=st.data(), final=st.booleans(), body=st.binary(max_size=3))
    def worker_replies(self, data: st.DataObject, final: bool, body: bytes) -> None:
        worker = data.draw(st.sampled_from(self.workers))
        if worker.dialect == "mdp01" and not final:
            final = True  # MDP/0.1 has no PARTIAL
        busy = [r.client for r in self.model.requests() if r.worker == worker.model_id]
        client = busy[0] if busy else data.draw(st.sampled_from([b"m:nobody", *self.key_of]))
        address = self.key_of.get(client, client)
        family_frames = to_wire(worker, (W02, b"\x04" if final else b"\x03", address, b"", body))
        family_events = self.family.receive(worker.routing_id, family_frames, self.now)
        model_events = self.model.receive(
            worker.model_id, [W02, b"\x04" if final else b"\x03", client, b"", body], self.now
        )
        self._learn(family_events, model_events)
        self._compare(family_events, model_events)

    @precondition(lambda self: self.workers)
    @rule(data=st.data(), disconnect=st.booleans())
    def worker_beats_or_leaves(self, data: st.DataObject, disconnect: bool) -> None:
        worker = data.draw(st.sampled_from(self.workers))
        self._send(worker, (W02, b"\x06" if disconnect else b"\x05"))

    @rule(step=st.sampled_from((0.25, 0.5, 1.0, 2.0, 3.0)))
    def time_passes(self, step: float) -> None:
        self.now += step
        family_events = self.family.tick(self.now)
        model_events = self.model.tick(self.now)
        self._learn(family_events, model_events)
        self._compare(family_events, model_events)

    @rule(dialect=st.sampled_from(CLIENT_DIALECTS))
    def near_miss(self, dialect: str) -> None:
        """A dialect message cut short (header only): refused as the model refuses it."""
        peer = self._new_peer(dialect)
        wire = to_wire(peer, (C02, b"\x01", b"s0", b"x"))
        cut = wire[: len(wire) - 2]
        family_events = self.family.receive(peer.routing_id, cut, self.now)
        assert all(type(e).__name__ == "ProtocolViolation" for e in family_events)
        assert self.family.take_outgoing() == []
        assert self.family.flushed() == []

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def keys_counts_the_routes_not_kept_idle(self) -> None:
        """``keys()`` (counted as routes are made, parked and forgotten) agrees with the routes."""
        assert self.family.keys() == len(self.family._routes) - self.family.idle()

    @invariant()
    def keys_only_for_peers_the_model_holds(self) -> None:
        """REQREP-06: no key outlives what the model still knows of its peer."""
        for model_id, key in self.key_of.items():
            if self.family.route(key) is None:
                continue
            peer = self.by_model_id[model_id]
            assert peer.dialect != "mdp02", "an MDP/0.2 peer needs no key"
            held = self.model.holds(model_id) or self.model.worker_state(model_id) in (
                PeerState.IDLE,
                PeerState.BUSY,
            )
            assert held, f"a key is kept for {model_id!r}, which the model has forgotten"

    @invariant()
    def same_services_and_workers(self) -> None:
        assert self.family.core.services() == self.model.services()
        assert [self.names.get(w, w) for w in self.family.workers()] == list(self.model.workers())


TestFamilyMachine = FamilyMachine.TestCase
