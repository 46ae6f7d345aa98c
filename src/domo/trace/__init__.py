"""Request traces: broker events folded into one Parquet record per request and per worker change.

``TraceRecorder.on_event`` runs on the broker's thread and only updates a dict and offers finished
records to a bounded queue (``put_nowait``): under overload a record is dropped and counted, the
broker never waits. A writer thread drains the queue into Parquet files (pyarrow), rotated by size
and age. An unwritable directory is a ``TraceDirError`` at start; a write that fails later (a full
disk) loses its batch, which is counted and logged, never raised. Schema: ``docs/traces.md``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
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


class TraceDirError(Exception):
    """The trace directory cannot be created or written to."""


@dataclass
class TraceStats:
    """Counts of what the recorder did; ``dropped`` (queue full) and ``lost`` (write failed)."""

    recorded: int = 0
    written: int = 0
    dropped: int = 0
    lost: int = 0
    files: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Open:
    """A request in flight, as far as the events have told."""

    request_id: int
    service: bytes
    client: bytes
    size: int
    received: float
    workers: list[bytes] = field(default_factory=list)
    dispatches: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    first_partial: float | None = None
    partial_bytes: int = 0
    redispatches: int = 0


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


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


class TraceRecorder:
    """Folds broker events into trace records and writes them to ``directory`` off the hot path.

    ``wall_anchor`` is ``time.time()`` minus the broker's clock at the same instant: add it to any
    timestamp of a record for wall-clock seconds. ``max_bytes``/``max_seconds`` rotate the files;
    ``buffer`` bounds the records waiting for the writer.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        wall_anchor: float,
        dialect: str | None = "mdp02",
        buffer: int = 100_000,
        batch: int = 10_000,
        flush_interval: float = 1.0,
        max_bytes: int = 64 * 1024 * 1024,
        max_seconds: float = 3600.0,
    ) -> None:
        try:
            import pyarrow  # noqa: F401
        except ImportError as exc:
            raise ImportError(INSTALL_HINT) from exc
        self.directory = check_trace_dir(directory)
        self.wall_anchor = wall_anchor
        self.dialect = dialect
        self.stats = TraceStats()
        self._open: dict[int, _Open] = {}
        self._queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue(buffer)
        self._batch = batch
        self._flush_interval = flush_interval
        self._max_bytes = max_bytes
        self._max_seconds = max_seconds
        self._writer = threading.Thread(target=self._write_loop, name="domo-trace", daemon=True)
        self._writer.start()

    # --- broker thread ------------------------------------------------------------------------

    def on_event(self, event: BrokerEvent) -> None:
        """Fold one broker event in; never blocks."""
        match event:  # the three events of every request first
            case RequestQueued():
                self._open[event.request_id] = _Open(
                    event.request_id, event.service, event.client, event.size, event.at
                )
            case RequestDispatched():
                if (r := self._open.get(event.request_id)) is not None:
                    r.workers.append(event.worker)
                    r.dispatches.append(event.at)
                    r.waits.append(event.waited)
            case RequestCompleted():
                self._finish(event.request_id, event.at, "completed", event.size, event.partials)
            case RequestRedispatched():
                if (r := self._open.get(event.request_id)) is not None:
                    r.redispatches += 1
            case PartialForwarded():
                if (r := self._open.get(event.request_id)) is not None:
                    if r.first_partial is None:
                        r.first_partial = event.at
                    r.partial_bytes += event.size
            case RequestExpired():
                self._finish(event.request_id, event.at, "expired")
            case RequestDropped():
                self._finish(event.request_id, event.at, "dropped", drop_reason=event.reason)
            case WorkerRegistered():
                self._worker(event.worker, event.service, "registered", None, event.at)
            case WorkerExpired():
                self._worker(event.worker, event.service, "expired", None, event.at)
            case WorkerDisconnected():
                self._worker(event.worker, event.service, "disconnected", event.reason, event.at)
            case _:
                pass

    def _finish(
        self,
        request_id: int,
        at: float,
        outcome: str,
        reply_size: int | None = None,
        partials: int = 0,
        drop_reason: str | None = None,
    ) -> None:
        r = self._open.pop(request_id, None)
        if r is None:
            return
        self._offer(
            "requests",
            (
                r.request_id,
                _text(r.service),
                r.client,
                r.workers,
                self.dialect,
                self.wall_anchor,
                r.received,
                r.dispatches,
                r.waits,
                r.first_partial,
                at,
                outcome,
                r.redispatches,
                r.size,
                reply_size,
                partials,
                r.partial_bytes,
                drop_reason,
                None,  # rule: the core's RequestDropped carries a reason, not a rule id
            ),
        )

    def _worker(
        self, worker: bytes, service: bytes, change: str, reason: str | None, at: float
    ) -> None:
        record = (worker, _text(service), change, reason, self.wall_anchor, at)
        self._offer("workers", record)

    def _offer(self, kind: str, record: tuple[Any, ...]) -> None:
        self.stats.recorded += 1
        try:
            self._queue.put_nowait((kind, record))
        except queue.Full:
            self.stats.dropped += 1

    def close(self, timeout: float = 10.0) -> TraceStats:
        """Flush what is queued, stop the writer, log and return the counts."""
        while True:
            try:
                self._queue.put(None, timeout=timeout)
                break
            except queue.Full:  # pragma: no cover - the writer is stuck on a dead disk
                break
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

        schemas = dict(zip(("requests", "workers"), _schemas(), strict=True))
        writers: dict[str, tuple[Any, Path, float]] = {}
        pending: dict[str, list[tuple[Any, ...]]] = {"requests": [], "workers": []}
        seq = 0
        stop = False
        last_flush = time.monotonic()

        def close_writer(kind: str) -> None:
            entry = writers.pop(kind, None)
            if entry is not None:
                try:
                    entry[0].close()
                except OSError as exc:
                    logger.error("trace: closing %s failed: %s", entry[1], exc)

        def flush(kind: str) -> None:
            nonlocal seq
            rows = pending[kind]
            if not rows:
                return
            pending[kind] = []
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
                    entry = (pq.ParquetWriter(path, schemas[kind]), path, time.monotonic())
                    writers[kind] = entry
                    self.stats.files.append(str(path))
                schema = schemas[kind]
                columns = [
                    pa.array(column, type=schema.field(index).type)
                    for index, column in enumerate(zip(*rows, strict=True))
                ]
                table = pa.Table.from_arrays(columns, schema=schema)
                entry[0].write_table(table)
                self.stats.written += len(rows)
            except (OSError, pa.ArrowException) as exc:
                self.stats.lost += len(rows)
                logger.error("trace: %d %s records lost: %s", len(rows), kind, exc)
                close_writer(kind)

        while not stop:
            try:
                item = self._queue.get(timeout=self._flush_interval)
            except queue.Empty:
                item = ("", ())
            if item is None:
                stop = True
            elif item[0]:
                pending[item[0]].append(item[1])
            full = any(len(rows) >= self._batch for rows in pending.values())
            if stop or full or time.monotonic() - last_flush >= self._flush_interval:
                for kind in pending:
                    flush(kind)
                last_flush = time.monotonic()
        for kind in list(writers):
            close_writer(kind)
