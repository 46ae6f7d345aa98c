"""``domo report``'s figures against the same figures computed exactly in plain Python.

The traces are the benchmark's synthetic ones (``benchmarks/_gen_traces.py``, 20,000 requests
over 20 services, with expiries, re-dispatches and drops): counts must match exactly and each
percentile must be within 0.5 % of the exact nearest-rank percentile.
"""

from __future__ import annotations

import importlib.util
import io
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from domo import report

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: domo[spark]")
GENERATOR = Path(__file__).parents[2] / "benchmarks" / "_gen_traces.py"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("_gen_traces", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_report_matches_exact_figures(spark: Any, tmp_path: Path) -> None:
    pytest.importorskip("numpy", reason="numpy comes with domo[spark]")
    traces, out = tmp_path / "traces", tmp_path / "out"
    _generator().generate(traces, 20_000, seed=7)
    assert report.run(traces, out=out, stdout=io.StringIO()) == report.EXIT_OK

    rows = pq.read_table(sorted(traces.glob("requests-*.parquet"))).to_pylist()
    services = {row["service"]: row for row in pq.read_table(out / "services.parquet").to_pylist()}
    by_service: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_service[row["service"]].append(row)
        by_service[None].append(row)
    assert set(services) == set(by_service)
    for name, records in by_service.items():
        got = services[name]
        outcomes = Counter(record["outcome"] for record in records)
        assert got["requests"] == len(records)
        assert (got["completed"], got["expired"], got["dropped"]) == (
            outcomes["completed"],
            outcomes["expired"],
            outcomes["dropped"],
        )
        assert got["redispatches"] == sum(record["redispatches"] for record in records)
        figures = {
            "latency": [r["finished"] - r["received"] for r in records],
            "queue_wait": [sum(r["queue_waits"]) for r in records if r["queue_waits"]],
            "service_time": [
                r["finished"] - r["dispatches"][-1] for r in records if r["outcome"] == "completed"
            ],
        }
        for metric, values in figures.items():
            for q in (0.5, 0.95, 0.99):
                exact = _exact(values, q)
                assert got[f"{metric}_p{round(q * 100)}"] == pytest.approx(exact, rel=0.005)

    drops = pq.read_table(out / "drops.parquet").to_pylist()
    expected = Counter((r["service"], r["drop_reason"]) for r in rows if r["outcome"] == "dropped")
    assert {(d["service"], d["drop_reason"]): d["count"] for d in drops} == expected

    workers = pq.read_table(out / "workers.parquet").to_pylist()
    attempts: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    for r in rows:
        for position, worker in enumerate(r["workers"]):
            attempts[worker.hex()] += 1
            lost[worker.hex()] += position < len(r["workers"]) - 1
    assert {w["worker"]: w["attempts"] for w in workers} == dict(attempts)
    assert {w["worker"]: w["lost"] for w in workers} == dict(lost)
    throughput = pq.read_table(out / "throughput.parquet").to_pylist()
    assert sum(t["completed"] for t in throughput) == services[None]["completed"]
