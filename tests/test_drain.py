"""A draining core takes no new request and finishes the ones it has (MDP-D-34, issue 27)."""

from __future__ import annotations

from domo.protocol import BrokerConfig
from domo.protocol.events import RequestCompleted, RequestDispatched, RequestRefused
from domo.protocol.family import FamilyBroker

C02, W02 = b"MDPC02", b"MDPW02"


def test_mdp_d_34_a_draining_core_refuses_new_requests_and_finishes_the_rest() -> None:
    broker = FamilyBroker(BrokerConfig(heartbeat_interval=1.0))
    broker.receive(b"w", [W02, b"\x01", b"echo"], 0.0)
    events = broker.receive(b"c1", [C02, b"\x01", b"echo", b"in flight"], 0.1)
    assert any(isinstance(e, RequestDispatched) for e in events)
    broker.take_outgoing()
    states = [broker.core.draining]
    broker.core.stop_taking_requests()
    states.append(broker.core.draining)
    assert states == [False, True]
    events = broker.receive(b"c2", [C02, b"\x01", b"echo", b"late"], 0.2)
    (refused,) = [e for e in events if isinstance(e, RequestRefused)]
    assert (refused.client, refused.reason, refused.rule, refused.size) == (
        b"c2",
        "draining",
        "MDP-D-34",
        4,
    )
    assert broker.take_outgoing() == []  # nothing of it reaches the worker
    assert [r.client for r in broker.core.requests()] == [b"c1"]
    events = broker.receive(b"w", [W02, b"\x04", b"c1", b"", b"done"], 0.3)
    out = broker.take_outgoing()
    assert [frames[-1] for _, _, frames in out] == [b"done"]  # the one taken still finishes
    assert broker.core.requests() == []
    mmi = broker.receive(b"c3", [C02, b"\x01", b"mmi.service", b"echo"], 0.4)
    assert not any(isinstance(e, RequestRefused) for e in mmi)  # MMI is still answered
    assert not any(isinstance(e, RequestCompleted) for e in mmi)


def test_mdp_d_34_every_dialect_is_refused_while_draining() -> None:
    """Each dialect's new request is refused with the event (logged, counted); none of them has
    a refusal answer for it, so nothing is sent (MDP/0.2, MDP/0.1 and DCP have none; eMQP's
    error REPLY is for malformed requests, EMQP-09)."""
    broker = FamilyBroker(BrokerConfig(heartbeat_interval=1.0))
    broker.core.stop_taking_requests()
    job = b'["run", {"path": "jobs", "callable": "add", "args": [1, 2]}]'
    requests = {
        b"emqp": [b"", b"eMQP/1.0", b"REQUEST", b"m1", b"jobs", b"reply-requested", job],
        b"dcp": [b"", b"DGBX\x01", b"\x04", b"svc", b"", b"r1", b"", b"x"],
        b"mdp01": [b"", b"MDPC01", b"svc", b"x"],
        b"mdp02": [C02, b"\x01", b"svc", b"x"],
    }
    for peer, frames in requests.items():
        events = broker.receive(peer, frames, 0.1)
        refused = [e for e in events if isinstance(e, RequestRefused)]
        assert [(e.reason, e.rule) for e in refused] == [("draining", "MDP-D-34")], peer
        assert broker.take_outgoing() == [], peer
    assert broker.core.requests() == []
