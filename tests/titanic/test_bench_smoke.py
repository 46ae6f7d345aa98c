"""benchmarks/titanic_bench.py runs and reports (TSP-R-02: 9/TSP sets no performance figure,
so ours are measured beside plain requests, in the same run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_titanic_benchmark_runs_quick_and_checks_its_replies(tmp_path: Path) -> None:
    out = tmp_path / "titanic.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "titanic_bench.py"),
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    [row] = result["reps"]
    assert result["synchronous"] == "normal"
    for kind in ("plain", "durable", "batch"):
        assert row[f"{kind}_per_s"] > 0
        assert row[f"{kind}_p50_ms"] > 0
    assert row["durable_cpu_us_titanic"] > row["plain_cpu_us_titanic"]
    assert "durable/plain" in done.stdout
