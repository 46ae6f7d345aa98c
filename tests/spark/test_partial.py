"""The fold of ``domo report`` (``report._partial``) without Spark: any split merges the same.

This is what lets a cluster, a Connect server and local mode give exactly the same report:
the partial aggregates of any cut of the records, folded in any chunks and merged in any order,
are equal, table for table, to the partial of all the records at once; and each table says
what plain Python says of the records.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest

from .conftest import generate_traces

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed: domo[spark]")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: domo[spark]")
pytest.importorskip("numpy", reason="numpy comes with domo[spark]")

from domo.report import _analyse, _partial  # noqa: E402  (needs pyarrow)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    directory = generate_traces(
        tmp_path_factory.mktemp("fold"), 30_000, dialects=("mdp02", "emqp"), per_file=5_000
    )
    return sorted(directory.glob("requests-*.parquet"))


def _equal(left: _partial.Partial, right: _partial.Partial) -> None:
    for name, table in left.tables().items():
        assert table.to_pylist() == right.tables()[name].to_pylist(), name


def test_any_split_and_order_merges_to_the_same_partial(files: list[Path]) -> None:
    window = _partial.Window()
    whole = _partial.compute([pq.read_table(files)], window, 10)
    rng = random.Random(5)
    for _ in range(3):
        order = files[:]
        rng.shuffle(order)
        cut = rng.randint(1, len(order) - 1)
        parts = [_partial.read([str(p) for p in order[:cut]], window, 10)]
        # the rest in uneven chunks of records, merged in reverse
        table = pq.read_table(order[cut:])
        size = rng.randint(700, 4000)
        chunks = [table.slice(start, size) for start in range(0, table.num_rows, size)]
        parts += [_partial.compute([chunk], window, 10) for chunk in reversed(chunks)]
        rng.shuffle(parts)
        _equal(_partial.merge(parts), whole)
        # and through the encoding a Spark task hands the driver
        pairs = [pair for part in parts for pair in _partial.encode(part)]
        _equal(_partial.collect(pairs, 10), whole)


def test_the_tables_say_what_the_records_say(files: list[Path]) -> None:
    rows = pq.read_table(files).to_pylist()
    partial = _partial.read([str(path) for path in files], _partial.Window(), 5)
    counts = Counter(
        (r["dialect"], r["service"], r["outcome"], r["drop_reason"], r["rule"]) for r in rows
    )
    assert {
        (c["dialect"], c["service"], c["outcome"], c["drop_reason"], c["rule"]): c["count"]
        for c in partial.counts.to_pylist()
    } == dict(counts)
    assert {c["rule"] for c in partial.counts.to_pylist() if c["outcome"] == "dropped"} == {
        "MDP-D-08"
    }
    busy: Counter[tuple[str, bytes]] = Counter()
    for r in rows:
        for position, worker in enumerate(r["workers"]):
            last = position == len(r["dispatches"]) - 1
            end = (
                r["finished"]
                if last
                else r["dispatches"][position + 1] - r["queue_waits"][position + 1]
            )
            busy[(r["service"], worker)] += round((end - r["dispatches"][position]) * 1e9)
    assert {(w["service"], w["worker"]): w["busy_ns"] for w in partial.workers.to_pylist()} == (
        dict(busy)
    )
    assert len(partial.workers) == len(busy)  # one row a worker, whatever its clients spoke
    latency = sorted(((r["finished"] - r["received"]), -r["request_id"]) for r in rows)
    assert [s["request_id"] for s in partial.slowest.to_pylist()] == [
        -key for _, key in reversed(latency[-5:])
    ]
    histogram_total = sum(h["count"] for h in partial.histograms.to_pylist() if h["metric"] == 2)
    assert histogram_total == len(rows)


def test_the_window_is_the_records_received_in_it(files: list[Path]) -> None:
    table = pq.read_table(files)
    start = min(
        a + r
        for a, r in zip(
            table["wall_anchor"].to_pylist(), table["received"].to_pylist(), strict=True
        )
    )
    since, until = start + 3.0, start + 9.0
    window = _partial.Window(since, until, ("svc.00", "svc.03"))
    got = _partial.compute([table], window, 10)
    kept = [
        r
        for r in table.to_pylist()
        if since <= r["wall_anchor"] + r["received"] < until and r["service"] in window.services
    ]
    assert kept
    _equal(
        got,
        _partial.compute([pa.Table.from_pylist(kept, schema=table.schema)], _partial.Window(), 10),
    )


def test_percentiles_of_a_histogram_are_within_half_a_percent() -> None:
    rng = random.Random(9)
    values = [rng.lognormvariate(-5, 1.2) for _ in range(5000)]
    histogram: dict[int, int] = {}
    for value in values:
        bucket = math.floor(math.log(value) / _partial.STEP)
        histogram[bucket] = histogram.get(bucket, 0) + 1
    ordered = sorted(values)
    for q in (0.5, 0.95, 0.99):
        exact = ordered[max(1, math.ceil(q * len(values))) - 1]
        got = _analyse.percentile(histogram, q)
        assert got is not None
        assert abs(got / exact - 1) <= 0.005


def test_shares_balance_the_records_and_depend_on_nothing_else() -> None:
    files = [(f"f{index}", rows) for index, rows in enumerate([9, 1, 5, 5, 3, 8, 2, 7])]
    cut = _analyse.shares(files, 3)
    assert cut == _analyse.shares(list(reversed(files)), 3)
    loads = sorted(sum(dict(files)[path] for path in share) for share in cut)
    assert loads == [13, 13, 14]
    assert sorted(path for share in cut for path in share) == sorted(path for path, _ in files)
    assert _analyse.shares(files[:2], 5) == [["f0"], ["f1"]]  # never an empty share
