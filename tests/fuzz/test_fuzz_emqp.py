"""`domo fuzz --dialect emqp` (``domo.fuzz.emqp``) against domo's broker and against brokers with
a planted bug, each of which it must find and name by the rule the bug breaks.

Each plant is searched for by the planted suite's short form (``test_planted_search.py``).
Each broker runs in a process of its own (``tests/fuzz/planted_emqp_broker.py``: domo's broker,
with one method of its eMQP bridge altered, or none), as a broker under test does: the fuzzer's
lanes must not share its interpreter.

domo's broker runs with its default pipes (16 messages of 4 MiB), so it holds 7 free credits
per worker at most (EMQP-06: what a burst is sure to fit in the pipe), and the fuzzer is told so
(``credits``): requests for every free slot at once fit the worker's pipe. With the spec's 64
and these pipes a worker was dropped as congested with jobs receipted but not delivered
(EMQP-10, EMQP-11), the finding of docs/conformance.md that the cap from the pipe fixed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from domo.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from domo.fuzz.emqp import EmqpFuzzResult, fuzz_emqp, replay_emqp
from domo.fuzz.scenario import Step
from domo.protocol import BrokerConfig
from domo.protocol.layers.emqp import credit_cap

pytestmark = [pytest.mark.io]

INTERVAL, LIVENESS = 0.1, 3
CREDITS = credit_cap(BrokerConfig().pipe_messages)
DOMO = [sys.executable, "-m", "domo"]
PLANTED = Path(__file__).with_name("planted_emqp_broker.py")


@pytest.fixture
def emqp_broker(start_broker: Callable[[list[str]], str]) -> Callable[[str], str]:
    """Start domo's broker with one eMQP plant (or ``none``); its endpoint."""

    def start(flaw: str) -> str:
        return start_broker([sys.executable, str(PLANTED), flaw, str(INTERVAL), str(LIVENESS)])

    return start


def fuzz(endpoint: str, **options: Any) -> EmqpFuzzResult:
    return fuzz_emqp(
        endpoint, heartbeat_interval=INTERVAL, liveness=LIVENESS, credits=CREDITS, **options
    )


def test_emqp_fuzzer_finds_nothing_in_domo_broker(emqp_broker: Callable[[str], str]) -> None:
    """EMQP-02..18, EMQP-22, EMQP-25, EMQP-26 checked from outside, near misses included: domo's
    broker breaks none of them, and every kind of step was played."""
    result = fuzz(emqp_broker("none"), scenarios=24, seed=11, time_budget=40, lanes=6)
    assert result.findings == (), result.findings
    assert result.stopped is None
    assert result.scenarios == 24
    assert len(result.steps) >= 15, result.steps  # of 22 kinds
    assert set(result.held) <= set(result.judged)
    assert {"EMQP-03", "EMQP-10", "EMQP-11"} <= set(result.judged)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_worker_lost_holding_a_job_hands_it_over(
    emqp_broker: Callable[[str], str], seed: int
) -> None:
    """The ``handover`` step, EMQP-14's run of events (a worker holding a job leaves, goes
    silent or INFORMs again while another listens on its queue): domo's broker gives the job
    to the other and breaks nothing; a broker that forgets the worker but keeps its held jobs
    is named by EMQP-14, whichever way the worker was lost."""
    plan = [Step("setup", 0, seed), Step("handover", 0, seed)]
    clean = replay_emqp(
        emqp_broker("none"), plan, heartbeat_interval=INTERVAL, liveness=LIVENESS, credits=CREDITS
    )
    assert clean == [], clean
    planted = replay_emqp(
        emqp_broker("forget-without-requeue"),
        plan,
        heartbeat_interval=INTERVAL,
        liveness=LIVENESS,
        credits=CREDITS,
    )
    assert "EMQP-14" in {v.rule for v in planted}, planted


def test_domo_fuzz_dialect_emqp_command_line(
    emqp_broker: Callable[[str], str], tmp_path: Path
) -> None:
    """`domo fuzz --dialect emqp` exits 0 against domo's broker and prints the summary and the
    coverage; it refuses what does not go with eMQP."""
    endpoint = emqp_broker("none")
    beats = ["--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS)]
    done = _domo("fuzz", "--dialect", "emqp", endpoint, "--examples", "4", "--seed", "4", *beats)
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "broker (emqp): 4 scenarios" in done.stdout
    assert "0 rule(s) broken: none" in done.stdout
    assert "rule coverage (judged/held): EMQP-" in done.stdout
    refused = _domo("fuzz", "--dialect", "emqp", "--target", "worker", endpoint)
    assert refused.returncode == EXIT_USAGE
    assert "only a broker" in refused.stderr
    refused = _domo("fuzz", endpoint, "--workers", endpoint)
    assert refused.returncode == EXIT_USAGE
    assert "--dialect emqp" in refused.stderr


def test_an_emqp_finding_is_shrunk_saved_and_replayed(
    emqp_broker: Callable[[str], str], tmp_path: Path
) -> None:
    """A finding's smallest plan goes to a replay file; `--replay` runs it again and exits 7 on
    the planted broker."""
    endpoint = emqp_broker("drop-receipts")
    beats = ["--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS)]
    found = _domo(
        "fuzz", "--dialect", "emqp", endpoint, "--time-budget", "30", "--seed", "1", "--first",
        "--no-malformed", "--findings-dir", str(tmp_path), *beats,
    )  # fmt: skip
    assert found.returncode == EXIT_FINDINGS, found.stdout + found.stderr
    replay = tmp_path / "broker-emqp-EMQP-11.json"
    assert replay.is_file(), found.stdout
    again = _domo("fuzz", "--replay", str(replay), endpoint)
    assert again.returncode == EXIT_FINDINGS, again.stdout + again.stderr
    assert "EMQP-11:" in again.stdout


def _domo(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DOMO, *argv], capture_output=True, text=True, timeout=90)
