"""domo.metrics: the broker's Prometheus metrics, checked against the core's own state.

The unit test feeds ``BrokerMetrics`` every event of a real core through a scenario (workers
registering, requests queued and dispatched, a worker lost mid-request, a client gone while
its worker works, a queued request expired) and compares, after every step, the gauges with
what the core says it holds (``Broker.services()``). The end-to-end test runs ``domo broker
--metrics``, a worker and calls as processes, and reads them back with ``domo status``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="the metrics extra: pip install '.[metrics]'")

from domo.metrics import NO_SERVICE, BrokerMetrics, read_status, serve_metrics
from domo.protocol import BrokerConfig
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker

C02, W02 = b"MDPC02", b"MDPW02"  # worker commands: READY 1, FINAL 4, DISCONNECT 6
CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=10.0)


def sample(metrics: BrokerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


class Scenario:
    """A core and the metrics fed by its events; ``check`` compares them after each step."""

    def __init__(self) -> None:
        self.broker = FamilyBroker(CONFIG)
        self.metrics = BrokerMetrics()
        self.now = 0.0

    def feed(self, events: list[BrokerEvent]) -> None:
        """What a runtime's flush does: events, then send the outbox, then ``flushed``."""
        self.broker.take_outgoing()
        for event in [*events, *self.broker.flushed()]:
            self.metrics.on_event(event)
        self.check()

    def receive(self, peer: bytes, *frames: bytes) -> None:
        self.feed(self.broker.receive(peer, list(frames), self.now))

    def at(self, now: float) -> None:
        self.now = now
        self.feed(self.broker.tick(now))

    def check(self) -> None:
        services = self.broker.core.services()
        for name, view in services.items():
            label = name.decode() if name in self.metrics._services else NO_SERVICE
            if label == NO_SERVICE:
                continue  # summed with others; checked below
            assert sample(self.metrics, "domo_workers", service=label, state="idle") == view.idle
            busy = view.workers - view.idle
            assert sample(self.metrics, "domo_workers", service=label, state="busy") == busy
            assert sample(self.metrics, "domo_queued_requests", service=label) == view.queued
        unserved = sum(v.queued for n, v in services.items() if n not in self.metrics._services)
        assert sample(self.metrics, "domo_queued_requests", service=NO_SERVICE) == unserved


def test_the_gauges_follow_the_core_step_by_step() -> None:
    s = Scenario()
    s.receive(b"c0", C02, b"\x01", b"echo", b"early")  # queued before any worker: "(none)"
    assert sample(s.metrics, "domo_requests_received_total", service=NO_SERVICE) == 1
    s.receive(b"w1", W02, b"\x01", b"echo")  # takes the queued request at once
    s.receive(b"w2", W02, b"\x01", b"echo")
    s.receive(b"c1", C02, b"\x01", b"echo", b"one")
    s.receive(b"c2", C02, b"\x01", b"echo", b"two")  # both workers busy: queued
    s.receive(b"w1", W02, b"\x04", b"c0", b"", b"early")  # FINAL; w1 takes c2's
    assert sample(s.metrics, "domo_requests_total", service="echo", outcome="completed") == 1
    assert sample(s.metrics, "domo_request_latency_seconds_count", service="echo") == 1
    s.feed(s.broker.peer_unreachable(b"c1", s.now))  # c1 gone while w2 works for it
    assert sample(s.metrics, "domo_workers", service="echo", state="busy") == 2
    s.receive(b"w2", W02, b"\x04", b"c1", b"", b"one")  # dropped: w2 idle again
    s.receive(b"c3", C02, b"\x01", b"echo", b"three")  # to w2
    s.receive(b"w1", W02, b"\x06")  # w1 leaves mid-request: c2's goes back, waits for w2
    assert sample(s.metrics, "domo_redispatches_total", service="echo") == 1
    assert sample(s.metrics, "domo_worker_losses_total", reason="worker-disconnect") == 1
    s.receive(b"c4", C02, b"\x01", b"nobody", b"x")  # a service no worker ever had
    s.at(12.0)  # w2 expired (silent 3 s); every queued request expired (10 s)
    assert sample(s.metrics, "domo_worker_losses_total", reason="expired") == 1
    assert sample(s.metrics, "domo_requests_total", service=NO_SERVICE, outcome="expired") == 1
    assert sample(s.metrics, "domo_requests_dropped_total", service="echo",
                  reason="client-unreachable") == 1  # fmt: skip
    assert sample(s.metrics, "domo_workers", service="echo", state="idle") == 0


def test_a_busy_timeout_is_counted_apart_from_an_expiry() -> None:
    """FAM-09: a majortomo worker silent past ``busy_worker_timeout`` while busy is a
    ``busy-timeout`` loss; its request goes back to the queue (a re-dispatch)."""
    s = Scenario()
    s.broker = FamilyBroker(
        BrokerConfig(heartbeat_interval=1.0, liveness=3, busy_worker_timeout=5.0)
    )
    s.receive(b"m", b"", W02, b"\x01", b"slow")  # majortomo's READY (MAJ-01)
    s.receive(b"c", C02, b"\x01", b"slow", b"job")
    s.at(4.0)  # past the liveness span, not the busy timeout
    assert sample(s.metrics, "domo_worker_losses_total", reason="expired") == 0
    s.at(5.0)
    assert sample(s.metrics, "domo_worker_losses_total", reason="busy-timeout") == 1
    assert sample(s.metrics, "domo_redispatches_total", service="slow") == 1


def test_junk_counts_violations_by_rule_and_adds_no_service_label() -> None:
    s = Scenario()
    for n in range(50):
        s.receive(b"c%d" % n, C02, b"\x01", b"svc-%d" % n, b"x")  # 50 names nobody serves
    s.receive(b"j", b"MDPX99", b"\x01")
    families = {m.name for m in s.metrics.registry.collect() if m.samples}
    assert "domo_violations" in families
    labels = {
        sample.labels.get("service")
        for family in s.metrics.registry.collect()
        for sample in family.samples
    }
    assert labels <= {None, NO_SERVICE}  # bounded: no label per unknown service


def test_the_http_endpoint_and_read_status() -> None:
    s = Scenario()
    s.receive(b"w1", W02, b"\x01", b"echo")
    s.receive(b"c1", C02, b"\x01", b"echo", b"x")
    host, port = serve_metrics("127.0.0.1:0", s.metrics)
    status = read_status(f"http://{host}:{port}/metrics")
    echo = status.services["echo"]
    assert (echo.idle, echo.busy, echo.queued, echo.completed) == (0, 1, 0, 0)


def _domo(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "domo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_domo_broker_metrics_and_domo_status(tmp_path: Path) -> None:
    out = tmp_path / "broker.out"
    with out.open("w") as sink:
        broker = subprocess.Popen(
            [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
             "--metrics", "127.0.0.1:0"],
            stdout=sink, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    worker = None
    try:
        deadline = time.monotonic() + 20
        while "listening on" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = out.read_text().split()
        endpoint = next(word for word in lines if word.startswith("tcp://"))
        url = next(word for word in lines if word.startswith("http://"))
        worker = subprocess.Popen(
            [sys.executable, "-m", "domo", "worker", "echo", "--connect", endpoint],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(3):
            assert _domo("call", "echo", "hi", "--connect", endpoint).returncode == 0
        shown = _domo("status", url, "--json")
        assert shown.returncode == 0, shown.stderr
        echo = json.loads(shown.stdout)["services"]["echo"]
        assert (echo["idle"], echo["busy"], echo["completed"]) == (1, 0, 3)
        table = _domo("status", url.removeprefix("http://").removesuffix("/metrics"))
        assert table.stdout.splitlines()[0].split() == [
            "service", "idle", "busy", "queued", "completed", "expired", "dropped"
        ]  # fmt: skip
        assert table.stdout.splitlines()[1].split() == ["echo", "1", "0", "0", "3", "0", "0"]
        nothing = _domo("status", "127.0.0.1:1")
        assert nothing.returncode == 9
        assert "cannot read http://127.0.0.1:1/metrics" in nothing.stderr
        bad = _domo("broker", "--metrics", "nowhere")
        assert bad.returncode == 2
    finally:
        for process in (worker, broker):
            if process is not None:
                process.kill()
                process.wait(timeout=10)
