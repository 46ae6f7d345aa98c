"""`domo fuzz` as typed: exit codes, the printed finding, the replay file and --replay."""

from __future__ import annotations

import os
import re
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


def test_finds_replays_and_exits_7(planted: Callable[[str], str], tmp_path: Path) -> None:
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
    assert found.returncode == 7, found.stderr
    assert "MDP-W-13:" in found.stdout
    assert "scenario:" in found.stdout
    assert "\r" not in found.stderr  # stderr is a pipe here: no progress line for a log
    assert "examples, " not in found.stderr
    replay_file = tmp_path / "broker-MDP-W-13.json"
    again = _domo("fuzz", endpoint, "--replay", str(replay_file))
    assert again.returncode == 7, again.stderr
    assert "MDP-W-13:" in again.stdout


def test_unreachable_and_usage_errors(tmp_path: Path) -> None:
    unreachable = _domo("fuzz", "tcp://127.0.0.1:9", "--heartbeat-interval", "0.1")
    assert unreachable.returncode == 9
    assert "unreachable" in unreachable.stderr
    missing = _domo("fuzz", "tcp://127.0.0.1:9", "--replay", str(tmp_path / "none.json"))
    assert missing.returncode == 2
    assert _domo("fuzz", "not-an-endpoint").returncode == 2


def test_worker_target_with_exec_finds_and_replays(tmp_path: Path) -> None:
    """`domo fuzz --target worker --exec CMD` as typed: it binds, starts the worker, finds the
    planted flaw, exits 7; the replay file runs again with --replay and the same --exec."""
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
    assert found.returncode == 7, found.stderr
    assert "MDP-R-01:" in found.stdout
    assert "domo fuzz: worker:" in found.stdout
    replay_file = tmp_path / "worker-MDP-R-01.json"
    # The hint names the endpoint and command the run used, ready to paste.
    assert f"replay: domo fuzz --replay {replay_file} tcp://127.0.0.1:0 --exec '{command}'" in (
        found.stdout
    )
    # The file says which target it is for: no --target needed.
    again = _domo("fuzz", *common[2:], "--replay", str(replay_file))
    assert again.returncode == 7, again.stderr
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
    assert exits.returncode == 9
    assert "no MDP/0.2 worker: 'true' exited with code 0" in exits.stderr


def test_fresh_seed_coverage_and_timing_are_printed(
    planted: Callable[[str], str], tmp_path: Path
) -> None:
    """Without --seed each run draws a fresh seed and prints it; the summary gives the seconds
    until each finding, scenarios per second and the rule coverage."""
    endpoint = planted("ignore-disconnect")
    argv = ["fuzz", endpoint, "--heartbeat-interval", str(INTERVAL), "--time-budget", "4"]
    runs = [_domo(*argv, "--findings-dir", str(tmp_path)) for _ in range(2)]
    seeds = []
    for run in runs:
        assert run.returncode in (0, 7), run.stderr
        match = re.search(r"domo fuzz: seed (\d+) \(--seed \1 repeats this search\)", run.stderr)
        assert match, run.stderr
        seeds.append(match.group(1))
        assert f"seed {match.group(1)};" in run.stdout
        assert re.search(r"scenarios in [\d.]+ s \([\d.]+/s\)", run.stdout), run.stdout
        # Per rule: in how many scenarios a check judged it, and in how many it held.
        coverage = (
            r"rule coverage \(judged/held\): (MDP-[A-Z]-\d\d \d+/\d+, )*MDP-[A-Z]-\d\d \d+/\d+\n"
        )
        assert re.search(coverage, run.stdout), run.stdout
    assert seeds[0] != seeds[1]
    found = [run for run in runs if "MDP-W-13:" in run.stdout]
    for run in found:
        assert re.search(r"MDP-W-13: .* \(after [\d.]+ s\)", run.stdout), run.stdout
        assert re.search(r"MDP-W-13 after [\d.]+ s", run.stdout), run.stdout


def test_replay_uses_the_files_interval_without_warning(
    planted: Callable[[str], str], tmp_path: Path
) -> None:
    """--replay runs at the file's interval: no warning about the default 2.5 s."""
    path = tmp_path / "scenario.json"
    save_replay(path, Replay("broker", INTERVAL, 3, [Step("wait", 0, 1)]))
    again = _domo("fuzz", planted("none"), "--replay", str(path))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "makes every scenario slow" not in again.stderr


def test_the_intervals_differ(start_broker: Callable[[list[str]], str], tmp_path: Path) -> None:
    """A conforming broker at another interval than the fuzzer's is told as such, not as a
    scenario breaking MDP-H-04 (issue 11)."""
    endpoint = start_broker(
        [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
         "--heartbeat-interval", "0.5", "--log-level", "error"]
    )  # fmt: skip
    run = _domo(
        "fuzz", endpoint, "--heartbeat-interval", str(INTERVAL), "--time-budget", "5",
        "--findings-dir", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 7, run.stdout + run.stderr
    assert re.search(r"the intervals differ: broker 0\.\d+ s, fuzzer 0\.1 s", run.stdout), (
        run.stdout
    )
    assert "scenario:" not in run.stdout
    assert run.stdout.count("the intervals differ") == 1, run.stdout


def test_missing_hypothesis_error_has_the_prefix(tmp_path: Path) -> None:
    """Without Hypothesis, the error says which command it comes from (issue 11 item 10)."""
    blocker = tmp_path / "hypothesis.py"
    blocker.write_text("raise ImportError('hypothesis blocked for this test')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    run = subprocess.run(
        [sys.executable, "-m", "domo", "fuzz", "tcp://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.startswith("domo fuzz: needs hypothesis"), run.stderr
