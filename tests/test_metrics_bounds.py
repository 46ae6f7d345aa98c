"""domo.metrics for the byte bounds: held bytes follow the core's own count, refusals are
counted by reason and rule, and the bounds are exported (MDP-D-25, MDP-D-26, MDP-D-27)."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client", reason="the metrics extra: pip install '.[metrics]'")

from domo.metrics import BrokerMetrics, read_status, serve_metrics
from domo.protocol import BrokerConfig
from domo.protocol.broker import REQUEST_OVERHEAD
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker

C02, W02 = b"MDPC02", b"MDPW02"
KIB = 1024
CONFIG = BrokerConfig(
    heartbeat_interval=1.0,
    max_message_bytes=10 * KIB,
    max_held_bytes=20 * KIB,
    max_peer_bytes=40 * KIB,
    max_pending_bytes=30 * KIB,
)


def test_held_bytes_and_refusals_follow_the_core() -> None:
    broker = FamilyBroker(CONFIG)
    metrics = BrokerMetrics(CONFIG)

    def feed(events: list[BrokerEvent]) -> None:
        broker.take_outgoing()
        for event in [*events, *broker.flushed()]:
            metrics.on_event(event)
        assert metrics.registry.get_sample_value("domo_held_bytes") == broker.core.held_bytes()

    def refused(reason: str, rule: str) -> float:
        value = metrics.registry.get_sample_value(
            "domo_requests_refused_total", {"reason": reason, "rule": rule}
        )
        return 0.0 if value is None else value

    bounds = [("held", 20), ("message", 10), ("peer", 40), ("pending", 30)]  # KiB
    for bound, value in [(name, kib * KIB) for name, kib in bounds]:
        assert metrics.registry.get_sample_value("domo_bytes_limit", {"bound": bound}) == value
    # Each counts its body plus REQUEST_OVERHEAD (2 KiB): two fill the 20 KiB exactly.
    feed(broker.receive(b"C1", [C02, b"\x01", b"echo", b"x" * (8 * KIB)], 0.0))
    feed(broker.receive(b"C2", [C02, b"\x01", b"echo", b"x" * (8 * KIB)], 0.1))
    feed(broker.receive(b"C3", [C02, b"\x01", b"echo", b"x" * (8 * KIB)], 0.2))  # MDP-D-26
    feed(broker.receive(b"C4", [C02, b"\x01", b"echo", b"x" * (11 * KIB)], 0.3))  # MDP-D-25
    assert refused("broker-full", "MDP-D-26") == 1
    assert refused("too-large", "MDP-D-25") == 1
    feed(broker.receive(b"W1", [W02, b"\x01", b"echo"], 0.4))  # takes C1's
    feed(broker.receive(b"W1", [W02, b"\x04", b"C1", b"", b"ok"], 0.5))  # and C2's after it
    assert broker.core.held_bytes() == 8 * KIB + REQUEST_OVERHEAD
    feed(broker.receive(b"W1", [W02, b"\x04", b"C2", b"", b"y" * (11 * KIB)], 0.6))  # too large
    assert broker.core.held_bytes() == 0


def test_read_status_shows_the_bytes_held_and_the_refusals() -> None:
    """``domo status`` (read_status) reads the held bytes, the bounds and the refusals."""
    broker = FamilyBroker(CONFIG)
    metrics = BrokerMetrics(CONFIG)
    for client, size in [(b"C1", 8 * KIB), (b"C2", 11 * KIB)]:  # queued; refused (MDP-D-25)
        for event in broker.receive(client, [C02, b"\x01", b"echo", b"x" * size], 0.0):
            metrics.on_event(event)
    host, port = serve_metrics("127.0.0.1:0", metrics)
    status = read_status(f"http://{host}:{port}/metrics")
    assert status.held_bytes == 8 * KIB + REQUEST_OVERHEAD  # its body and its overhead
    assert status.limits == {
        "held": 20 * KIB,
        "message": 10 * KIB,
        "peer": 40 * KIB,
        "pending": 30 * KIB,
    }
    assert status.refused == {"MDP-D-25": 1}
