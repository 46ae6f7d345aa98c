"""``domo broker --primary/--backup`` as real processes: the pair forms, ``domo status`` shows
it, peers with both endpoints follow a failover, and bad option sets are usage errors."""

from __future__ import annotations

import os
import signal

import trio

from ..chaos.durable_procs import free_port
from ..cli.conftest import QUICK_BEATS, StartDomo, run_domo


async def _pair(domo: StartDomo, metrics: str) -> tuple[list[str], int]:
    ports = [free_port() for _ in range(4)]
    endpoints = [f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}"]
    pair = [f"tcp://127.0.0.1:{ports[2]}", f"tcp://127.0.0.1:{ports[3]}"]
    beat = ["--pair-heartbeat", "0.2", *QUICK_BEATS]
    primary = await domo(
        "broker", "--bind", endpoints[0], "--primary", "--pair-bind", pair[0],
        "--pair-peer", pair[1], "--metrics", metrics, *beat,
    )  # fmt: skip
    backup = await domo(
        "broker", "--bind", endpoints[1], "--backup", "--pair-bind", pair[1],
        "--pair-peer", pair[0], *beat,
    )  # fmt: skip
    await primary.line("domo broker: pair primary: primary -> active (serving)")
    await backup.line("domo broker: pair backup: backup -> passive (not serving)")
    return endpoints, primary.pid


async def test_a_pair_forms_shows_in_status_and_fails_over(domo: StartDomo) -> None:
    """BSTAR-03, BSTAR-05, BSTAR-07, BSTAR-10, BSTAR-17."""
    metrics = f"127.0.0.1:{free_port()}"
    with trio.fail_after(60):
        endpoints, primary_pid = await _pair(domo, metrics)
        status = await run_domo("status", metrics)
        assert status.code == 0, status
        assert "pair: primary, active (serving)" in status.stdout
        both = [arg for endpoint in endpoints for arg in ("--connect", endpoint)]
        await domo("worker", "echo", *both, *QUICK_BEATS)
        before = await run_domo("call", "echo", "before", *both, "--timeout", "1")
        assert (before.code, before.stdout) == (0, "before\n"), before
        # The passive backup drops a client that comes to it alone while the primary lives.
        alone = await run_domo(
            "call", "echo", "x", "--connect", endpoints[1], "--timeout", "0.5", "--retries", "0"
        )
        assert alone.code == 3, alone
        os.kill(primary_pid, signal.SIGKILL)  # a process this test started
        after = await run_domo("call", "echo", "after", *both, "--timeout", "1", "--retries", "8")
        assert (after.code, after.stdout) == (0, "after\n"), after


async def test_pair_options_without_their_partners_are_usage_errors() -> None:
    lone = await run_domo("broker", "--primary")
    assert lone.code == 2
    assert "--primary needs --pair-bind and --pair-peer" in lone.stderr
    orphan = await run_domo("broker", "--pair-bind", "tcp://127.0.0.1:5999")
    assert orphan.code == 2
    assert "need --primary or --backup" in orphan.stderr
    both = await run_domo("broker", "--primary", "--backup")
    assert both.code == 2
