"""The Spark side of ``domo report``: trace files in, the report's tables out.

Spark runs one task per share of the request files (``fold``): each task reads its files with
pyarrow and folds them into a ``_partial.Partial``, which goes back to the driver as a few Arrow
IPC blobs; the driver merges them and turns the sums into the report (``finish``). The fold is
vectorised (numpy, integer group codes), about four times less CPU than the same figures as
Spark SQL jobs over the same files (docs/performance.md), and it merges by addition, so a report
is the same whatever the master, the split or the tasks Spark ran again.

Times are wall-clock seconds (``wall_anchor`` added), durations seconds. Definitions
(docs/report.md): queue wait is the sum of a request's ``queue_waits`` (all its dispatches; none
if never dispatched); service time is ``finished - dispatches[-1]`` of a completed request;
latency is ``finished - received``. A worker's busy time is the sum of its attempts, each from its
dispatch to the request's end or to the moment it went back to the queue (the next dispatch minus
that dispatch's queue wait); utilisation is busy time over the time the worker was there
(registered to gone, clipped to the report's window).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from . import _partial
from ._partial import METRICS, STEP, ZERO_BUCKET, Partial, Window

PERCENTILES: Final = (0.5, 0.95, 0.99)
STEPS: Final = 3  # calls of ``step`` in ``analyse``, for the progress line
MAX_BUCKETS: Final = 120
NICE_WIDTHS: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
TASKS_PER_CORE: Final = 4  # shares of the files per core: balance, and little to redo on a loss


@dataclass
class Filters:
    """Which requests a report covers: received in ``[since, until)``, of these services."""

    since: float | None = None
    until: float | None = None
    services: list[str] = field(default_factory=list)

    def window(self) -> Window:
        return Window(self.since, self.until, tuple(self.services))


@dataclass
class Report:
    """Everything a report shows; each table is a list of plain dicts (rows).

    Every row has a ``dialect``. ``services`` lists one row per (dialect, service); when the
    traces hold more than one dialect, each dialect's rows end with its subtotal (service None);
    the last row is the total over everything (dialect and service None).
    """

    files: int
    corrupt: list[tuple[str, str]]
    window: tuple[float, float]
    bucket: float
    services: list[dict[str, Any]]
    workers: list[dict[str, Any]]
    throughput: list[dict[str, Any]]
    drops: list[dict[str, Any]]
    slowest: list[dict[str, Any]]
    dialects: list[str | None] = field(default_factory=list)
    updated: float | None = None  # when the report was made (wall clock)
    refresh: float | None = None  # a live page (--follow): reloads itself every this many s


class NoRequests(Exception):
    """No request record in the files (after the filters)."""


def bucket_width(span: float) -> float:
    """A round width (seconds) that cuts ``span`` into at most ``MAX_BUCKETS`` buckets."""
    for width in NICE_WIDTHS:
        if span / width <= MAX_BUCKETS:
            return float(width)
    return float(math.ceil(span / MAX_BUCKETS))


Histogram = dict[int, int]  # bucket -> count


def percentile(histogram: Histogram, q: float) -> float | None:
    """The nearest-rank ``q`` percentile of a bucket histogram (None if it is empty)."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return 0.0 if bucket == ZERO_BUCKET else math.exp((bucket + 0.5) * STEP)
    raise AssertionError("unreachable: the ranks add up to the total")


def _put_percentiles(row: dict[str, Any], name: str, histogram: Histogram) -> None:
    for q in PERCENTILES:
        row[f"{name}_p{round(q * 100)}"] = percentile(histogram, q)


# --- Spark: the fold ---------------------------------------------------------------------------


def shares(files: Sequence[tuple[str, int]], tasks: int) -> list[list[str]]:
    """``files`` ((path, records) pairs) cut into ``tasks`` shares of about as many records.

    Largest first onto the lightest share (ties: the lower share), so the cut depends only on
    the files, never on timing.
    """
    loads = [0] * tasks
    cut: list[list[str]] = [[] for _ in range(tasks)]
    for path, rows in sorted(files, key=lambda item: (-item[1], item[0])):
        lightest = min(range(tasks), key=lambda index: (loads[index], index))
        cut[lightest].append(path)
        loads[lightest] += rows
    return [sorted(share) for share in cut if share]


def _task(
    cut: list[list[str]], window: Window, keep: int
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function Spark runs per task: share ids in, (kind, Arrow IPC) rows out.

    It closes over plain values only (it is pickled to the executors).
    """

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from domo.report import _partial

        for batch in batches:
            for share in batch.column(0).to_pylist():
                partial = _partial.read(cut[share], window, keep)
                kinds, blobs = zip(*_partial.encode(partial), strict=True)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(kinds, pa.string()), pa.array(blobs, pa.binary())],
                    names=["kind", "data"],
                )

    return run


def parallelism(spark: Any) -> int:
    """The cores Spark offers (``defaultParallelism``; 2 where it cannot say, as over Connect)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        try:
            return max(1, int(spark.conf.get("spark.default.parallelism", "2")))
        except Exception:
            return 2


def fold(
    spark: Any,
    files: Sequence[tuple[str, int]],
    window: Window,
    keep: int,
    tasks: int | None = None,
) -> Partial:
    """The merged partial of the request ``files`` ((path, records) pairs), folded by Spark."""
    count = tasks or parallelism(spark) * TASKS_PER_CORE
    cut = shares(files, max(1, min(count, len(files))))
    frame = spark.range(0, len(cut), 1, len(cut)).mapInArrow(
        _task(cut, window, keep), "kind string, data binary"
    )
    table = frame.toArrow()
    pairs = zip(table.column("kind").to_pylist(), table.column("data").to_pylist(), strict=True)
    return _partial.collect(pairs, keep)


# --- the driver: lifetimes and the report ------------------------------------------------------


def lifetimes(paths: Sequence[Path], services: Sequence[str]) -> dict[tuple[str, str], Any]:
    """(service, worker hex) -> registered, gone, expiries, disconnects, from worker records."""
    import pyarrow.parquet as pq

    found: dict[tuple[str, str], dict[str, Any]] = {}
    if not paths:
        return found
    columns = ["worker", "service", "change", "wall_anchor", "at"]
    table = pq.read_table([str(path) for path in paths], columns=columns)
    for row in table.to_pylist():
        if services and row["service"] not in services:
            continue
        key = (row["service"], bytes(row["worker"]).hex())
        life = found.setdefault(
            key, {"registered": None, "gone": None, "expiries": 0, "disconnects": 0}
        )
        at = row["wall_anchor"] + row["at"]
        if row["change"] == "registered":
            life["registered"] = at if life["registered"] is None else min(life["registered"], at)
        else:
            life["gone"] = at if life["gone"] is None else max(life["gone"], at)
            life["expiries"] += row["change"] == "expired"
            life["disconnects"] += row["change"] == "disconnected"
    return found


def analyse(
    spark: Any,
    request_files: Sequence[tuple[Path, int]],
    worker_files: Sequence[Path],
    filters: Filters,
    *,
    slowest: int = 10,
    step: Callable[[str], None] = lambda name: None,
) -> Report:
    """Fold ``request_files`` ((path, records) pairs) on Spark and make the report.

    ``step`` is told the name of each stage before it starts.
    """
    rows = sum(count for _, count in request_files)
    step(f"folding {rows:,} request records")
    partial = fold(
        spark, [(str(path), count) for path, count in request_files], filters.window(), slowest
    )
    step("worker lifetimes")
    lives = lifetimes(worker_files, filters.services)
    step("the report")
    return finish(
        partial,
        lives,
        filters,
        slowest=slowest,
        files=len(request_files) + len(worker_files),
    )


def finish(
    partial: Partial,
    lives: dict[tuple[str, str], Any],
    filters: Filters,
    *,
    slowest: int,
    files: int,
) -> Report:
    """The report of a merged partial; raises ``NoRequests`` if it holds no record."""
    import numpy as np
    import pyarrow as pa

    counts = partial.counts.to_pylist()
    if not counts:
        raise NoRequests("no request records" + (" match the filters" if _any(filters) else ""))
    dialects = sorted({row["dialect"] for row in counts}, key=str)
    split = len(dialects) > 1

    def levels(dialect: str | None, service: str | None) -> list[tuple[Any, Any]]:
        """The rows a record of (dialect, service) adds to: its own, its dialect's, the total."""
        keys = [(dialect, service), (None, None)]
        if split:
            keys.append((dialect, None))
        return keys

    counters = ("requests", "completed", "expired", "dropped", "redispatches")
    by_group: dict[tuple[Any, Any], dict[str, Any]] = {}
    drop_counts: dict[tuple[Any, Any, Any, Any], int] = {}
    for row in counts:
        for dialect, service in levels(row["dialect"], row["service"]):
            into = by_group.get((dialect, service))
            if into is None:
                into = by_group[(dialect, service)] = {
                    "dialect": dialect,
                    "service": service,
                    **dict.fromkeys(counters, 0),
                    "request_bytes": 0,
                    "reply_bytes": 0,
                    "first_received": row["first_received"],
                    "last_finished": row["last_finished"],
                }
            into["requests"] += row["count"]
            if row["outcome"] in ("completed", "expired", "dropped"):
                into[row["outcome"]] += row["count"]
            into["redispatches"] += row["redispatches"]
            into["request_bytes"] += row["request_bytes"]
            into["reply_bytes"] += row["reply_bytes"]
            into["first_received"] = min(into["first_received"], row["first_received"])
            into["last_finished"] = max(into["last_finished"], row["last_finished"])
        if row["outcome"] == "dropped":
            key = (row["dialect"], row["service"], row["drop_reason"], row["rule"])
            drop_counts[key] = drop_counts.get(key, 0) + row["count"]
    total = by_group[(None, None)]
    services = []
    for dialect in dialects:
        services += [
            by_group[key]
            for key in sorted(
                (key for key in by_group if key[0] == dialect and key[1] is not None),
                key=lambda key: str(key[1]),
            )
        ]
        if split:
            services.append(by_group[(dialect, None)])
    services.append(total)
    drops = [
        {"dialect": dialect, "service": service, "drop_reason": reason, "rule": rule, "count": n}
        for (dialect, service, reason, rule), n in sorted(
            drop_counts.items(),
            key=lambda item: (-item[1], *(str(part) for part in item[0])),
        )
    ]

    # percentiles, from the histograms: per group, per dialect, in total, and per worker
    histograms = partial.histograms
    merged: dict[tuple[Any, Any, str], Histogram] = {}
    per_worker: dict[tuple[Any, str, str], Histogram] = {}
    for dialect, service, worker, metric, bucket, count in zip(
        *(histograms.column(name).to_pylist() for name in histograms.column_names), strict=True
    ):
        name = METRICS[metric]
        for level in levels(dialect, service):
            counted = merged.setdefault((*level, name), {})
            counted[bucket] = counted.get(bucket, 0) + count
        if worker is not None:
            key3 = (service, bytes(worker).hex(), name)  # a worker's, whatever the dialect
            counted = per_worker.setdefault(key3, {})
            counted[bucket] = counted.get(bucket, 0) + count
    for row in services:
        for metric in METRICS:
            _put_percentiles(row, metric, merged.get((row["dialect"], row["service"], metric), {}))

    start = filters.since if filters.since is not None else total["first_received"]
    end = filters.until if filters.until is not None else total["last_finished"]
    end = max(end, start + 1e-9)
    width = bucket_width(end - start)

    # Throughput: whole-second completion counts added up into buckets that start at whole
    # seconds; grouped by pyarrow (a long trace has a count per service for every second).
    origin = math.floor(start)
    completions = partial.completions
    seconds = completions.column("second").to_numpy()
    index = ((seconds - origin) // width).astype(np.int64)
    grouped = (
        pa.table(
            {
                "dialect": completions.column("dialect"),
                "service": completions.column("service"),
                "index": pa.array(index),
                "count": completions.column("count"),
            }
        )
        .group_by(["dialect", "service", "index"], use_threads=False)
        .aggregate([("count", "sum")])
        .to_pylist()
    )
    throughput: list[dict[str, Any]] = [
        {
            "dialect": row["dialect"],
            "service": row["service"],
            "start": origin + row["index"] * width,
            "completed": row["count_sum"],
            "per_second": row["count_sum"] / width,
        }
        for row in sorted(
            grouped, key=lambda row: (str(row["dialect"]), str(row["service"]), row["index"])
        )
    ]
    peaks: dict[tuple[Any, Any], float] = {}
    per_window: dict[tuple[Any, Any, float], float] = {}
    for row in throughput:
        key2 = (row["dialect"], row["service"])
        peaks[key2] = max(peaks.get(key2, 0.0), row["per_second"])
        for level in levels(row["dialect"], row["service"])[1:]:
            slot = (*level, row["start"])
            per_window[slot] = per_window.get(slot, 0.0) + row["per_second"]
    for (dialect, service, _), rate in per_window.items():
        peaks[(dialect, service)] = max(peaks.get((dialect, service), 0.0), rate)
    for row in services:
        row["throughput_mean"] = row["completed"] / (end - start)
        row["throughput_peak"] = peaks.get((row["dialect"], row["service"]), 0.0)

    workers = _workers(partial.workers.to_pylist(), lives, per_worker, start, end)
    slow = partial.slowest.to_pylist()
    for row in slow:
        row["worker"] = None if row["worker"] is None else bytes(row["worker"]).hex()
    return Report(
        files=files,
        corrupt=[],
        window=(start, end),
        bucket=width,
        services=services,
        workers=workers,
        throughput=throughput,
        drops=drops,
        slowest=slow[:slowest],
        dialects=dialects,
    )


def _workers(
    rows: list[dict[str, Any]],
    lives: dict[tuple[str, str], Any],
    per_worker: dict[tuple[Any, str, str], Histogram],
    start: float,
    end: float,
) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for record in rows:
        record["worker"] = bytes(record["worker"]).hex()
        record["busy"] = record.pop("busy_ns") / _partial.NS
        key = (record["service"], record["worker"])
        seen.add(key)
        life = lives.get(key, {})
        there_from = life.get("registered") or record["first_dispatch"]
        there_until = life.get("gone") or end
        active = min(there_until, end) - max(there_from, start)
        record["expiries"] = life.get("expiries", 0)
        record["disconnects"] = life.get("disconnects", 0)
        record["utilisation"] = record["busy"] / active if active > 0 else None
        histogram = per_worker.get((record["service"], record["worker"], "service_time"), {})
        _put_percentiles(record, "service_time", histogram)
        workers.append(record)
    for key, life in lives.items():  # registered but never sent a request in the window
        there_from = life.get("registered") or start
        there_until = life.get("gone") or end
        if key in seen or there_until < start or there_from >= end:
            continue
        workers.append(
            {
                "service": key[0],
                "worker": key[1],
                "attempts": 0,
                "completed": 0,
                "lost": 0,
                "failed": 0,
                "busy": 0.0,
                "first_dispatch": None,
                "last_end": None,
                "service_time_p50": None,
                "service_time_p95": None,
                "service_time_p99": None,
                "expiries": life["expiries"],
                "disconnects": life["disconnects"],
                "utilisation": 0.0,
            }
        )
    workers.sort(key=lambda row: (row["service"], -row["attempts"], row["worker"]))
    return workers


def _any(filters: Filters) -> bool:
    return bool(filters.services) or filters.since is not None or filters.until is not None
