"""benchmarks/scale.py and heartbeat_sim.py --quick run end to end: real processes, real core.

No number is judged (CI machines are shared and noisy). What this catches: a scale benchmark
whose broker no longer starts or says its room for peers, whose idle workers no longer all
register, whose clients are not all answered, or a simulation whose virtual workers expire.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scale_benchmark_quick_run(tmp_path: Path) -> None:
    record_path = tmp_path / "scale.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scale.py"),
            "--quick",
            "--json",
            str(record_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(record_path.read_text(encoding="utf-8"))
    workers = record["workers"]
    assert workers["room"] > 100
    assert [(s["workers"], s["registered"]) for s in workers["steps"]] == [(50, 50), (100, 100)]
    for step in workers["steps"]:
        assert step["broker_cpu_percent"] >= 0
        assert step["broker_rss_bytes"] > 0
    assert record["clients"]["answered"] == record["clients"]["clients"] == 300


def test_heartbeat_simulation_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "heartbeat_sim.py"),
            "--quick",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text(encoding="utf-8"))["results"]
    assert [r["workers"] for r in results] == [1000, 2000]
    for r in results:
        # Every worker heartbeated once an interval, and the broker answered each one.
        assert r["heartbeats_in"] >= r["workers"]
        assert r["heartbeats_out"] >= r["workers"]
        assert 0 < r["core_bytes_per_worker"] < 4096
