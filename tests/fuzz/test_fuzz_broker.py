"""The broker fuzzer against domo's own broker (finds nothing) and planted wrong brokers."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from domo.fuzz import (
    FuzzOptions,
    Replay,
    Step,
    fuzz_broker,
    load_replay,
    replay_broker,
    save_replay,
)
from domo.fuzz.broker_target import BrokerRun, Timing, _Scenario

from .conftest import INTERVAL, LIVENESS


def _options(endpoint: str, tmp_path: Path, **kw: object) -> FuzzOptions:
    values: dict[str, object] = {
        "heartbeat_interval": INTERVAL,
        "liveness": LIVENESS,
        "examples": 40,
        "max_steps": 10,
        "time_budget": 10.0,
        "seed": 4,
        "findings_dir": tmp_path,
    }
    values.update(kw)
    return FuzzOptions(endpoint, **values)  # type: ignore[arg-type]


def test_domo_broker_conforms(start_broker: Callable[[list[str]], str], tmp_path: Path) -> None:
    """`domo broker` run as a newcomer would, with a short interval: nothing found."""
    endpoint = start_broker(
        [
            sys.executable,
            "-m",
            "domo",
            "broker",
            "--bind",
            "tcp://127.0.0.1:0",
            "--heartbeat-interval",
            str(INTERVAL),
            "--liveness",
            str(LIVENESS),
            "--log-level",
            "error",
        ]
    )
    # domo's broker gives a request to the worker idle the longest: judged too (MDP-A-04).
    options = _options(endpoint, tmp_path, examples=12, dispatch="lru")
    result = fuzz_broker(options, progress=None)
    assert result.examples >= 1
    assert result.findings == []
    assert "MDP-A-04" in result.judged


def test_replay_file_runs_again(
    planted: Callable[[str], str], start_broker: Callable[[list[str]], str], tmp_path: Path
) -> None:
    """A saved scenario runs again: the flaw shows, domo's broker passes the same steps."""
    steps = [Step("ready", 0, 1), Step("wait", 0, 3), Step("disconnect", 0), Step("wait", 0, 4)]
    path = tmp_path / "scenario.json"
    save_replay(path, Replay("broker", INTERVAL, LIVENESS, steps, "MDP-W-13"))
    replay = load_replay(path)
    assert replay.steps == steps
    assert [v.rule for v in replay_broker(planted("ignore-disconnect"), replay)] == ["MDP-W-13"]
    assert replay_broker(planted("none"), replay) == []


def test_control_planted_broker_conforms(planted: Callable[[str], str], tmp_path: Path) -> None:
    """The planted-broker harness with no flaw is clean, so the flaws alone are caught."""
    result = fuzz_broker(_options(planted("none"), tmp_path, examples=10), progress=None)
    assert result.findings == []


def test_a_worker_silent_near_its_expiry_is_not_judged(
    start_broker: Callable[[list[str]], str],
) -> None:
    """The fuzzer judges from the silence it actually produced: its own process stalled past a
    worker's expiry (a real sleep, as a CPU hog would), so the broker may have expired the
    worker, and READY from it again may be a new registration: no MDP-W-15 (nor any other)."""
    endpoint = start_broker(
        [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
         "--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS),
         "--log-level", "error"]
    )  # fmt: skip
    run = BrokerRun(endpoint, Timing(INTERVAL, LIVENESS))
    try:
        # Every wait here is bounded (the probes' timeouts, the scenario's windows).
        assert run.first_probe() == []
        scenario = _Scenario(run, "stall")
        scenario.do(Step("ready", 0, 0))
        scenario.pump(time.monotonic() + 2 * INTERVAL)
        time.sleep(LIVENESS * INTERVAL + 2 * INTERVAL)  # the fuzzer starved: no heartbeats
        scenario.do(Step("unexpected", 0, 0))  # READY again, or anew after an expiry
        assert scenario.play([]) == []
    finally:
        run.close()
