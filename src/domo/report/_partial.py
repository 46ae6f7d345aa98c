"""The additive part of ``domo report``: trace records in, small partial aggregates out.

Each Spark task (``_analyse``) reads its share of the trace files with pyarrow and folds them
into a ``Partial``: counts by outcome, drop reason and rule; completions per second; histogram
counts of queue wait, service time and latency; per-worker attempt counts; the slowest requests.
Every part merges by addition (or min, max, top N), so partials of any split of the files merge
into the same figures: the same report whatever the master, the number of tasks, the order they
ran in or the tasks run again after a lost executor. Sums of durations are kept as integer
nanoseconds for the same reason (a float sum depends on the order of its terms).

Nothing here needs Spark: only pyarrow and numpy (both come with the ``spark`` extra).
Definitions: module docstring of ``_analyse`` and docs/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "COLUMNS",
    "KINDS",
    "METRICS",
    "STEP",
    "ZERO_BUCKET",
    "Partial",
    "Window",
    "collect",
    "compute",
    "encode",
    "merge",
]

# Durations are counted in log-spaced buckets 1 % wide; a percentile is its bucket's geometric
# middle, within 0.5 % of the exact value. Counts merge by addition.
STEP: Final = math.log(1.01)
ZERO_BUCKET: Final = -(10**6)  # durations <= 0 (clock granularity)
METRICS: Final = ("queue_wait", "service_time", "latency")
NS: Final = 1e9  # busy time is summed in integer nanoseconds: exact, in any order
CHUNK: Final = 1 << 20  # records folded at a time (a task's memory stays about 200 MB)

# The columns of a request record a report reads (docs/traces.md).
COLUMNS: Final = (
    "request_id",
    "service",
    "dialect",
    "workers",
    "wall_anchor",
    "received",
    "dispatches",
    "queue_waits",
    "finished",
    "outcome",
    "redispatches",
    "request_size",
    "reply_size",
    "drop_reason",
    "rule",
)
DICTIONARY: Final = ("service", "dialect", "outcome", "drop_reason", "rule")
# The parts of a Partial: name -> (grouping keys, {column: how it merges}).
KINDS: Final[dict[str, tuple[tuple[str, ...], dict[str, str]]]] = {
    "counts": (
        ("dialect", "service", "outcome", "drop_reason", "rule"),
        {
            "count": "sum",
            "redispatches": "sum",
            "request_bytes": "sum",
            "reply_bytes": "sum",
            "first_received": "min",
            "last_finished": "max",
        },
    ),
    "completions": (("dialect", "service", "second"), {"count": "sum"}),
    "histograms": (("dialect", "service", "worker", "metric", "bucket"), {"count": "sum"}),
    # per worker, whatever dialect its requests' clients spoke (a worker is one peer)
    "workers": (
        ("service", "worker"),
        {
            "attempts": "sum",
            "completed": "sum",
            "lost": "sum",
            "failed": "sum",
            "busy_ns": "sum",
            "first_dispatch": "min",
            "last_end": "max",
        },
    ),
}
SLOWEST_COLUMNS: Final = (
    "dialect",
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


@dataclass(frozen=True)
class Window:
    """Which records count: received in ``[since, until)`` (wall clock), of these services."""

    since: float | None = None
    until: float | None = None
    services: tuple[str, ...] = ()


@dataclass
class Partial:
    """pyarrow tables, one per part of ``KINDS``, and ``slowest`` (at most ``keep`` rows)."""

    counts: Any
    completions: Any
    histograms: Any
    workers: Any
    slowest: Any
    keep: int

    def tables(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in (*KINDS, "slowest")}


def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    text, i64, f64 = pa.string(), pa.int64(), pa.float64()
    types = {
        "dialect": text,
        "service": text,
        "outcome": text,
        "drop_reason": text,
        "rule": text,
        "worker": pa.binary(),
        "second": i64,
        "metric": pa.int8(),
        "bucket": pa.int32(),
        "first_received": f64,
        "last_finished": f64,
        "first_dispatch": f64,
        "last_end": f64,
        "request_id": i64,
        "t_received": f64,
        "latency": f64,
        "queue_wait": f64,
        "service_time": f64,
    }
    schemas = {
        name: pa.schema([(column, types.get(column, i64)) for column in (*keys, *values)])
        for name, (keys, values) in KINDS.items()
    }
    schemas["slowest"] = pa.schema([(column, types.get(column, i64)) for column in SLOWEST_COLUMNS])
    return schemas


def empty(keep: int) -> Partial:
    """The partial of no records."""
    tables = {name: schema.empty_table() for name, schema in _schemas().items()}
    return Partial(keep=keep, **tables)


def _group(table: Any, kind: str) -> Any:
    """``table`` grouped by the keys of ``kind``, each value merged its way; columns in order."""
    keys, values = KINDS[kind]
    grouped = table.group_by(list(keys), use_threads=False).aggregate(
        [(column, how) for column, how in values.items()]
    )
    schema = _schemas()[kind]
    columns = [grouped.column(name) for name in keys]
    columns += [grouped.column(f"{column}_{how}") for column, how in values.items()]
    return _sorted(type(grouped).from_arrays(columns, schema=schema).cast(schema), keys)


def _sorted(table: Any, keys: Sequence[str]) -> Any:
    """Rows in key order (nulls last), so that equal partials are equal tables."""
    import pyarrow.compute as pc

    if table.num_rows <= 1:
        return table
    order = pc.sort_indices(table, [(key, "ascending") for key in keys])
    return table.take(order)


def _top(table: Any, keep: int) -> Any:
    """The ``keep`` slowest rows: latency descending, then request id, service, dialect."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    order = pc.sort_indices(
        table,
        [
            ("latency", "descending"),
            ("request_id", "ascending"),
            ("service", "ascending"),
            ("dialect", "ascending"),
        ],
    )
    return table.take(order[:keep])


def merge(partials: Iterable[Partial]) -> Partial:
    """One partial of all of them (their records taken together)."""
    import pyarrow as pa

    items = list(partials)
    if not items:
        raise ValueError("nothing to merge")
    keep = max(item.keep for item in items)
    if len(items) == 1:
        return items[0]
    merged: dict[str, Any] = {}
    for kind in KINDS:
        merged[kind] = _group(pa.concat_tables([getattr(item, kind) for item in items]), kind)
    merged["slowest"] = _top(pa.concat_tables([item.slowest for item in items]), keep)
    return Partial(keep=keep, **merged)


def encode(partial: Partial) -> Iterator[tuple[str, bytes]]:
    """(kind, Arrow IPC stream) pairs: how a Spark task hands its partial to the driver."""
    import pyarrow as pa

    for name, table in partial.tables().items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        yield name, sink.getvalue().to_pybytes()


def collect(pairs: Iterable[tuple[str, bytes]], keep: int) -> Partial:
    """One partial of every ``encode``d one in ``pairs`` (in any order)."""
    import pyarrow as pa

    by_kind: dict[str, list[Any]] = {name: [] for name in (*KINDS, "slowest")}
    for name, data in pairs:
        by_kind[name].append(pa.ipc.open_stream(data).read_all())
    if not by_kind["counts"]:
        return empty(keep)
    merged = {kind: _group(pa.concat_tables(by_kind[kind]), kind) for kind in KINDS}
    merged["slowest"] = _top(pa.concat_tables(by_kind["slowest"]), keep)
    return Partial(keep=keep, **merged)


def compute(batches: Iterable[Any], window: Window, keep: int) -> Partial:
    """The partial of request records given as pyarrow tables or record batches."""
    parts = [_compute_one(batch, window, keep) for batch in batches]
    return merge(parts) if parts else empty(keep)


def read(paths: Iterable[str], window: Window, keep: int) -> Partial:
    """The partial of the request files ``paths`` (read with pyarrow, ``CHUNK`` rows at a time).

    A file that cannot be read raises ``OSError`` naming it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = empty(keep)
    for path in paths:
        try:
            # strings as dictionaries: Parquet stores them so, and the fold groups by code
            with pq.ParquetFile(path, read_dictionary=DICTIONARY) as file:
                columns = [name for name in COLUMNS if name in file.schema_arrow.names]
                for batch in file.iter_batches(batch_size=CHUNK, columns=columns):
                    done = merge([done, _compute_one(batch, window, keep)])
        except (OSError, pa.ArrowException) as error:
            raise OSError(f"cannot read {path}: {error}") from error
    return done


def _codes(column: Any) -> tuple[Any, Any]:
    """A string or binary column as (codes, values): ``values[codes[i]]`` is row i's value.

    Code 0 is null (``values[0]`` is None). Trace files come dictionary-encoded from Parquet,
    so this costs little: grouping by these small integers is what makes the fold fast.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    indices = pc.fill_null(column.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pa.concat_arrays([pa.nulls(1, type=column.dictionary.type), column.dictionary])
    return indices + 1, values


DENSE: Final = 1 << 22  # up to this many possible keys, groups are counted in an array


def _aggregate(
    key: Any, columns: dict[str, tuple[Any, str]], space: int
) -> tuple[Any, dict[str, Any]]:
    """Group rows by the integer ``key`` (in ``[0, space)``); each column merged its way
    ("sum", "min" or "max"). Returns the distinct keys (ascending) and each column's value per
    key, as numpy arrays (NaN is left out of a min or max; all NaN gives NaN).

    Small key spaces, the usual case, are counted in arrays indexed by key (``bincount``,
    ``minimum.at``: linear, no hashing); larger ones go through pyarrow's hash aggregation.
    Integer sums are exact: ``bincount`` adds in float64, exact below 2**53, far above what one
    chunk of records sums to, and partials merge in int64.
    """
    import numpy as np
    import pyarrow as pa

    if space <= DENSE:
        counts = np.bincount(key, minlength=space)
        present = np.flatnonzero(counts)
        result = {}
        for name, (values, how) in columns.items():
            if how == "sum":
                total = np.bincount(key, weights=values, minlength=space)[present]
                result[name] = np.rint(total).astype(np.int64)
            else:
                fill, at = (np.inf, np.fmin.at) if how == "min" else (-np.inf, np.fmax.at)
                out = np.full(space, fill)
                at(out, key, values)
                chosen = out[present]
                result[name] = np.where(np.isinf(chosen), np.nan, chosen)
        return present, result
    data = {"k": pa.array(key)}
    for name, (values, _) in columns.items():
        data[name] = pa.array(values, from_pandas=True)  # NaN -> null: skipped by min, max
    grouped = (
        pa.table(data)
        .group_by(["k"], use_threads=False)
        .aggregate([(name, how) for name, (_, how) in columns.items()])
    )
    order = np.argsort(grouped.column("k").to_numpy(), kind="stable")
    keys = grouped.column("k").to_numpy()[order]
    result = {}
    for name, (_, how) in columns.items():
        column = grouped.column(f"{name}_{how}")
        if pa.types.is_floating(column.type):
            result[name] = column.to_numpy(zero_copy_only=False)[order]
        else:
            result[name] = column.fill_null(0).to_numpy()[order]
    return keys, result


def _compact(codes: Any, space: int) -> tuple[Any, Any]:
    """(the distinct ``codes``, ascending; each code's index among them), without a sort when
    the codes lie in a small ``space``."""
    import numpy as np

    if space > DENSE:
        distinct, index = np.unique(codes, return_inverse=True)
        return distinct, index
    distinct = np.flatnonzero(np.bincount(codes, minlength=space))
    lookup: Any = np.zeros(space, dtype=np.int64)
    lookup[distinct] = np.arange(len(distinct))
    return distinct, lookup[codes]


def _compute_one(batch: Any, window: Window, keep: int) -> Partial:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.table(batch) if isinstance(batch, pa.RecordBatch) else batch
    if "dialect" not in table.column_names:
        table = table.append_column("dialect", pa.nulls(table.num_rows, type=pa.string()))
    table = table.combine_chunks()

    def floats(name: str) -> Any:
        return table.column(name).to_numpy(zero_copy_only=False)

    t_received = floats("wall_anchor") + floats("received")
    selected = None
    if window.services:
        selected = pc.is_in(
            pc.cast(table.column("service"), pa.string()), pa.array(list(window.services))
        ).to_numpy(zero_copy_only=False)
    if window.since is not None:
        selected = (t_received >= window.since) & (True if selected is None else selected)
    if window.until is not None:
        selected = (t_received < window.until) & (True if selected is None else selected)
    if selected is not None:
        table = table.filter(pa.array(selected)).combine_chunks()
        t_received = t_received[selected]
    rows = table.num_rows
    if rows == 0:
        return empty(keep)
    anchor = floats("wall_anchor")
    received = floats("received")
    finished = floats("finished")
    t_finished = anchor + finished
    latency = finished - received

    dialect, dialects = _codes(table.column("dialect"))
    service, services = _codes(table.column("service"))
    outcome, outcomes = _codes(table.column("outcome"))
    reason, reasons = _codes(table.column("drop_reason"))
    rule, rules = _codes(table.column("rule"))
    names = outcomes.to_pylist()
    completed_code = names.index("completed") if "completed" in names else -1
    completed = outcome == completed_code
    # one code per (dialect, service): the unit every table is split by
    group = dialect * len(services) + service
    groups = len(dialects) * len(services)

    def lists(name: str) -> tuple[Any, Any, Any]:
        """A list column's flat values, each row's offset into them, and each row's length."""
        column = table.column(name).chunk(0)
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return column.flatten(), offsets, lengths.astype(np.int64)

    waits, wait_offsets, wait_lengths = lists("queue_waits")
    dispatches, dispatch_offsets, dispatch_lengths = lists("dispatches")
    worker_ids, worker_offsets, worker_lengths = lists("workers")
    wait_values = waits.to_numpy(zero_copy_only=False)
    dispatch_values: Any = np.append(dispatches.to_numpy(zero_copy_only=False), np.nan)
    worker, workers = _codes(worker_ids) if len(worker_ids) else (np.zeros(0, np.int64), None)
    if workers is None:
        workers = pa.nulls(1, type=pa.binary())
    worker = np.append(worker, 0)  # index -1 (no worker) reads code 0: null

    queue_wait = np.bincount(
        np.repeat(np.arange(rows), wait_lengths), weights=wait_values, minlength=rows
    )
    has_wait = wait_lengths > 0
    has_dispatch = dispatch_lengths > 0
    served = completed & has_dispatch
    service_time = finished - dispatch_values[np.where(has_dispatch, dispatch_offsets[1:] - 1, -1)]
    last_worker = worker[np.where(worker_lengths > 0, worker_offsets[1:] - 1, -1)]

    # counts by outcome, drop reason and rule
    sizes = (len(outcomes), len(reasons), len(rules))
    key = ((group * sizes[0] + outcome) * sizes[1] + reason) * sizes[2] + rule

    def ints(name: str) -> Any:
        return pc.fill_null(table.column(name), 0).to_numpy().astype(np.int64)

    reply = table.column("reply_size")
    keys, values = _aggregate(
        key,
        {
            "count": (np.ones(rows, dtype=np.int64), "sum"),
            "redispatches": (ints("redispatches"), "sum"),
            "request_bytes": (ints("request_size"), "sum"),
            "reply_bytes": (pc.fill_null(reply, 0).to_numpy().astype(np.int64), "sum"),
            "first_received": (t_received, "min"),
            "last_finished": (t_finished, "max"),
        },
        groups * sizes[0] * sizes[1] * sizes[2],
    )
    keys, rule_of = np.divmod(keys, sizes[2])
    keys, reason_of = np.divmod(keys, sizes[1])
    group_of, outcome_of = np.divmod(keys, sizes[0])
    counts = _table(
        "counts",
        _names(group_of, dialects, services),
        outcome=outcomes.take(pa.array(outcome_of)),
        drop_reason=reasons.take(pa.array(reason_of)),
        rule=rules.take(pa.array(rule_of)),
        **values,
    )
    # reply_size is null unless completed: a group with none has no reply bytes, as in a sum
    # over nulls; kept as 0, which is what the report shows for it

    # completions per (dialect, service, second)
    second = np.floor(t_finished[completed]).astype(np.int64)
    first_second = int(second.min()) if len(second) else 0
    span = int(second.max()) - first_second + 1 if len(second) else 1
    keys, values = _aggregate(
        group[completed] * span + (second - first_second),
        {"count": (np.ones(len(second), dtype=np.int64), "sum")},
        groups * span,
    )
    group_of, second_of = np.divmod(keys, span)
    completions = _table(
        "completions",
        _names(group_of, dialects, services),
        second=pa.array(second_of + first_second),
        **values,
    )

    # histograms: queue wait and latency per service, service time per (service, last worker)
    def buckets(values: Any) -> Any:
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.floor(np.log(values) / STEP)
        return np.where(values > 0, logs, ZERO_BUCKET).astype(np.int64)

    owners: list[Any] = []
    metric_codes: list[Any] = []
    bucket_codes: list[Any] = []
    for metric, values_, mask, by_worker in (
        (0, queue_wait, has_wait, False),
        (1, service_time, served, True),
        (2, latency, None, False),
    ):
        owner = (group if mask is None else group[mask]) * len(workers)
        if by_worker:
            owner = owner + last_worker[mask]  # worker code 0 (null) for the others
        owners.append(owner)
        bucket_codes.append(buckets(values_ if mask is None else values_[mask]))
        metric_codes.append(np.full(len(owner), metric, dtype=np.int64))
    owner = np.concatenate(owners)
    bucket = np.concatenate(bucket_codes)
    # Keys made compact: only the (group, worker) pairs and the bucket range of this chunk.
    pairs, owner = _compact(owner, groups * len(workers))
    real = bucket[bucket != ZERO_BUCKET]
    low = int(real.min()) if len(real) else 0
    width = (int(real.max()) - low + 2) if len(real) else 1  # code 0: ZERO_BUCKET
    code = np.where(bucket == ZERO_BUCKET, 0, bucket - low + 1)
    keys, values = _aggregate(
        (owner * len(METRICS) + np.concatenate(metric_codes)) * width + code,
        {"count": (np.ones(len(code), dtype=np.int64), "sum")},
        len(pairs) * len(METRICS) * width,
    )
    keys, code_of = np.divmod(keys, width)
    owner_of, metric_of = np.divmod(keys, len(METRICS))
    group_of, worker_of = np.divmod(pairs[owner_of], len(workers))
    histograms = _table(
        "histograms",
        _names(group_of, dialects, services),
        worker=workers.take(pa.array(worker_of)),
        metric=pa.array(metric_of.astype(np.int8)),
        bucket=pa.array(np.where(code_of == 0, ZERO_BUCKET, code_of + low - 1).astype(np.int32)),
        **values,
    )

    # attempts: one per (request, worker that held it), in dispatch order
    attempts = len(worker) - 1
    row: Any = np.repeat(np.arange(rows), worker_lengths)
    position = np.arange(attempts) - worker_offsets[row]
    last = position == dispatch_lengths[row] - 1
    began_index = np.where(position < dispatch_lengths[row], dispatch_offsets[row] + position, -1)
    later = position + 1 < dispatch_lengths[row]
    next_dispatch = dispatch_values[np.where(later, dispatch_offsets[row] + position + 1, -1)]
    next_wait = np.append(wait_values, np.nan)[
        np.where(position + 1 < wait_lengths[row], wait_offsets[row] + position + 1, -1)
    ]
    began = dispatch_values[began_index]
    ended = np.where(last, finished[row], next_dispatch - next_wait)
    attempt_completed = last & completed[row]
    busy = ended - began
    keys, values = _aggregate(
        service[row] * len(workers) + worker[:attempts],
        {
            "attempts": (np.ones(attempts, dtype=np.int64), "sum"),
            "completed": (attempt_completed.astype(np.int64), "sum"),
            "lost": ((~last).astype(np.int64), "sum"),
            "failed": ((last & ~attempt_completed).astype(np.int64), "sum"),
            "busy_ns": (np.rint(np.nan_to_num(busy) * NS).astype(np.int64), "sum"),
            "first_dispatch": (anchor[row] + began, "min"),
            "last_end": (anchor[row] + ended, "max"),
        },
        len(services) * len(workers),
    )
    service_of, worker_of = np.divmod(keys, len(workers))
    worker_table = _table(
        "workers",
        {"service": services.take(pa.array(service_of))},
        worker=workers.take(pa.array(worker_of)),
        **values,
    )

    # the slowest: candidates at or above the keep-th largest latency, then in exact order
    if keep > 0:
        if rows > keep:
            threshold = np.partition(latency, rows - keep)[rows - keep]
            candidates = np.flatnonzero(latency >= threshold)
        else:
            candidates = np.arange(rows)
        slow = _table(
            "slowest",
            _names(group[candidates], dialects, services),
            request_id=table.column("request_id").take(pa.array(candidates)),
            outcome=outcomes.take(pa.array(outcome[candidates])),
            worker=workers.take(pa.array(last_worker[candidates])),
            t_received=t_received[candidates],
            latency=latency[candidates],
            queue_wait=np.where(has_wait[candidates], queue_wait[candidates], np.nan),
            service_time=np.where(served[candidates], service_time[candidates], np.nan),
            redispatches=ints("redispatches")[candidates],
        )
        slowest = _top(slow, keep)
    else:
        slowest = _schemas()["slowest"].empty_table()
    return Partial(
        counts=counts,
        completions=completions,
        histograms=histograms,
        workers=worker_table,
        slowest=slowest,
        keep=keep,
    )


def _names(group: Any, dialects: Any, services: Any) -> dict[str, Any]:
    """The dialect and service columns of ``group`` codes (dialect * len(services) + service)."""
    import numpy as np
    import pyarrow as pa

    dialect, service = np.divmod(group, len(services))
    return {
        "dialect": dialects.take(pa.array(dialect)),
        "service": services.take(pa.array(service)),
    }


def _table(kind: str, names: dict[str, Any], **columns: Any) -> Any:
    """A table of ``kind``'s schema from arrays (numpy floats: NaN is null), in key order."""
    import pyarrow as pa

    schema = _schemas()[kind]
    given = {**names, **columns}
    arrays = []
    for column in schema:
        value = given[column.name]
        if not isinstance(value, pa.Array | pa.ChunkedArray):
            value = pa.array(value, from_pandas=True)
        arrays.append(value.cast(column.type))
    table = pa.Table.from_arrays(arrays, schema=schema)
    if kind == "slowest":
        return table
    return _sorted(table, KINDS[kind][0])
