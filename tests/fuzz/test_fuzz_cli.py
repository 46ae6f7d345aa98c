"""`domo fuzz` as typed: exit codes, the printed finding, the replay file and --replay."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from domo.fuzz import Replay, Step, save_replay

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
        "20",
        "--seed",
        "1",
        "--first",
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


def test_worker_target_with_exec_finds_and_replays(tmp_path: Path) -> None:
    """`domo fuzz --target worker --exec CMD` as typed: it binds, starts the worker, finds the
    planted flaw, exits 1; the replay file runs again with --replay and the same --exec."""
    planted = Path(__file__).with_name("planted_peers.py")
    command = f"{sys.executable} {planted} worker final-without-request {{endpoint}} {INTERVAL} 3"
    common = ["--target", "worker", "tcp://127.0.0.1:0", "--exec", command]
    found = _domo(
        "fuzz",
        *common,
        "--heartbeat-interval",
        str(INTERVAL),
        "--time-budget",
        "5",
        "--first",
        "--findings-dir",
        str(tmp_path),
    )
    assert found.returncode == 1, found.stderr
    assert "MDP-R-01:" in found.stdout
    assert "domo fuzz: worker:" in found.stdout
    replay_file = tmp_path / "worker-MDP-R-01.json"
    assert f"replay: domo fuzz --replay {replay_file} ENDPOINT [--exec CMD]" in found.stdout
    # The file says which target it is for: no --target needed.
    again = _domo("fuzz", *common[2:], "--replay", str(replay_file))
    assert again.returncode == 1, again.stderr
    assert "MDP-R-01:" in again.stdout


def test_peer_target_usage_errors(tmp_path: Path) -> None:
    """--exec only for a worker or client; a command that cannot start; nobody connecting."""
    broker_exec = _domo("fuzz", "tcp://127.0.0.1:9", "--exec", "true")
    assert broker_exec.returncode == 2
    assert "--exec starts a worker or client" in broker_exec.stderr
    broker_file = tmp_path / "broker.json"
    save_replay(broker_file, Replay("broker", INTERVAL, 3, [Step("wait", 0, 1)]))
    replay_exec = _domo("fuzz", "tcp://127.0.0.1:9", "--replay", str(broker_file), "--exec", "x")
    assert replay_exec.returncode == 2
    assert "is a broker scenario; --exec starts a worker or client" in replay_exec.stderr
    missing = _domo("fuzz", "--target", "client", "tcp://127.0.0.1:0", "--exec", "no-such-cmd-x")
    assert missing.returncode == 5
    assert "cannot start 'no-such-cmd-x'" in missing.stderr
    exits = _domo(
        "fuzz", "--target", "worker", "tcp://127.0.0.1:0", "--exec", "true",
        "--heartbeat-interval", "0.1",
    )  # fmt: skip
    assert exits.returncode == 3
    assert "no MDP/0.2 worker: 'true' exited with code 0" in exits.stderr
