"""`domo fuzz --dialect emqp` (``domo.fuzz.emqp``) against domo's broker and against brokers with
a planted bug, each of which it must find and name by the rule the bug breaks.

The brokers run in this process (``domo.trio.serve_broker``), the fuzzer in a thread; a planted
bug is a method of ``EmqpBridge`` (or of the core) replaced for one test.

domo's broker runs with its default pipes (16 messages of 4 MiB), so it holds 7 free credits
per worker at most (EMQP-06: what a burst is sure to fit in the pipe), and the fuzzer is told so
(``credits``): requests for every free slot at once fit the worker's pipe. With the spec's 64
and these pipes a worker was dropped as congested with jobs receipted but not delivered
(EMQP-10, EMQP-11), the finding of docs/conformance.md that the cap from the pipe fixed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import trio

from domo.cli import EXIT_OK, EXIT_USAGE
from domo.fuzz.emqp import EmqpFuzzResult, fuzz_emqp
from domo.protocol import BrokerConfig, emqp_bridge
from domo.protocol.dialects.emqp import DISCONNECT, HEARTBEAT, REPLY
from domo.protocol.mdp import BodyFrame, Relayed
from domo.trio import serve_broker

pytestmark = [pytest.mark.io]

INTERVAL, LIVENESS = 0.1, 3
CONFIG = BrokerConfig(heartbeat_interval=INTERVAL, liveness=LIVENESS)
CREDITS = emqp_bridge.credit_cap(CONFIG.pipe_messages)
DOMO = [sys.executable, "-m", "domo"]


async def fuzz_broker(**options: Any) -> EmqpFuzzResult:
    """Serve domo's broker (as patched by the test) and fuzz it; the result."""
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            serving = lambda task_status: serve_broker(  # noqa: E731
                "tcp://127.0.0.1:0", config=CONFIG, task_status=task_status
            )
            [endpoint] = await nursery.start(serving)
            result = await trio.to_thread.run_sync(
                lambda: fuzz_emqp(
                    endpoint,
                    heartbeat_interval=INTERVAL,
                    liveness=LIVENESS,
                    credits=CREDITS,
                    **options,
                )
            )
            nursery.cancel_scope.cancel()
    return result


async def test_emqp_fuzzer_finds_nothing_in_domo_broker() -> None:
    """EMQP-02..18, EMQP-22, EMQP-25, EMQP-26 checked from outside, near misses included: domo's
    broker breaks none of them, and every kind of step was played."""
    result = await fuzz_broker(scenarios=16, seed=11, time_budget=40)
    assert result.findings == (), result.findings
    assert result.stopped is None
    assert result.scenarios == 16
    assert len(result.steps) >= 15, result.steps  # of 21 kinds
    assert result.judged and set(result.held) <= set(result.judged)


async def test_domo_fuzz_dialect_emqp_command_line() -> None:
    """`domo fuzz --dialect emqp` exits 0 against domo's broker and prints the summary; it
    refuses what does not go with eMQP."""
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            serving = lambda task_status: serve_broker(  # noqa: E731
                "tcp://127.0.0.1:0", config=CONFIG, task_status=task_status
            )
            [endpoint] = await nursery.start(serving)
            beats = ["--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS)]
            code, out, err = await run(
                "fuzz", "--dialect", "emqp", endpoint, "--examples", "3", "--seed", "4", *beats
            )
            assert code == EXIT_OK, out + err
            assert "broker (emqp): 3 scenarios" in out
            assert "0 rule(s) broken: none" in out
            code, _, err = await run("fuzz", "--dialect", "emqp", "--target", "worker", endpoint)
            assert code == EXIT_USAGE
            assert "only a broker" in err
            code, _, err = await run("fuzz", endpoint, "--workers", endpoint)
            assert code == EXIT_USAGE
            assert "--dialect emqp" in err
            nursery.cancel_scope.cancel()


async def run(*args: str) -> tuple[int, str, str]:
    done = await trio.run_process(
        [*DOMO, *args], capture_stdout=True, capture_stderr=True, check=False
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


# -- planted bugs -----------------------------------------------------------------------------


def count_ready_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each READY opens two slots, so a worker gets more requests than it gave credits
    (breaks EMQP-07: a slot does one request)."""
    on_ready = emqp_bridge.EmqpBridge._on_ready

    def twice(self: emqp_bridge.EmqpBridge, worker: Any, now: float, events: list[Any]) -> None:
        on_ready(self, worker, now, events)
        on_ready(self, worker, now, events)

    monkeypatch.setattr(emqp_bridge.EmqpBridge, "_on_ready", twice)


def drop_receipts(monkeypatch: pytest.MonkeyPatch) -> None:
    """No "submitted" receipt (breaks EMQP-11)."""
    send = emqp_bridge.EmqpBridge._send

    def without_receipts(
        self: emqp_bridge.EmqpBridge, address: Any, command: bytes, body: Relayed
    ) -> None:
        if not (command == REPLY and len(body) == 1):
            send(self, address, command, body)

    monkeypatch.setattr(emqp_bridge.EmqpBridge, "_send", without_receipts)


def drop_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's result stops at the broker, as in EventMQ 0.3.13 (breaks EMQP-12); the
    broker's own MMI answers still go out."""
    encode = emqp_bridge.EmqpBridge.encode

    def no_results(self: emqp_bridge.EmqpBridge, key: bytes, route: Any, frames: Relayed) -> Any:
        out = encode(self, key, route, frames)
        mmi = out is not None and out[4] in (b"200", b"404", b"501")
        return None if out is not None and out[2] == REPLY and not mmi else out

    monkeypatch.setattr(emqp_bridge.EmqpBridge, "encode", no_results)


def reroute_to_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request for a queue no informed worker lists goes to "default", as in EventMQ 0.3.13
    (breaks EMQP-22)."""
    on_request = emqp_bridge.EmqpBridge._on_request

    def rerouting(
        self: emqp_bridge.EmqpBridge,
        address: Any,
        message: Sequence[BodyFrame],
        now: float,
        events: list[Any],
    ) -> None:
        listed = {queue for w in self._workers.values() for _, queue in w.queues}
        queue = bytes(message[3]) if len(message) > 3 else b"mmi."
        if queue not in listed and not queue.startswith(b"mmi."):
            message = [*message[:3], b"default", *message[4:]]
        on_request(self, address, message, now, events)

    monkeypatch.setattr(emqp_bridge.EmqpBridge, "_on_request", rerouting)


def silent_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused INFORM gets no DISCONNECT (breaks EMQP-04)."""
    send = emqp_bridge.EmqpBridge._send

    def no_disconnect(
        self: emqp_bridge.EmqpBridge, address: Any, command: bytes, body: Relayed
    ) -> None:
        if command != DISCONNECT:
            send(self, address, command, body)

    monkeypatch.setattr(emqp_bridge.EmqpBridge, "_send", no_disconnect)


def no_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker never sends HEARTBEAT (breaks EMQP-15: EventMQ's jobmanager never starts)."""
    send = emqp_bridge.EmqpBridge._send

    def silent(self: emqp_bridge.EmqpBridge, address: Any, command: bytes, body: Relayed) -> None:
        if command != HEARTBEAT:
            send(self, address, command, body)

    monkeypatch.setattr(emqp_bridge.EmqpBridge, "_send", silent)


PLANTED: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str, bool]] = {
    # name: (the bug, the rule it breaks, near misses needed to show it)
    "count-ready-twice": (count_ready_twice, "EMQP-07", False),
    "drop-receipts": (drop_receipts, "EMQP-11", False),
    "drop-results": (drop_results, "EMQP-12", False),
    "reroute-to-default": (reroute_to_default, "EMQP-22", False),
    "silent-refusal": (silent_refusal, "EMQP-04", True),
    "no-heartbeats": (no_heartbeats, "EMQP-15", False),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
async def test_emqp_fuzzer_names_the_planted_bug(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each planted bug is found within 30 scenarios and named by the rule it breaks."""
    plant, rule, malformed = PLANTED[name]
    plant(monkeypatch)
    result = await fuzz_broker(
        scenarios=30, seed=7, time_budget=40, first=True, malformed=malformed
    )
    assert rule in {f.rule for f in result.findings}, result.findings
    found = next(f for f in result.findings if f.rule == rule)
    assert found.seed == 7
    assert found.steps and found.steps[0].kind == "setup"  # the plan that repeats it
