"""Which trace files a report reads: footers checked with pyarrow before Spark sees them.

A file whose footer cannot be read (truncated, not Parquet, still being written) is skipped,
counted and named; a file of a schema version other than ours stops the report, since its
columns may mean something else (docs/traces.md: a reader refuses a version it does not know).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from domo.trace import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Scan", "scan"]

VERSION_KEY: Final = b"domo.trace.schema_version"
REQUEST_COLUMNS: Final = frozenset(
    {
        "request_id",
        "service",
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
    }
)
WORKER_COLUMNS: Final = frozenset({"worker", "service", "change", "wall_anchor", "at"})


@dataclass
class Scan:
    """The readable files of a trace directory, and what was wrong with the others."""

    requests: list[Path] = field(default_factory=list)
    workers: list[Path] = field(default_factory=list)
    corrupt: list[tuple[Path, str]] = field(default_factory=list)  # (file, why)
    other_versions: list[tuple[Path, str]] = field(default_factory=list)  # (file, version)
    request_rows: int = 0  # in the readable request files, from their footers
    rows: dict[Path, int] = field(default_factory=dict)  # records of each readable request file


def scan(directory: Path) -> Scan:
    """Sort the ``requests-*``/``workers-*`` Parquet files of ``directory`` (not recursive)."""
    import pyarrow.parquet as pq

    found = Scan()
    for kind, columns, into in (
        ("requests", REQUEST_COLUMNS, found.requests),
        ("workers", WORKER_COLUMNS, found.workers),
    ):
        for path in sorted(directory.glob(f"{kind}-*.parquet")):
            try:
                metadata = pq.read_metadata(path)
                schema = metadata.schema.to_arrow_schema()
            except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ...
                found.corrupt.append((path, _first_line(error)))
                continue
            version = (schema.metadata or {}).get(VERSION_KEY)
            if version is None:
                found.corrupt.append((path, "not a domo trace: no schema version"))
            elif version != str(SCHEMA_VERSION).encode():
                found.other_versions.append((path, version.decode("utf-8", "replace")))
            elif missing := columns - set(schema.names):
                found.corrupt.append((path, f"columns missing: {', '.join(sorted(missing))}"))
            else:
                into.append(path)
                if kind == "requests":
                    found.request_rows += metadata.num_rows
                    found.rows[path] = metadata.num_rows
    return found


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
