"""`domo fuzz --dialect memo01` against planted memo01 brokers (each in a process of its own):
each mistake is found and named by its rule of specs/memo01.md, and a finding's plan replays."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pynng")
pytest.importorskip("cbor2")

from domo.cli import EXIT_FINDINGS
from domo.fuzz.memo01 import fuzz_memo01, replay_memo01

from .conftest import INTERVAL, LIVENESS
from .planted_memo01_broker import PLANTS

pytestmark = [pytest.mark.io]

PLANTED = Path(__file__).with_name("planted_memo01_broker.py")


@pytest.fixture
def memo01_broker(start_broker: Callable[[list[str]], str], tmp_path: Path) -> Callable[[str], str]:
    """Start domo's broker with one memo01 plant (or ``none``); its nng+ipc:// endpoint."""

    def start(flaw: str) -> str:
        argv = [sys.executable, str(PLANTED), flaw, str(INTERVAL), str(LIVENESS), str(tmp_path)]
        return start_broker(argv)

    return start


@pytest.mark.parametrize("flaw", sorted(PLANTS))
def test_a_planted_memo01_mistake_is_found_by_its_rule(
    memo01_broker: Callable[[str], str], flaw: str
) -> None:
    _, rule = PLANTS[flaw]
    url = memo01_broker(flaw).removeprefix("nng+")
    result = fuzz_memo01(url, scenarios=200, seed=1, time_budget=30, stop_after=(rule,))
    found = {f.rule: f for f in result.findings}
    assert rule in found, result.findings
    assert found[rule].steps[0].kind == "setup"
    clean = memo01_broker("none").removeprefix("nng+")
    assert rule not in [v.rule for v in replay_memo01(clean, found[rule].steps)]


def test_domo_fuzz_memo01_saves_and_replays_a_finding(
    memo01_broker: Callable[[str], str], tmp_path: Path
) -> None:
    endpoint = memo01_broker("stale-no-disconnect")
    found = subprocess.run(
        [sys.executable, "-m", "domo", "fuzz", "--dialect", "memo01", endpoint, "--seed", "1",
         "--time-budget", "20", "--first", "--findings-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert found.returncode == EXIT_FINDINGS, found.stdout + found.stderr
    assert "rule coverage (judged/held): MEMO-" in found.stdout
    replay = tmp_path / "broker-memo01-MEMO-10.json"
    assert replay.is_file(), found.stdout
    again = subprocess.run(
        [sys.executable, "-m", "domo", "fuzz", "--replay", str(replay), endpoint],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert again.returncode == EXIT_FINDINGS, again.stdout + again.stderr
