"""The table generator of conformance/run.py, on a hand-made record: no network, no majortomo."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

RUN_PY = Path(__file__).resolve().parent.parent / "conformance" / "run.py"


@pytest.fixture(scope="module")
def run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_run", RUN_PY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _record() -> dict[str, Any]:
    finding = {
        "rule": "MDP-H-04",
        "explanation": "w0 heard nothing | not even a HEARTBEAT",
        "scenario": ["w0: connect a new socket, READY s0", "wait 6/2 heartbeat intervals"],
        "replay_file": "broker-MDP-H-04.json",
    }
    return {
        "date": "2026-01-02",
        "settings": {
            "seed": 1,
            "time_budget": 60.0,
            "examples": 100,
            "heartbeat_interval": 0.1,
            "liveness": 3,
            "client_timeout": 1.0,
            "majortomo": "0.2.0",
        },
        "machine": {
            "cpus": 2,
            "cpu": "a CPU",
            "python": "3.11.7",
            "pyzmq": "27",
            "libzmq": "4.3.5",
            "domo_commit": "abc1234",
        },
        "runs": [
            {
                "system": "majortomo",
                "target": "broker",
                "status": "ran",
                "exit_code": 7,
                "outcome": "rules broken",
                "examples": 7,
                "seconds": 12.5,
                "stderr_tail": [],
                "findings": [finding],
            },
            {
                "system": "majortomo",
                "target": "client",
                "status": "ran",
                "exit_code": 9,
                "outcome": "unreachable",
                "examples": None,
                "seconds": 2.0,
                "stderr_tail": ["domo fuzz: target unreachable: no client"],
                "findings": [],
            },
            {
                "system": "majortomo",
                "target": "worker",
                "status": "ran",
                "exit_code": 7,
                "outcome": "rules broken",
                "examples": 0,
                "seconds": 10.5,
                "stderr_tail": [],
                "notes": ["domo fuzz: no scenario could run: no worker sent READY"],
                "findings": [{**finding, "rule": "MDP-W-08", "scenario": []}],
            },
            {
                "system": "domo",
                "target": "worker",
                "status": "not run",
                "reason": "domo fuzz refused it: invalid choice: 'worker'",
            },
        ],
    }


def test_render_lists_every_run_finding_and_scenario(run: ModuleType) -> None:
    section = run.render(json.loads(json.dumps(_record())))  # what a saved record reads back as
    lines = section.splitlines()
    assert "| majortomo | broker | rules broken (exit 7) | 7 | 12.5 | MDP-H-04 |" in lines
    assert "| majortomo | client | unreachable (exit 9) | ? | 2 | none |" in lines
    assert any(line.startswith("| domo | worker | not run: domo fuzz refused it") for line in lines)
    # a "|" inside an explanation must not split the table's cell
    assert "| majortomo | broker | MDP-H-04 | w0 heard nothing \\| not even a HEARTBEAT |" in lines
    assert "domo fuzz: target unreachable: no client" in lines  # why exit 9, from stderr
    assert "1. w0: connect a new socket, READY s0" in lines
    assert "2. wait 6/2 heartbeat intervals" in lines
    assert "(no steps: seen before any scenario ran)" in lines
    assert "majortomo worker: `domo fuzz: no scenario could run: no worker sent READY`" in lines
    assert "seed 1" in section
    assert "abc1234" in section


def test_replace_section_keeps_the_prose_and_is_idempotent(run: ModuleType) -> None:
    doc = f"# Title\n\nbefore\n\n{run.BEGIN}\nold table\n{run.END}\n\nafter\n"
    once = run.replace_section(doc, "new table")
    assert once == f"# Title\n\nbefore\n\n{run.BEGIN}\nnew table\n{run.END}\n\nafter\n"
    assert run.replace_section(once, "new table") == once


def test_replace_section_refuses_a_document_without_markers(run: ModuleType) -> None:
    with pytest.raises(ValueError, match="markers"):
        run.replace_section("# no markers here\n", "table")
    with pytest.raises(ValueError, match="markers"):
        run.replace_section(f"{run.END}\n{run.BEGIN}\n", "table")


def test_read_findings_takes_rule_explanation_and_readable_steps(
    run: ModuleType, tmp_path: Path
) -> None:
    replay = {
        "format": "domo-fuzz-replay/1",
        "target": "worker",
        "rule": "MDP-W-09",
        "explanation": "HEARTBEAT before READY",
        "steps": [["request", 0, 1]],
        "readable": ["send a REQUEST"],
    }
    (tmp_path / "worker-MDP-W-09.json").write_text(json.dumps(replay))
    (tmp_path / "broker-MDP-A-01.json").write_text(json.dumps(replay))  # another target's
    found = run.read_findings(tmp_path, "worker")
    assert found == [
        {
            "rule": "MDP-W-09",
            "explanation": "HEARTBEAT before READY",
            "scenario": ["send a REQUEST"],
            "replay_file": "worker-MDP-W-09.json",
        }
    ]


def test_a_broker_fuzzed_in_another_dialect_is_named_so(run: ModuleType) -> None:
    record = _record()
    dialect_run = {**record["runs"][0], "dialect": "majortomo"}
    record["runs"] = [record["runs"][0], dialect_run]
    lines = run.render(record).splitlines()
    assert "| majortomo | broker | rules broken (exit 7) | 7 | 12.5 | MDP-H-04 |" in lines
    assert (
        "| majortomo | broker (majortomo dialect) | rules broken (exit 7) | 7 | 12.5 | MDP-H-04 |"
        in lines
    )
    assert "**majortomo broker (majortomo dialect), MDP-H-04**, shrunk scenario:" in lines
