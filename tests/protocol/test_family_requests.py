"""Requests keyed by (client peer, request key): a dialect whose clients carry several.

No dialect domo ships has several requests outstanding per client (eMQP and DCP will); this
test plays one, ``tagged``, registered in a broker's own ``Registry``: a client sends
``"", "TAGC01", tag, service, body...`` and gets ``"", "TAGC01", tag, code, service, body...``.
Its codec says ``outstanding_per_client=None`` and gives a ``request_key`` (the tag), so the
broker holds each (client, tag) as a client of its own: MDP-S-02's one request per client holds
per tag, and two requests of one client are outstanding, served and answered at once. With a
bound of 2 instead (``bounded_broker``), a third is refused (FAM-05).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import Enum

import pytest

from domo.protocol import BrokerConfig
from domo.protocol.dialects import (
    DETECTION_ORDER,
    Capabilities,
    Command,
    CoreCommand,
    Dialect,
    DialectCodec,
    Invalid,
    Lookup,
    Registry,
    Role,
    RouteView,
)
from domo.protocol.dialects.mdp02 import decode_client, to_frames
from domo.protocol.events import (
    ProtocolViolation,
    RequestCompleted,
    RequestDropped,
    RequestRefused,
)
from domo.protocol.family import FamilyBroker, peer_key
from domo.protocol.mdp import BodyFrame, Relayed

from .mdp_strategies import plain

W02, TAGC01 = b"MDPW02", b"TAGC01"
CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=10.0)


class Tagged(Enum):
    TAGGED = "tagged"


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    return Role.CLIENT if header == TAGC01 else None


def _request_key(message: Sequence[BodyFrame]) -> tuple[bytes, list[BodyFrame]] | None:
    if len(message) < 2:
        return None
    return bytes(message[1]), [message[0], *message[2:]]


def _decode(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    return decode_client(message, Command.REQUEST, 1)  # [TAGC01, service, body...]


def _encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed:
    request_key = route.request_key
    assert request_key is not None  # every client message of this dialect names its request
    # Its reply as RFC 18's, its tag first: [TAGC01, tag, code, service, body...].
    return (*route.envelope, b"", TAGC01, request_key, *to_frames(command)[1:])


TAGGED = DialectCodec(
    dialect=Tagged.TAGGED,
    capabilities=Capabilities(
        clients=True,
        workers=False,
        partial_replies=True,
        worker_heartbeats=False,
        broker_heartbeats=False,
        disconnect=False,
        mmi=True,
        outstanding_per_client=None,  # any number, one per tag
        client_hops=False,
    ),
    claims=_claims,
    decode=_decode,
    encode=_encode,
    request_key=_request_key,
)


def broker() -> FamilyBroker:
    made = FamilyBroker(CONFIG, Registry((*DETECTION_ORDER, TAGGED)))
    made.receive(b"W1", [W02, b"\x01", b"echo"], 0.0)
    made.receive(b"W2", [W02, b"\x01", b"echo"], 0.0)
    return made


def out(made: FamilyBroker) -> list[tuple[bytes, tuple[bytes, ...]]]:
    """What the broker sends, as a runtime's flush takes it (``flushed`` included, MDP-D-24)."""
    sent = [(peer, plain(frames)) for _, peer, frames in made.take_outgoing()]
    made.flushed()
    return sent


def test_two_outstanding_requests_of_one_client_are_both_answered() -> None:
    made = broker()
    made.receive(b"C", [b"", TAGC01, b"a", b"echo", b"first"], 0.1)
    made.receive(b"C", [b"", TAGC01, b"b", b"echo", b"second"], 0.2)
    key_a = peer_key(b"C", (), Tagged.TAGGED, 0, b"a")
    key_b = peer_key(b"C", (), Tagged.TAGGED, 0, b"b")
    assert key_a != key_b
    assert out(made) == [  # both outstanding at once, each on its own worker
        (b"W1", (W02, b"\x02", key_a, b"", b"first")),
        (b"W2", (W02, b"\x02", key_b, b"", b"second")),
    ]
    assert {r.client for r in made.core.requests()} == {key_a, key_b}
    # Answered in the other order: each reply carries its own request's key.
    made.receive(b"W2", [W02, b"\x03", key_b, b"", b"half"], 0.3)
    assert made.receive(b"W2", [W02, b"\x04", key_b, b"", b"SECOND"], 0.4) == []
    assert made.receive(b"W1", [W02, b"\x04", key_a, b"", b"FIRST"], 0.5) == []
    sent = [(peer, plain(frames)) for _, peer, frames in made.take_outgoing()]
    assert sent == [
        (b"C", (b"", TAGC01, b"b", b"\x02", b"echo", b"half")),
        (b"C", (b"", TAGC01, b"b", b"\x03", b"echo", b"SECOND")),
        (b"C", (b"", TAGC01, b"a", b"\x03", b"echo", b"FIRST")),
    ]
    done = made.flushed()  # both FINALs sent: both completed (MDP-D-24)
    assert [(type(e), e.client) for e in done] == [
        (RequestCompleted, key_b),
        (RequestCompleted, key_a),
    ]
    assert made.keys() == 0  # REQREP-06: each request's key is forgotten once it is done


def test_one_request_per_key_and_the_client_gone_takes_every_key() -> None:
    """MDP-S-02 holds per (client, key); a client that is unreachable loses all its requests."""
    made = broker()
    made.receive(b"C", [b"", TAGC01, b"a", b"echo", b"1"], 0.1)
    events = made.receive(b"C", [b"", TAGC01, b"a", b"echo", b"again"], 0.2)
    assert [e.rule for e in events if isinstance(e, ProtocolViolation)] == ["MDP-S-02"]
    made.receive(b"C", [b"", TAGC01, b"b", b"echo", b"2"], 0.3)
    assert len(out(made)) == 2
    events = made.peer_unreachable(b"C", 0.4)
    assert sorted(e.client for e in events if isinstance(e, RequestDropped)) == sorted(
        [peer_key(b"C", (), Tagged.TAGGED, 0, b"a"), peer_key(b"C", (), Tagged.TAGGED, 0, b"b")]
    )


def test_a_keyed_dialect_is_declared_consistently() -> None:
    """FAM-06: several requests per client (None or a bound above 1) need a request key, a
    key with a bound of 1 is a mistake, and a bound below 1 means nothing."""
    unbounded = TAGGED.capabilities
    with pytest.raises(ValueError, match="need a request_key"):
        DialectCodec(Tagged.TAGGED, unbounded, _claims, _decode, _encode)
    bounded = dataclasses.replace(unbounded, outstanding_per_client=4)
    with pytest.raises(ValueError, match="need a request_key"):
        DialectCodec(Tagged.TAGGED, bounded, _claims, _decode, _encode)
    DialectCodec(Tagged.TAGGED, bounded, _claims, _decode, _encode, request_key=_request_key)
    single = dataclasses.replace(unbounded, outstanding_per_client=1)
    with pytest.raises(ValueError, match="needs no request_key"):
        DialectCodec(Tagged.TAGGED, single, _claims, _decode, _encode, request_key=_request_key)
    none = dataclasses.replace(unbounded, outstanding_per_client=0)
    with pytest.raises(ValueError, match=">= 1 or None"):
        DialectCodec(Tagged.TAGGED, none, _claims, _decode, _encode, request_key=_request_key)


def _refuse(envelope: Relayed, request_key: bytes) -> Relayed:
    return (*envelope, b"", TAGC01, request_key, b"BUSY")


def bounded_broker(refuse: bool) -> FamilyBroker:
    capabilities = dataclasses.replace(TAGGED.capabilities, outstanding_per_client=2)
    codec = dataclasses.replace(
        TAGGED, capabilities=capabilities, refuse=_refuse if refuse else None
    )
    made = FamilyBroker(CONFIG, Registry((*DETECTION_ORDER, codec)))
    made.receive(b"W1", [W02, b"\x01", b"echo"], 0.0)
    return made


def tagged(tag: bytes, body: bytes) -> list[BodyFrame]:
    return [b"", TAGC01, tag, b"echo", body]


def test_a_request_beyond_the_bound_is_refused_with_the_dialects_answer() -> None:
    """FAM-05: with a bound of 2, a third key is refused (a violation, the dialect's answer
    after the core's messages); the same key asked again is refused again; once one request is
    done and its FINAL flushed, a new key is accepted. Another client has a bound of its own."""
    made = bounded_broker(refuse=True)
    key = {tag: peer_key(b"C", (), Tagged.TAGGED, 0, tag) for tag in (b"a", b"b", b"c", b"d")}
    made.receive(b"C", tagged(b"a", b"1"), 0.1)
    made.receive(b"C", tagged(b"b", b"2"), 0.2)  # queued: one worker
    events = made.receive(b"C", tagged(b"c", b"3"), 0.3)
    assert len(events) == 1
    assert isinstance(events[0], ProtocolViolation)
    assert (events[0].peer, events[0].rule, events[0].action) == (key[b"c"], "FAM-05", "dropped")
    assert made.receive(b"D", tagged(b"x", b"other client"), 0.3)  # its own bound
    assert out(made) == [
        (b"W1", (W02, b"\x02", key[b"a"], b"", b"1")),
        (b"C", (b"", TAGC01, b"c", b"BUSY")),
    ]
    assert {r.client for r in made.core.requests()} == {
        key[b"a"],
        key[b"b"],
        peer_key(b"D", (), Tagged.TAGGED, 0, b"x"),
    }
    again = made.receive(b"C", tagged(b"c", b"3"), 0.4)
    assert [e.rule for e in again if isinstance(e, ProtocolViolation)] == ["FAM-05"]
    assert out(made) == [(b"C", (b"", TAGC01, b"c", b"BUSY"))]
    # The FINAL for a is taken but not yet flushed: a is still held, d is refused.
    made.receive(b"W1", [W02, b"\x04", key[b"a"], b"", b"A"], 0.5)
    taken = made.take_outgoing()
    refused = made.receive(b"C", tagged(b"d", b"4"), 0.5)
    assert [e.rule for e in refused if isinstance(e, ProtocolViolation)] == ["FAM-05"]
    assert [type(e) for e in made.flushed()] == [RequestCompleted]
    assert [frames[-1] for _, _, frames in taken] == [b"A", b"2"]  # a's FINAL, b dispatched
    out(made)  # the refusal of d
    assert made.receive(b"C", tagged(b"d", b"4"), 0.6)  # accepted now
    assert key[b"d"] in {r.client for r in made.core.requests()}


def test_a_dialect_without_an_answer_refuses_in_silence() -> None:
    """FAM-05 with no ``refuse``: the violation, nothing sent."""
    made = bounded_broker(refuse=False)
    made.receive(b"C", tagged(b"a", b"1"), 0.1)
    made.receive(b"C", tagged(b"b", b"2"), 0.2)
    events = made.receive(b"C", tagged(b"c", b"3"), 0.3)
    assert [e.rule for e in events if isinstance(e, ProtocolViolation)] == ["FAM-05"]
    assert [peer for peer, _ in out(made)] == [b"W1"]


def test_a_refusal_the_runtime_could_not_send_blames_no_request() -> None:
    """FAM-05, MDP-D-24: a refusal that failed to go out (its index in the outbox) does not
    drop the client's requests held by the core, whose messages went before it."""
    made = bounded_broker(refuse=True)
    made.receive(b"C", tagged(b"a", b"1"), 0.1)
    made.receive(b"C", tagged(b"b", b"2"), 0.2)
    made.receive(b"C", tagged(b"c", b"3"), 0.3)
    taken = made.take_outgoing()
    assert [peer for _, peer, _ in taken] == [b"W1", b"C"]
    events = made.peer_congested(b"C", 0.4, unsent=1)
    assert not [e for e in events if isinstance(e, RequestDropped)]
    made.flushed()
    assert len(made.core.requests()) == 2


# --- FAM-07: the broker's cap per client, for every dialect with several ----------------------


LIMITED = BrokerConfig(
    heartbeat_interval=1.0, liveness=3, request_expiry=10.0, max_client_requests=2
)


def _refusals(events: Sequence[object]) -> list[tuple[str, bytes, int, str]]:
    return [(e.reason, e.service, e.size, e.rule) for e in events if isinstance(e, RequestRefused)]


def test_fam_07_an_mdp01_client_past_max_client_requests_is_refused_each_time() -> None:
    """FAM-07, FAM-08: an RFC 7 DEALER client with two outstanding (the cap) has its third and
    fourth refused, each with a ``RequestRefused`` and nothing sent (RFC 7 has no refusal);
    once one is answered, the next is taken again."""
    broker = FamilyBroker(LIMITED)
    for body in (b"1", b"2"):
        assert not _refusals(broker.receive(b"C", [b"", b"MDPC01", b"echo", body], 0.0))
    for body in (b"3", b"45"):
        events = broker.receive(b"C", [b"", b"MDPC01", b"echo", body], 0.1)
        assert _refusals(events) == [("client-limit", b"echo", len(body), "FAM-07")]
    assert broker.take_outgoing() == []
    assert broker.core.queued(b"echo") == 2
    assert broker.receive(b"D", [b"", b"MDPC01", b"echo", b"x"], 0.1)  # another client: its own
    broker.receive(b"W", [W02, b"\x01", b"echo"], 0.2)
    [(_, _, request)] = broker.take_outgoing()
    broker.receive(b"W", [W02, b"\x04", request[2], b"", b"one"], 0.3)
    assert [plain(f) for _, _, f in broker.take_outgoing()] == [
        (b"", b"MDPC01", b"echo", b"one"),
        (W02, b"\x02", peer_key(b"C", (), Dialect.MDP01, request_key=b"#2"), b"", b"2"),
    ]
    broker.flushed()
    events = broker.receive(b"C", [b"", b"MDPC01", b"echo", b"5"], 0.4)
    assert not _refusals(events)
    assert broker.core.queued(b"echo") == 2  # the other client's and this one


def test_fam_07_dcp_and_emqp_clients_past_the_cap() -> None:
    """FAM-07: a DCP client (no refusal answer) and an eMQP client (its error REPLY, EMQP-09)
    past ``max_client_requests``."""
    broker = FamilyBroker(LIMITED)
    for meta in (b"a", b"b", b"c"):
        events = broker.receive(
            b"D", [b"", b"DGBX\x01", b"\x04", b"svc", b"", meta, b"", b"x"], 0.0
        )
    assert _refusals(events) == [("client-limit", b"svc", 1, "FAM-07")]
    assert broker.take_outgoing() == []
    job = b'["run", {"path": "p", "callable": "c"}]'
    for msgid in (b"m1", b"m2", b"m3"):
        events = broker.receive(b"E", [b"", b"eMQP/1.0", b"REQUEST", msgid, b"q", b"", job], 0.1)
    assert _refusals(events) == [("client-limit", b"q", len(job), "FAM-07")]
    [(_, to, answer)] = broker.take_outgoing()
    assert to == b"E"
    assert plain(answer)[2] == b"REPLY"
    assert plain(answer)[-1] == b"m3"
    assert b"FAM-07" in plain(answer)[-2]
    assert broker.core.queued(b"q") == 2
    # Nothing is kept of a refused request: the keys held are the two clients' two each.
    assert broker.keys() == 4
