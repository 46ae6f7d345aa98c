"""Synthetic request traces in domo.trace's schema (version 1), made with numpy, not a broker.

``python benchmarks/_gen_traces.py DIR --rows 1000000`` writes ``requests-*.parquet`` files of
at most 1 M rows each (as a broker's rotation would) and one ``workers-*.parquet``. The load:
2,000 requests/s over 20 services with a Zipf-like skew, 5 workers per service, queue waits
exponential (mean 1 ms), service times log-normal (median 5 ms); 1 % expire unserved, 1 % are
re-dispatched once (their first worker lost) and complete, 0.5 % are dropped after a lost
worker. ``--dialects mdp02,mdp01,...``: each client speaks one of them (its requests carry it),
as on a broker that serves the family's dialects; by default all speak ``mdp02``. Seeded: the
same arguments give the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from domo.trace import _schemas

SERVICES = 20
WORKERS_PER_SERVICE = 5
RATE = 2000.0  # requests per second
PER_FILE = 1_000_000
WALL_ANCHOR = 1_790_000_000.0  # broker clock 0 is this Unix time (2026-09-21)


def _names(pattern: bytes, numbers: Any, count: int, kind: Any) -> Any:
    """``pattern % n`` for each of ``numbers`` (all below ``count``), as an Arrow array, made
    in C from a dictionary of the ``count`` names rather than one Python string per row."""
    names = pa.array([pattern % n for n in range(count)], type=pa.binary()).cast(kind)
    return pa.DictionaryArray.from_arrays(pa.array(numbers, type=pa.int32()), names).cast(kind)


def _lists(values: Any, counts: np.ndarray[Any, Any], kind: Any) -> Any:
    offsets: Any = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    flat = values if isinstance(values, pa.Array) else pa.array(values, type=kind)
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


CLIENTS = 200
DROP_RULE = "MDP-D-08"  # the rule behind redispatch-limit (specs/mdp-0.2.md)


def chunk(
    rng: np.random.Generator, first: int, rows: int, dialects: tuple[str, ...] = ("mdp02",)
) -> Any:
    """``rows`` request records with ids from ``first``, as a pyarrow Table."""
    schema = _schemas()[0]
    ids: Any = np.arange(first, first + rows, dtype=np.int64)
    weights = 1.0 / np.arange(1, SERVICES + 1)
    service = rng.choice(SERVICES, size=rows, p=weights / weights.sum())
    received = ids / RATE + rng.uniform(0, 1 / RATE, rows)
    kind = rng.random(rows)
    expired = kind < 0.01
    redone = (kind >= 0.01) & (kind < 0.02)
    dropped = (kind >= 0.02) & (kind < 0.025)
    attempts = np.where(expired, 0, np.where(redone | dropped, 2, 1)).astype(np.int32)
    total = int(attempts.sum())
    owner: Any = np.repeat(service, attempts)
    worker_number = owner * WORKERS_PER_SERVICE + rng.integers(0, WORKERS_PER_SERVICE, total)
    worker_ids = _names(b"w%04d", worker_number, SERVICES * WORKERS_PER_SERVICE, pa.binary())
    waits = rng.exponential(0.001, total)
    service_times = rng.lognormal(np.log(0.005), 0.6, total)
    # Each attempt starts after its wait; the next one waits from where the previous ended.
    starts = np.empty(total)
    row_of: Any = np.repeat(np.arange(rows), attempts)
    position = np.arange(total) - np.repeat(np.cumsum(attempts) - attempts, attempts)
    first_attempt = position == 0
    starts[first_attempt] = received[row_of[first_attempt]] + waits[first_attempt]
    second = ~first_attempt
    starts[second] = starts[np.flatnonzero(second) - 1] + service_times[second] + waits[second]
    ends = starts + service_times
    last_end = np.zeros(rows)
    has = attempts > 0
    last_index = np.cumsum(attempts) - 1
    last_end[has] = ends[last_index[has]]
    finished = np.where(expired, received + 5.0, last_end)
    outcome = np.where(expired, "expired", np.where(dropped, "dropped", "completed"))
    size = rng.integers(16, 2048, rows)
    client = rng.integers(0, CLIENTS, rows)
    columns = {
        "request_id": pa.array(ids),
        "service": _names(b"svc.%02d", service, SERVICES, pa.string()),
        "client": _names(b"c%03d", client, CLIENTS, pa.binary()),
        "workers": _lists(worker_ids, attempts, pa.binary()),
        "dialect": pa.array(np.array(dialects, dtype=object)[client % len(dialects)]),
        "wall_anchor": pa.array(np.full(rows, WALL_ANCHOR)),
        "received": pa.array(received),
        "dispatches": _lists(starts, attempts, pa.float64()),
        "queue_waits": _lists(waits, attempts, pa.float64()),
        "first_partial": pa.nulls(rows, type=pa.float64()),
        "finished": pa.array(finished),
        "outcome": pa.array(outcome.astype(object), type=pa.string()),
        "redispatches": pa.array(np.where(redone | dropped, 1, 0).astype(np.int32)),
        "request_size": pa.array(size),
        "reply_size": pa.array(np.where(outcome == "completed", size, 0)).cast(pa.int64()),
        "partials": pa.array(np.zeros(rows, dtype=np.int32)),
        "partial_bytes": pa.array(np.zeros(rows, dtype=np.int64)),
        "drop_reason": pa.array(
            np.where(dropped, "redispatch-limit", None).astype(object), type=pa.string()
        ),
        "rule": pa.array(np.where(dropped, DROP_RULE, None).astype(object), type=pa.string()),
    }
    return pa.Table.from_pydict(columns, schema=schema)


def workers_table() -> Any:
    """One ``registered`` record per worker, at broker time 0."""
    schema = _schemas()[1]
    count = SERVICES * WORKERS_PER_SERVICE
    return pa.Table.from_pydict(
        {
            "worker": [b"w%04d" % n for n in range(count)],
            "service": [f"svc.{n // WORKERS_PER_SERVICE:02d}" for n in range(count)],
            "change": ["registered"] * count,
            "reason": [None] * count,
            "wall_anchor": [WALL_ANCHOR] * count,
            "at": [0.0] * count,
        },
        schema=schema,
    )


def generate(
    directory: Path,
    rows: int,
    seed: int = 42,
    dialects: tuple[str, ...] = ("mdp02",),
    per_file: int = PER_FILE,
) -> list[Path]:
    """Write ``rows`` request records (and the workers file) into ``directory``; the files
    (of at most ``per_file`` records each)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = []
    for number, first in enumerate(range(0, rows, per_file)):
        path = directory / f"requests-20260921T000000Z-1-{number:06d}.parquet"
        pq.write_table(chunk(rng, first, min(per_file, rows - first), dialects), path)
        written.append(path)
    path = directory / "workers-20260921T000000Z-1-000000.parquet"
    pq.write_table(workers_table(), path)
    written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--dialects", default="mdp02", help="comma-separated; each client speaks one of them"
    )
    args = parser.parse_args()
    files = generate(args.directory, args.rows, args.seed, tuple(args.dialects.split(",")))
    print(f"wrote {args.rows} request records in {len(files)} files to {args.directory}")


if __name__ == "__main__":
    main()
