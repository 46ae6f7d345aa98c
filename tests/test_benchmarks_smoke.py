"""benchmarks/core.py still runs: every case, its own correctness checks, the table and the JSON.

The numbers themselves are not judged here (CI machines are shared and noisy); ``nox -s bench``
is where they are read. What this catches is a benchmark that no longer runs against the core,
or whose checks of the core's replies fail.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "core.py"
CASES = [
    "broker: request cycle, 100 workers, 10 services",
    "family broker: request cycle, MDP/0.2",
    "family broker: request cycle, MDP/0.1 REQ clients",
    "family broker: request cycle, DCP clients",
    "broker: tick, 10,000 idle workers, nothing due",
    "broker: heartbeat round, 10,000 workers due",
    "worker session: REQUEST in, FINAL out",
    "worker session: HEARTBEAT in",
    "client session: REQUEST out, FINAL in",
]
HEADER = "benchmark per cpu median cpu min-max wall median reps"
NUMBER = r"(\d+\.\d{3})"
ROW = re.compile(
    rf"^(?P<name>.+?)\s{{2,}}(?P<unit>\w+)\s+{NUMBER} us\s+{NUMBER}-{NUMBER}\s+{NUMBER} us\s+2$"
)


def test_core_benchmark_quick_run(tmp_path: Path) -> None:
    record_path = tmp_path / "core.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--reps", "2", "--json", str(record_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == HEADER.split()
    assert set(lines[1]) <= {"-", " "}
    rows = [ROW.match(line) for line in lines[2:]]
    assert all(rows), f"rows not in the expected format:\n{done.stdout}"
    assert [m.group("name") for m in rows if m] == CASES

    record = json.loads(record_path.read_text(encoding="utf-8"))
    assert record["quick"] is True
    results = record["results"]
    assert [r["name"] for r in results] == CASES
    for match, result in zip(rows, results, strict=True):
        assert match is not None
        cpu = result["cpu"]
        assert result["reps"] == 2
        assert result["unit"] == match.group("unit")
        assert 0 < cpu["min_us"] <= cpu["median_us"] <= cpu["max_us"]
        assert f"{cpu['median_us']:.3f}" == match.group(3)
        assert f"{cpu['min_us']:.3f}" == match.group(4)
        assert f"{cpu['max_us']:.3f}" == match.group(5)
