"""`domo fuzz` as typed: exit codes, the printed finding, the replay file and --replay."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .conftest import INTERVAL


def _domo(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "domo", *argv], capture_output=True, text=True, timeout=60
    )


def test_finds_replays_and_exits_1(planted: Callable[[str], str], tmp_path: Path) -> None:
    endpoint = planted("ignore-disconnect")
    common = ["--heartbeat-interval", str(INTERVAL), "--liveness", "3"]
    found = _domo(
        "fuzz",
        endpoint,
        *common,
        "--examples",
        "40",
        "--time-budget",
        "10",
        "--seed",
        "4",
        "--findings-dir",
        str(tmp_path),
    )
    assert found.returncode == 1, found.stderr
    assert "MDP-W-13:" in found.stdout
    assert "scenario:" in found.stdout
    replay_file = tmp_path / "broker-MDP-W-13.json"
    again = _domo("fuzz", endpoint, "--replay", str(replay_file))
    assert again.returncode == 1, again.stderr
    assert "MDP-W-13:" in again.stdout


def test_unreachable_and_usage_errors(tmp_path: Path) -> None:
    unreachable = _domo("fuzz", "tcp://127.0.0.1:9", "--heartbeat-interval", "0.1")
    assert unreachable.returncode == 3
    assert "unreachable" in unreachable.stderr
    missing = _domo("fuzz", "tcp://127.0.0.1:9", "--replay", str(tmp_path / "none.json"))
    assert missing.returncode == 2
    assert _domo("fuzz", "not-an-endpoint").returncode == 2
