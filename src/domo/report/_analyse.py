"""The Spark jobs of ``domo report``: trace records in, small per-service and per-worker tables out.

Every figure is computed by Spark over the whole (filtered) trace; only the aggregates come back
to the driver. Times are wall-clock seconds (``wall_anchor`` added), durations seconds.

Definitions (docs/report.md): queue wait is the sum of a request's ``queue_waits`` (all its
dispatches; null if never dispatched); service time is ``finished - dispatches[-1]`` of a
completed request; latency is ``finished - received``. A worker's busy time is the sum of its
attempts, each from its dispatch to the request's end or to the moment it went back to the queue
(the next dispatch minus that dispatch's queue wait); utilisation is busy time over the time the
worker was there (registered to gone, clipped to the report's window).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

PERCENTILES: Final = (0.5, 0.95, 0.99)
# Durations are counted in log-spaced buckets 1 % wide; a percentile is its bucket's geometric
# middle, within 0.5 % of the exact value. Counts merge by addition, so one Spark job gives the
# percentiles of every service, every worker and all of them together, where percentile_approx
# would need a job (or a rollup, twice the work) for each level.
STEP: Final = math.log(1.01)
ZERO_BUCKET: Final = -(10**6)  # durations <= 0 (clock granularity)
METRICS: Final = ("queue_wait", "service_time", "latency")
STEPS: Final = 5  # calls of ``step`` in ``analyse``, for the progress line
MAX_BUCKETS: Final = 120
NICE_WIDTHS: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


@dataclass
class Filters:
    """Which requests a report covers: received in ``[since, until)``, of these services."""

    since: float | None = None
    until: float | None = None
    services: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything a report shows; each table is a list of plain dicts (rows)."""

    files: int
    corrupt: list[tuple[str, str]]
    window: tuple[float, float]
    bucket: float
    services: list[dict[str, Any]]  # one per service, then service None: all services
    workers: list[dict[str, Any]]
    throughput: list[dict[str, Any]]
    drops: list[dict[str, Any]]
    slowest: list[dict[str, Any]]


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


def _merge(into: Histogram, histogram: Histogram) -> None:
    for bucket, count in histogram.items():
        into[bucket] = into.get(bucket, 0) + count


def _put_percentiles(row: dict[str, Any], name: str, histogram: Histogram) -> None:
    for q in PERCENTILES:
        row[f"{name}_p{round(q * 100)}"] = percentile(histogram, q)


def _histograms(F: Any, req: Any) -> dict[tuple[str, str | None, str], Histogram]:
    """(service, worker, metric) -> histogram, from one Spark job.

    Only service time is counted per worker (the worker that completed the request); queue wait
    and latency per service (worker None). One narrow select per metric, unioned: twice as fast
    over 20 M records as exploding an array of the three (measured here, issue 15), even though
    each select scans the files.
    """
    per_step = 1 / STEP

    def one(index: int, name: str, by_worker: bool) -> Any:
        value = F.col(name)
        bucket = F.when(value > 0, F.floor(F.log(value) * per_step)).otherwise(F.lit(ZERO_BUCKET))
        worker = F.col("worker") if by_worker else F.lit(None).cast("binary")
        return req.filter(value.isNotNull()).select(
            "service", worker.alias("worker"), F.lit(index).alias("metric"), bucket.alias("bucket")
        )

    selects = [one(index, name, name == "service_time") for index, name in enumerate(METRICS)]
    union = selects[0]
    for other in selects[1:]:
        union = union.unionAll(other)
    table = union.groupBy("service", "worker", "metric", "bucket").count().toArrow()
    result: dict[tuple[str, str | None, str], Histogram] = {}
    columns = [table.column(name).to_pylist() for name in ("service", "worker", "metric")]
    for service, worker, metric, bucket_, count in zip(
        *columns,
        table.column("bucket").to_pylist(),
        table.column("count").to_pylist(),
        strict=True,
    ):
        key = (service, None if worker is None else bytes(worker).hex(), METRICS[metric])
        result.setdefault(key, {})[int(bucket_)] = int(count)
    return result


def analyse(
    spark: Any,
    request_files: list[Path],
    worker_files: list[Path],
    filters: Filters,
    *,
    slowest: int = 10,
    step: Callable[[str], None] = lambda name: None,
) -> Report:
    """Run the report's Spark jobs; ``step`` is told the name of each before it starts."""
    from pyspark.sql import functions as F

    from domo.trace import _schemas

    step("reading the request records")
    requests_schema, workers_schema = _schemas()
    # The schema is given, not inferred: Spark would otherwise open every footer again.
    raw = spark.read.schema(_spark_schema(requests_schema)).parquet(
        *[str(path) for path in request_files]
    )
    anchor = F.col("wall_anchor")
    req = raw.select(
        "request_id",
        "service",
        "outcome",
        "redispatches",
        "drop_reason",
        "rule",
        "request_size",
        "reply_size",
        "workers",
        "dispatches",
        "queue_waits",
        "finished",
        "wall_anchor",
        (anchor + F.col("received")).alias("t_received"),
        (anchor + F.col("finished")).alias("t_finished"),
        (F.col("finished") - F.col("received")).alias("latency"),
        _queue_wait(F).alias("queue_wait"),
        F.when(
            (F.col("outcome") == "completed") & (F.size("dispatches") > 0),
            F.col("finished") - F.element_at("dispatches", -1),
        ).alias("service_time"),
        # binary: hashed as is by the jobs, made hex on the driver (hex per row costs)
        F.when(F.size("workers") > 0, F.element_at("workers", -1)).alias("worker"),
    )
    if filters.services:
        req = req.filter(F.col("service").isin(filters.services))
    if filters.since is not None:
        req = req.filter(F.col("t_received") >= filters.since)
    if filters.until is not None:
        req = req.filter(F.col("t_received") < filters.until)

    step("counts, drops and completions per second")
    # One job, grouped finely enough that the driver can add up the per-service counts, the
    # drops by reason and rule, and the throughput at any bucket width of whole seconds.
    fine = (
        req.groupBy(
            "service",
            "outcome",
            "drop_reason",
            "rule",
            F.floor("t_finished").alias("second"),
        )
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("redispatches").alias("redispatches"),
            F.sum("request_size").alias("request_bytes"),
            F.sum("reply_size").alias("reply_bytes"),
            F.min("t_received").alias("first_received"),
            F.max("t_finished").alias("last_finished"),
        )
        .toArrow()
        .to_pylist()
    )
    if not fine:
        raise NoRequests("no request records" + (" match the filters" if _any(filters) else ""))
    counters = ("requests", "completed", "expired", "dropped", "redispatches")
    by_service: dict[str | None, dict[str, Any]] = {}
    drop_counts: dict[tuple[str, str | None, str | None], int] = {}
    completions: dict[tuple[str, int], int] = {}
    for row in fine:
        for name in (row["service"], None):
            into = by_service.get(name)
            if into is None:
                into = by_service[name] = {
                    "service": name,
                    **dict.fromkeys(counters, 0),
                    "request_bytes": 0,
                    "reply_bytes": 0,
                    "first_received": row["first_received"],
                    "last_finished": row["last_finished"],
                }
            into["requests"] += row["count"]
            if row["outcome"] in ("completed", "expired", "dropped"):
                into[row["outcome"]] += row["count"]
            into["redispatches"] += row["redispatches"] or 0
            into["request_bytes"] += row["request_bytes"] or 0
            into["reply_bytes"] += row["reply_bytes"] or 0
            into["first_received"] = min(into["first_received"], row["first_received"])
            into["last_finished"] = max(into["last_finished"], row["last_finished"])
        if row["outcome"] == "dropped":
            key = (row["service"], row["drop_reason"], row["rule"])
            drop_counts[key] = drop_counts.get(key, 0) + row["count"]
        elif row["outcome"] == "completed":
            key2 = (row["service"], int(row["second"]))
            completions[key2] = completions.get(key2, 0) + row["count"]
    total = by_service.pop(None)
    services = [by_service[name] for name in sorted(by_service, key=str)]
    services.append(total)
    drops = [
        {"service": service, "drop_reason": reason, "rule": rule, "count": count}
        for (service, reason, rule), count in sorted(
            drop_counts.items(), key=lambda item: (-item[1], item[0][0])
        )
    ]

    step("percentiles of queue wait, service time and latency")
    histograms = _histograms(F, req)
    merged: dict[tuple[str | None, str], Histogram] = {}
    for (service, _, metric), histogram in histograms.items():
        _merge(merged.setdefault((service, metric), {}), histogram)
        _merge(merged.setdefault((None, metric), {}), histogram)
    for row in services:
        for metric in METRICS:
            _put_percentiles(row, metric, merged.get((row["service"], metric), {}))

    start = filters.since if filters.since is not None else total["first_received"]
    end = filters.until if filters.until is not None else total["last_finished"]
    end = max(end, start + 1e-9)
    width = bucket_width(end - start)

    # Buckets start at whole seconds, so that whole-second counts add up into them.
    origin = math.floor(start)
    per_bucket: dict[tuple[str, int], int] = {}
    for (service, second), count in completions.items():
        key3 = (service, int((second - origin) // width))
        per_bucket[key3] = per_bucket.get(key3, 0) + count
    throughput: list[dict[str, Any]] = [
        {
            "service": service,
            "start": origin + index * width,
            "completed": count,
            "per_second": count / width,
        }
        for (service, index), count in sorted(per_bucket.items())
    ]
    peaks: dict[str | None, float] = {}
    per_window: dict[float, float] = {}
    for row in throughput:
        peaks[row["service"]] = max(peaks.get(row["service"], 0.0), row["per_second"])
        per_window[row["start"]] = per_window.get(row["start"], 0.0) + row["per_second"]
    peaks[None] = max(per_window.values(), default=0.0)
    for row in services:
        row["throughput_mean"] = row["completed"] / (end - start)
        row["throughput_peak"] = peaks.get(row["service"], 0.0)

    step("per-worker attempts and utilisation")
    workers = _per_worker(
        F, spark, req, worker_files, _spark_schema(workers_schema), filters, start, end
    )
    for row in workers:
        histogram = histograms.get((row["service"], row["worker"], "service_time"), {})
        _put_percentiles(row, "service_time", histogram)

    step("the slowest requests")
    slow = [
        row.asDict()
        for row in req.orderBy(F.desc("latency"), "request_id")
        .select(
            "service",
            "request_id",
            "outcome",
            "worker",
            "t_received",
            "latency",
            "queue_wait",
            "service_time",
            "redispatches",
        )
        .limit(slowest)
        .collect()
    ]
    for row in slow:
        row["worker"] = None if row["worker"] is None else bytes(row["worker"]).hex()
    return Report(
        files=len(request_files) + len(worker_files),
        corrupt=[],
        window=(start, end),
        bucket=width,
        services=services,
        workers=workers,
        throughput=throughput,
        drops=drops,
        slowest=slow,
    )


def _queue_wait(F: Any) -> Any:
    """The sum of ``queue_waits`` (null if empty), without a lambda for up to 4 dispatches.

    Spark evaluates a higher-order function such as ``aggregate`` row by row outside its
    generated code; over 20 M records that was the slowest part of the report. Almost every
    request has one or two dispatches, so the first four are added as plain columns and only a
    longer list goes through ``aggregate``.
    """
    waits = F.col("queue_waits")
    first_four = F.element_at(waits, 1)
    for index in (2, 3, 4):
        first_four = first_four + F.coalesce(F.try_element_at(waits, F.lit(index)), F.lit(0.0))
    size = F.size(waits)
    return (
        F.when(size == 0, F.lit(None))
        .when(size <= 4, first_four)
        .otherwise(F.aggregate(waits, F.lit(0.0), lambda total, wait: total + wait))
    )


def _spark_schema(arrow_schema: Any) -> Any:
    """The Spark schema of a pyarrow schema (binary, string, int, float and lists of them)."""
    from pyspark.sql import types as T

    def spark_type(kind: Any) -> Any:
        import pyarrow as pa

        if pa.types.is_list(kind):
            return T.ArrayType(spark_type(kind.value_type))
        return {
            pa.binary(): T.BinaryType(),
            pa.string(): T.StringType(),
            pa.int32(): T.IntegerType(),
            pa.int64(): T.LongType(),
            pa.float64(): T.DoubleType(),
        }[kind]

    return T.StructType(
        [T.StructField(field.name, spark_type(field.type), nullable=True) for field in arrow_schema]
    )


def _any(filters: Filters) -> bool:
    return bool(filters.services) or filters.since is not None or filters.until is not None


def _per_worker(
    F: Any,
    spark: Any,
    req: Any,
    worker_files: list[Path],
    workers_schema: Any,
    filters: Filters,
    start: float,
    end: float,
) -> list[dict[str, Any]]:
    attempts = req.select(
        "service",
        "outcome",
        "finished",
        "wall_anchor",
        "dispatches",
        "queue_waits",
        F.posexplode("workers").alias("pos", "id"),
    )
    last = F.col("pos") == F.size("dispatches") - 1
    began = F.element_at("dispatches", F.col("pos") + 1)
    ended = F.when(last, F.col("finished")).otherwise(
        F.element_at("dispatches", F.col("pos") + 2) - F.element_at("queue_waits", F.col("pos") + 2)
    )
    completed = last & (F.col("outcome") == "completed")
    rows = (
        attempts.select(
            "service",
            F.col("id").alias("worker"),
            completed.alias("completed"),
            last.alias("last"),
            (ended - began).alias("busy"),
            (F.col("wall_anchor") + began).alias("t_began"),
            (F.col("wall_anchor") + ended).alias("t_ended"),
        )
        .groupBy("service", "worker")
        .agg(
            F.count(F.lit(1)).alias("attempts"),
            F.sum(F.col("completed").cast("int")).alias("completed"),
            F.sum((~F.col("last")).cast("int")).alias("lost"),
            F.sum((F.col("last") & ~F.col("completed")).cast("int")).alias("failed"),
            F.sum("busy").alias("busy"),
            F.min("t_began").alias("first_dispatch"),
            F.max("t_ended").alias("last_end"),
        )
        .collect()
    )
    lifetimes: dict[tuple[str, str], dict[str, Any]] = {}
    if worker_files:
        changes = spark.read.schema(workers_schema).parquet(*[str(path) for path in worker_files])
        if filters.services:
            changes = changes.filter(F.col("service").isin(filters.services))
        at = F.col("wall_anchor") + F.col("at")
        change = F.col("change")
        for row in (
            changes.groupBy("service", F.lower(F.hex("worker")).alias("worker"))
            .agg(
                F.min(F.when(change == "registered", at)).alias("registered"),
                F.max(F.when(change != "registered", at)).alias("gone"),
                F.sum((change == "expired").cast("int")).alias("expiries"),
                F.sum((change == "disconnected").cast("int")).alias("disconnects"),
            )
            .collect()
        ):
            lifetimes[(row["service"], row["worker"])] = row.asDict()
    workers: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for row in rows:
        record = row.asDict()
        record["worker"] = bytes(record["worker"]).hex()
        key = (record["service"], record["worker"])
        seen.add(key)
        life = lifetimes.get(key, {})
        there_from = life.get("registered") or record["first_dispatch"]
        there_until = life.get("gone") or end
        active = min(there_until, end) - max(there_from, start)
        record["expiries"] = life.get("expiries", 0)
        record["disconnects"] = life.get("disconnects", 0)
        record["utilisation"] = record["busy"] / active if active > 0 else None
        workers.append(record)
    for key, life in lifetimes.items():  # registered but never sent a request in the window
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
