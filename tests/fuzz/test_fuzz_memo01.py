"""`domo fuzz --dialect memo01` against a planted memo01 broker (in a process of its own): a
finding is saved and its plan replays. Every plant is searched for by the planted suite's short
form (``test_planted_search.py``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pynng")
pytest.importorskip("cbor2")

from domo.cli import EXIT_FINDINGS

from .conftest import INTERVAL, LIVENESS

pytestmark = [pytest.mark.io]

PLANTED = Path(__file__).with_name("planted_memo01_broker.py")


@pytest.fixture
def memo01_broker(start_broker: Callable[[list[str]], str], tmp_path: Path) -> Callable[[str], str]:
    """Start domo's broker with one memo01 plant (or ``none``); its nng+ipc:// endpoint."""

    def start(flaw: str) -> str:
        argv = [sys.executable, str(PLANTED), flaw, str(INTERVAL), str(LIVENESS), str(tmp_path)]
        return start_broker(argv)

    return start


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
