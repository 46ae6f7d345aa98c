"""Requests keyed by (client peer, request key): a dialect whose clients carry several.

No dialect domo ships has several requests outstanding per client (eMQP and DCP will); this
test plays one, ``tagged``, registered in a broker's own ``Registry``: a client sends
``"", "TAGC01", tag, service, body...`` and gets ``"", "TAGC01", tag, code, service, body...``.
Its codec says ``outstanding_per_client=None`` and gives a ``request_key`` (the tag), so the
broker holds each (client, tag) as a client of its own: MDP-S-02's one request per client holds
per tag, and two requests of one client are outstanding, served and answered at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import Enum

import pytest

from domo.protocol import BrokerConfig
from domo.protocol.dialects import (
    DETECTION_ORDER,
    MDPC02,
    Capabilities,
    DialectCodec,
    Registry,
    Role,
)
from domo.protocol.events import ProtocolViolation, RequestCompleted, RequestDropped
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


def _decode(message: Sequence[BodyFrame]) -> list[BodyFrame]:
    return [MDPC02, b"\x01", *message[1:]]  # [TAGC01, service, body...] is a REQUEST


def _encode(envelope: Relayed, frames: Relayed, request_key: bytes | None) -> Relayed:
    assert request_key is not None  # every client message of this dialect names its request
    return (*envelope, b"", TAGC01, request_key, *frames[1:])


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
    """Several requests per client need a request key; a key without them is a mistake, and a
    bound above 1 is refused (the broker does not count a client's keys)."""
    unbounded = TAGGED.capabilities
    with pytest.raises(ValueError, match="need a request_key"):
        DialectCodec(Tagged.TAGGED, unbounded, _claims, _decode, _encode)
    bounded = dataclasses.replace(unbounded, outstanding_per_client=4)
    with pytest.raises(ValueError, match="1 \\(no key\\) or None"):
        DialectCodec(Tagged.TAGGED, bounded, _claims, _decode, _encode, request_key=_request_key)
