"""domo.metrics's service labels cannot be squatted (issue 27, finding 7).

Before: the first 1,000 service names anyone registered kept the label slots for good, so after
four memo01 READYs of 256 names a real ``payments`` worker counted only under ``(none)``. Now a
label needs a registered worker, a newcomer takes the slot of a service with no worker left or
one that never completed a request, and a service that has served keeps its label. Fed by a
real core, with the gauges checked against the core's own counts after the churn.
"""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client", reason="the metrics extra: pip install '.[metrics]'")

from domo.metrics import MAX_SERVICES, NO_SERVICE, BrokerMetrics
from domo.protocol import BrokerConfig
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker

C02, W02 = b"MDPC02", b"MDPW02"


class Fed:
    def __init__(self) -> None:
        self.broker = FamilyBroker(BrokerConfig(heartbeat_interval=1.0, liveness=3))
        self.metrics = BrokerMetrics()

    def feed(self, events: list[BrokerEvent]) -> None:
        self.broker.take_outgoing()
        for event in [*events, *self.broker.flushed()]:
            self.metrics.on_event(event)

    def receive(self, peer: bytes, *frames: bytes) -> None:
        self.feed(self.broker.receive(peer, list(frames), 0.0))

    def value(self, name: str, **labels: str) -> float:
        found = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def labels(self) -> set[str]:
        return {
            sample.labels["service"]
            for family in self.metrics.registry.collect()
            for sample in family.samples
            if "service" in sample.labels
        }


def squat(fed: Fed, batch: str, count: int) -> None:
    for n in range(count):
        fed.receive(
            b"sq-%s-%d" % (batch.encode(), n), W02, b"\x01", b"squat-%s-%d" % (batch.encode(), n)
        )


def test_a_real_service_gets_a_label_after_1024_squatted_names_and_keeps_it() -> None:
    fed = Fed()
    squat(fed, "a", 1024)  # what 4 memo01 READYs of 256 names registered
    fed.receive(b"pay-1", W02, b"\x01", b"payments")
    assert fed.value("domo_workers", service="payments", state="idle") == 1
    fed.receive(b"c1", C02, b"\x01", b"payments", b"1 EUR")
    fed.receive(b"pay-1", W02, b"\x04", b"c1", b"", b"paid")
    assert fed.value("domo_requests_total", service="payments", outcome="completed") == 1
    squat(fed, "b", 2 * MAX_SERVICES)  # more squatters: they evict each other, not payments
    assert fed.value("domo_workers", service="payments", state="idle") == 1
    assert len(fed.labels() - {NO_SERVICE}) <= MAX_SERVICES
    # Every registered worker is counted exactly once, under its label or (none).
    total = sum(
        sample.value
        for family in fed.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "domo_workers"
    )
    assert total == 1 + 1024 + 2 * MAX_SERVICES == len(fed.broker.core.workers())


def test_a_service_whose_workers_left_gives_its_slot_up() -> None:
    fed = Fed()
    squat(fed, "a", MAX_SERVICES)
    for n in range(MAX_SERVICES):  # the squatters leave (their series stay until needed)
        fed.receive(b"sq-a-%d" % n, W02, b"\x06")
    fed.receive(b"pay-1", W02, b"\x01", b"payments")
    assert fed.value("domo_workers", service="payments", state="idle") == 1
    assert "squat-a-0" not in fed.labels()  # its series went with its slot
    assert fed.value("domo_workers", service=NO_SERVICE, state="idle") == 0
