"""Request traces: broker events folded into one Parquet record per request and per worker change.

``TraceRecorder.on_event`` runs on the broker's thread and does as little as it can there: it keeps
the events of a request in flight (references, no copies), and when the request ends it appends one
tuple of plain values to a bounded deque. Under overload a record is dropped and counted; the
broker never waits and never takes a lock. A writer thread is woken once per batch (or every
``flush_interval``), drains the deque in C (``islice`` over ``popleft``), turns the rows into Arrow
columns and writes them to Parquet files (pyarrow), rotated by size and age. The writer holds the
GIL only for those C calls, a few hundred nanoseconds a record; Parquet encoding and the file
write run without it. An unwritable directory is a ``TraceDirError`` at start; a write that fails
later (a full disk) loses its batch, which is counted and logged, never raised.
Schema: ``docs/traces.md``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Final

from domo.protocol.events import (
    BrokerEvent,
    PartialForwarded,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    RequestRedispatched,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)

__all__ = ["SCHEMA_VERSION", "TraceDirError", "TraceRecorder", "TraceStats", "check_trace_dir"]

logger = logging.getLogger("domo.trace")

SCHEMA_VERSION: Final = 1
INSTALL_HINT: Final = "tracing needs pyarrow: pip install 'domo[trace]'"
SLICE: Final = 2048  # rows turned into Arrow columns per C call: the writer's GIL holds stay short
NAME_CACHE: Final = 4096  # decoded service names kept; past it the cache starts over


class TraceDirError(Exception):
    """The trace directory cannot be created or written to."""


@dataclass
class TraceStats:
    """Counts of what the recorder did; ``dropped`` (buffer full) and ``lost`` (write failed).

    ``dropped`` is counted as it happens; ``recorded``, ``written`` and ``lost`` once per batch
    the writer takes, and exactly by ``close``.
    """

    recorded: int = 0
    written: int = 0
    dropped: int = 0
    lost: int = 0
    files: list[str] = field(default_factory=list)


def check_trace_dir(directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` if needed and prove it writable, or raise ``TraceDirError``."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".domo-trace-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise TraceDirError(f"trace directory {path} is not writable: {exc}") from exc
    return path


def _schemas() -> tuple[Any, Any]:
    import pyarrow as pa

    meta = {b"domo.trace.schema_version": str(SCHEMA_VERSION).encode()}
    requests = pa.schema(
        [
            ("request_id", pa.int64()),
            ("service", pa.string()),
            ("client", pa.binary()),
            ("workers", pa.list_(pa.binary())),
            ("dialect", pa.string()),
            ("wall_anchor", pa.float64()),
            ("received", pa.float64()),
            ("dispatches", pa.list_(pa.float64())),
            ("queue_waits", pa.list_(pa.float64())),
            ("first_partial", pa.float64()),
            ("finished", pa.float64()),
            ("outcome", pa.string()),
            ("redispatches", pa.int32()),
            ("request_size", pa.int64()),
            ("reply_size", pa.int64()),
            ("partials", pa.int32()),
            ("partial_bytes", pa.int64()),
            ("drop_reason", pa.string()),
            ("rule", pa.string()),
        ],
        metadata=meta,
    )
    workers = pa.schema(
        [
            ("worker", pa.binary()),
            ("service", pa.string()),
            ("change", pa.string()),
            ("reason", pa.string()),
            ("wall_anchor", pa.float64()),
            ("at", pa.float64()),
        ],
        metadata=meta,
    )
    return requests, workers


# The columns of the schema that a row tuple carries, in its order; the others are the same for
# every record of a recorder (wall_anchor) and are made once per batch.
_REQUEST_ROW: Final = (
    "request_id",
    "service",
    "client",
    "workers",
    "received",
    "dispatches",
    "queue_waits",
    "first_partial",
    "finished",
    "outcome",
    "redispatches",
    "request_size",
    "reply_size",
    "partials",
    "partial_bytes",
    "drop_reason",
    "dialect",
    "rule",
)
_WORKER_ROW: Final = ("worker", "service", "change", "reason", "at")


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


def _table(schema: Any, carried: tuple[str, ...], constant: dict[str, Any], rows: list[Any]) -> Any:
    """``rows`` (tuples of the ``carried`` columns) as an Arrow table of ``schema``.

    Made by C calls over at most ``SLICE`` rows each (the GIL is held for each call, briefly);
    the columns every record shares come from ``constant``.
    """
    import pyarrow as pa

    parts = []
    for start in range(0, len(rows), SLICE):
        part = rows[start : start + SLICE]
        given = dict(zip(carried, zip(*part, strict=True), strict=True))
        columns = []
        for column in schema:
            if column.name in given:
                columns.append(pa.array(given[column.name], type=column.type))
            elif constant[column.name] is None:
                columns.append(pa.nulls(len(part), type=column.type))
            else:
                scalar = pa.scalar(constant[column.name], type=column.type)
                columns.append(pa.repeat(scalar, len(part)))
        parts.append(pa.RecordBatch.from_arrays(columns, schema=schema))
    return pa.Table.from_batches(parts, schema=schema)


class TraceRecorder:
    """Folds broker events into trace records and writes them to ``directory`` off the hot path.

    ``wall_anchor`` is ``time.time()`` minus the broker's clock at the same instant: add it to any
    timestamp of a record for wall-clock seconds. ``max_bytes``/``max_seconds`` rotate the files;
    ``buffer`` bounds the records waiting for the writer (of each kind); ``batch`` records waiting
    wake the writer, which otherwise wakes every ``flush_interval`` seconds. ``dialect`` is a
    record's dialect unless ``dialect_of`` (a request's client peer, as the broker's events name
    it, to the dialect it speaks: ``FamilyBroker.dialect_of``) says otherwise.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        wall_anchor: float,
        dialect: str | None = "mdp02",
        dialect_of: Callable[[bytes], str | None] | None = None,
        buffer: int = 100_000,
        batch: int = 10_000,
        flush_interval: float = 1.0,
        max_bytes: int = 64 * 1024 * 1024,
        max_seconds: float = 3600.0,
    ) -> None:
        try:
            # Here, before the broker serves: importing pyarrow.parquet takes a few hundred ms
            # of CPU, which the writer thread would otherwise spend (holding the GIL) while the
            # first requests come in.
            import pyarrow.parquet  # noqa: F401
        except ImportError as exc:
            raise ImportError(INSTALL_HINT) from exc
        self.directory = check_trace_dir(directory)
        self.wall_anchor = wall_anchor
        self.dialect = dialect
        # The dialect of each request's client, where it is not ``dialect``: asked when the
        # request is queued (the broker may forget the client's key before it ends).
        self._dialect_of = dialect_of
        self._dialects: dict[int, str | None] = {}
        self.stats = TraceStats()
        # A request in flight: its RequestQueued, then (queued, dispatch, ...) once dispatched,
        # the core's own events (nothing is copied until it ends). PARTIALs and re-dispatches
        # are rare: a request's [first_partial, partial_bytes, redispatches] is kept apart.
        self._open: dict[int, Any] = {}
        self._extra: dict[int, list[Any]] = {}
        self._names: dict[bytes, str] = {}
        # Finished rows. deque.append and popleft are atomic under the GIL and only this
        # recorder's two threads touch them: the broker's appends, the writer's pops.
        self._requests: deque[tuple[Any, ...]] = deque()
        self._workers: deque[tuple[Any, ...]] = deque()
        self._buffer = buffer
        self._batch = max(1, batch)
        self._wake_at = max(1, min(batch, buffer))
        self._wake = threading.Event()
        self._stopping = False
        self._flush_interval = flush_interval
        self._max_bytes = max_bytes
        self._max_seconds = max_seconds
        requests, workers = _schemas()
        # each kind: its buffer, its schema, the columns a row carries, the ones all share
        self._kinds: dict[str, tuple[deque[tuple[Any, ...]], Any, tuple[str, ...], Any]] = {
            "requests": (
                self._requests,
                requests,
                _REQUEST_ROW,
                {"wall_anchor": wall_anchor},
            ),
            "workers": (self._workers, workers, _WORKER_ROW, {"wall_anchor": wall_anchor}),
        }
        self._warm_up()
        self._writer = threading.Thread(target=self._write_loop, name="domo-trace", daemon=True)
        self._writer.start()

    def _warm_up(self) -> None:
        """Write one record of each kind to memory, so that the first real batch costs no more.

        pyarrow's first ``pa.array`` call alone takes ~0.2 s of CPU (it looks for pandas); the
        writer thread would spend it holding the GIL while the broker serves its first requests.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        # one record of each kind, its values in the order of _REQUEST_ROW and _WORKER_ROW
        request = (0, "", b"", (b"",), 0.0, (0.0,), (0.0,), None, 0.0, "", 0, 0, 0, 0, 0, "")
        sample = {"requests": (*request, "", ""), "workers": (b"", "", "", None, 0.0)}
        for kind, (_, schema, carried, constant) in self._kinds.items():
            with pq.ParquetWriter(pa.BufferOutputStream(), schema) as writer:
                writer.write_table(_table(schema, carried, constant, [sample[kind]]))

    # --- broker thread ------------------------------------------------------------------------

    def on_event(self, event: BrokerEvent) -> None:
        """Fold one broker event in; never blocks, never takes a lock."""
        kind = type(event)  # the three events of every request first, by identity
        if kind is RequestQueued:
            self._open[event.request_id] = event  # type: ignore[union-attr]
            if self._dialect_of is not None:
                dialect = self._dialect_of(event.client)  # type: ignore[union-attr]
                if dialect != self.dialect:
                    self._dialects[event.request_id] = dialect  # type: ignore[union-attr]
            return
        if kind is RequestDispatched:
            request_id = event.request_id  # type: ignore[union-attr]
            held = self._open.get(request_id)
            if held is not None:
                # (queued, dispatch, ...): one short-lived tuple per dispatch, no list
                self._open[request_id] = (
                    (held, event) if type(held) is RequestQueued else (*held, event)
                )
            return
        match event:
            case RequestCompleted():
                self._finish(
                    event.request_id, event.at, "completed", event.size, event.partials, None, None
                )
            case RequestRedispatched():
                if event.request_id in self._open:
                    self._extra_of(event.request_id)[2] += 1
            case PartialForwarded():
                if event.request_id in self._open:
                    extra = self._extra_of(event.request_id)
                    if extra[0] is None:
                        extra[0] = event.at
                    extra[1] += event.size
            case RequestExpired():
                self._finish(event.request_id, event.at, "expired", None, 0, None, None)
            case RequestDropped():
                self._finish(
                    event.request_id, event.at, "dropped", None, 0, event.reason, event.rule
                )
            case WorkerRegistered():
                self._worker(event.worker, event.service, "registered", None, event.at)
            case WorkerExpired():
                self._worker(event.worker, event.service, "expired", None, event.at)
            case WorkerDisconnected():
                self._worker(event.worker, event.service, "disconnected", event.reason, event.at)
            case _:
                pass

    def _extra_of(self, request_id: int) -> list[Any]:
        extra = self._extra.get(request_id)
        if extra is None:
            extra = self._extra[request_id] = [None, 0, 0]
        return extra

    def _name(self, service: bytes) -> str:
        name = self._names.get(service)
        if name is None:
            if len(self._names) >= NAME_CACHE:
                self._names.clear()
            name = self._names[service] = _text(service)
        return name

    def _finish(
        self,
        request_id: int,
        at: float,
        outcome: str,
        reply_size: int | None,
        partials: int,
        drop_reason: str | None,
        rule: str | None,
    ) -> None:
        held = self._open.pop(request_id, None)
        if held is None:
            return
        dialect = self.dialect
        if self._dialects:
            dialect = self._dialects.pop(request_id, dialect)
        rows = self._requests
        if len(rows) >= self._buffer:
            self.stats.dropped += 1
            if self._extra:
                self._extra.pop(request_id, None)
            return
        # A row holds only ints, floats, str, bytes, None and tuples of them: the garbage
        # collector stops tracking it at its first pass, so a buffered batch costs it nothing.
        if type(held) is RequestQueued:  # never dispatched (an expiry, say)
            queued = held
            workers: tuple[Any, ...] = ()
            dispatches: tuple[Any, ...] = ()
            waits: tuple[Any, ...] = ()
        elif len(held) == 2:  # dispatched once: the common case
            queued, dispatch = held
            workers = (dispatch.worker,)
            dispatches = (dispatch.at,)
            waits = (dispatch.waited,)
        else:
            queued = held[0]
            workers = tuple(dispatch.worker for dispatch in held[1:])
            dispatches = tuple(dispatch.at for dispatch in held[1:])
            waits = tuple(dispatch.waited for dispatch in held[1:])
        first_partial = None
        partial_bytes = redispatches = 0
        if self._extra and (extra := self._extra.pop(request_id, None)) is not None:
            first_partial, partial_bytes, redispatches = extra
        service = queued.service
        rows.append(
            (
                request_id,
                self._names.get(service) or self._name(service),
                queued.client,
                workers,
                queued.at,
                dispatches,
                waits,
                first_partial,
                at,
                outcome,
                redispatches,
                queued.size,
                reply_size,
                partials,
                partial_bytes,
                drop_reason,
                dialect,
                rule,
            )
        )
        if len(rows) == self._wake_at:
            self._wake.set()

    def _worker(
        self, worker: bytes, service: bytes, change: str, reason: str | None, at: float
    ) -> None:
        rows = self._workers
        if len(rows) >= self._buffer:
            self.stats.dropped += 1
            return
        rows.append((worker, self._name(service), change, reason, at))
        if len(rows) == self._wake_at:
            self._wake.set()

    def close(self, timeout: float = 10.0) -> TraceStats:
        """Flush what is buffered, stop the writer, log and return the counts."""
        self._stopping = True
        self._wake.set()
        self._writer.join(timeout)
        s = self.stats
        level = logging.WARNING if s.dropped or s.lost else logging.INFO
        logger.log(
            level,
            "trace: %d records written to %d files, %d dropped (buffer full), "
            "%d lost (write failed)",
            s.written,
            len(s.files),
            s.dropped,
            s.lost,
        )
        return s

    # --- writer thread ------------------------------------------------------------------------

    def _write_loop(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        writers: dict[str, tuple[Any, Path, float]] = {}
        seq = 0
        taken = 0
        batch = self._batch

        def close_writer(kind: str) -> None:
            entry = writers.pop(kind, None)
            if entry is not None:
                try:
                    entry[0].close()
                except OSError as exc:
                    logger.error("trace: closing %s failed: %s", entry[1], exc)

        def write(kind: str, rows: list[tuple[Any, ...]]) -> None:
            nonlocal seq
            _, schema, carried, constant = self._kinds[kind]
            try:
                entry = writers.get(kind)
                if entry is not None and (
                    entry[1].stat().st_size >= self._max_bytes
                    or time.monotonic() - entry[2] >= self._max_seconds
                ):
                    close_writer(kind)
                    entry = None
                if entry is None:
                    seq += 1
                    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
                    path = self.directory / f"{kind}-{stamp}-{os.getpid()}-{seq:05d}.parquet"
                    entry = (pq.ParquetWriter(path, schema), path, time.monotonic())
                    writers[kind] = entry
                    self.stats.files.append(str(path))
                # encoding and writing run without the GIL
                entry[0].write_table(_table(schema, carried, constant, rows))
                self.stats.written += len(rows)
            except (OSError, pa.ArrowException) as exc:
                self.stats.lost += len(rows)
                logger.error("trace: %d %s records lost: %s", len(rows), kind, exc)
                close_writer(kind)

        while True:
            self._wake.wait(self._flush_interval)
            self._wake.clear()
            stop = self._stopping  # read before the drain: what the broker appended is in it
            for kind, (buffered, _, _, _) in self._kinds.items():
                # What is there now (only this thread pops, so at least that many), popped in
                # C, at most a batch per write (files rotate between writes). Rows appended
                # meanwhile wait for the next wake-up: small row groups cost a write each.
                waiting = len(buffered)
                while waiting:
                    rows = list(islice(iter(buffered.popleft, None), min(waiting, batch)))
                    waiting -= len(rows)
                    taken += len(rows)
                    write(kind, rows)
            self.stats.recorded = taken + self.stats.dropped
            if stop:
                break
        for kind in list(writers):
            close_writer(kind)
