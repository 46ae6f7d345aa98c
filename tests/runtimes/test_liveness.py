"""A worker held up longer than its broker's span keeps its broker (``domo.runtime.liveness``).

A worker whose process is held up (a starved thread on a loaded machine, a handler that blocks
the event loop) finds the broker's heartbeats waiting when it runs again: they came in time.
Handed to the session at the late time of reading, they would come after the broker's expiry,
and the worker would drop a live broker, abandon its request and register again (seen on a
loaded machine with ``domo.sync``). Real processes: the worker in a subprocess whose handler
keeps the whole worker from running (the GIL for ``sync``, the loop for the others) for twice
the worker's span of the broker, while the broker, patient enough, keeps heartbeating.
"""

from __future__ import annotations

from collections.abc import Callable

from domo.protocol import BrokerConfig
from domo.protocol.events import (
    RequestCompleted,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from domo.runtime.liveness import heard_at

from .conftest import Peer
from .drivers import Events, Runtime
from .test_behaviour import INTERVAL, LOCAL

WORKER_SPAN = 3 * INTERVAL  # the worker's default liveness of 3


def test_heard_at_keeps_a_late_read_before_the_expiry() -> None:
    assert heard_at(None, 0.0, 5.0) == 5.0  # not connected: no expiry to keep before
    assert heard_at(10.0, 1.0, 9.0) == 9.0  # in time: the real time
    late = heard_at(10.0, 1.0, 12.0)
    assert late < 10.0  # just before the expiry
    assert 10.0 - late < 1e-9
    assert heard_at(10.0, 10.0, 12.0) == 10.0  # never before the session's own latest time


def test_a_held_up_worker_keeps_its_broker(runtime: Runtime, spawn: Callable[..., Peer]) -> None:
    # The broker waits 3 s before it drops a silent worker (slack for a loaded machine); the
    # worker, 0.3 s: the span this test is about.
    patient = BrokerConfig(heartbeat_interval=INTERVAL, liveness=30)
    events = Events()
    endpoint, broker = runtime.broker(LOCAL, patient, events)
    stall = 2 * WORKER_SPAN
    worker = spawn("stalling-worker", runtime.name, endpoint, "held", str(INTERVAL), str(stall))
    events.wait_for(WorkerRegistered)
    with runtime.client(endpoint, timeout=10, retries=0) as client:
        assert client.request("held", b"first") == [b"first"]
        assert worker.line("stalled") == "stalled"
        assert client.request("held", b"second") == [b"second"]
    # Served once each by the one registration: no reconnection, nothing expired or lost.
    events.wait_for(RequestCompleted, count=2)  # the broker's thread may log it after the reply
    assert len(events.of_type(WorkerRegistered)) == 1
    assert events.of_type(WorkerExpired) == []
    assert events.of_type(WorkerDisconnected) == []
    worker.kill()
    broker.stop()
