"""What ``domo worker`` says when its heartbeat interval does not match its broker's, from its
own side: a broker that keeps giving it up (DISCONNECT, then takes it back at once)."""

from __future__ import annotations

import pytest

from .conftest import StartDomo

pytestmark = pytest.mark.io


async def test_worker_with_a_longer_interval_is_told_when_the_broker_gives_it_up(
    domo: StartDomo,
) -> None:
    """Broker at 0.1 s (liveness 3), worker at 1 s: the broker expires the worker between its
    heartbeats and answers its next one with DISCONNECT; the worker reconnects, is answered at
    once, and says why that happens, once."""
    broker = await domo(
        "broker", "--bind", "tcp://127.0.0.1:0", "--heartbeat-interval", "0.1", "--liveness", "3"
    )
    endpoint = await broker.endpoint()
    worker = await domo("worker", "echo", "--connect", endpoint, "--heartbeat-interval", "1")
    hint = await worker.line("sent DISCONNECT and took this worker back", "stderr", time_limit=20)
    assert "--heartbeat-interval (here 1 s) is longer than its own (they must match)" in hint
    # The broker names it too, at the first expiry.
    expired = await broker.line("WorkerExpired:", "stderr")
    assert "or its heartbeat interval is longer than this broker's: they must match" in expired
    await broker.line("spoke again after it expired", "stderr", time_limit=20)
    await broker.line("WorkerExpired:", "stderr")  # again: the hint is not repeated
    assert sum("took this worker back" in line for line in worker.lines("stderr")) == 1
