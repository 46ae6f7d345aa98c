"""Where Titanic keeps its requests: a small storage interface and its SQLite implementation.

``Store`` is what the Titanic runtime needs of a storage (``specs/tsp.md``, TSP-D-02); a server
database could implement it later. ``SqliteStore`` is the standard library's ``sqlite3`` on
one file in WAL mode. Every write is a committed transaction when the method returns, so a
request is on disk before its ``200`` is sent (TSP-D-01). How far "on disk" goes is the
``synchronous`` setting (TSP-D-03):

- ``full`` (the default): the WAL is synced at every commit; a committed request survives a
  process kill, an OS crash and a power cut (on storage that honours fsync).
- ``normal``: commits are synced only at checkpoints. A process kill loses nothing; an OS crash
  or a power cut may roll back the last commits (requests already answered ``200``), never
  corrupt the file.
- ``off``: never synced; a power cut may lose recent commits and, at a checkpoint, damage the
  file. For tests and benchmarks.

One server per file: the store takes SQLite's exclusive lock at open and holds it until closed
(a killed process's lock is released by the kernel), so a second Titanic on the same file is
refused with ``StoreLocked`` (TSP-D-12). Failures are ``StoreError`` with a plain message
(read-only, full, not a database, locked): the runtime answers ``500`` and keeps what is stored.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Final, Literal, Protocol

from .protocol import Record, RecordState, StoreRequest, pack_frames, unpack_frames

__all__ = [
    "SYNCHRONOUS",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoreLocked",
    "Synchronous",
]

Synchronous = Literal["off", "normal", "full"]
SYNCHRONOUS: Final[tuple[Synchronous, ...]] = ("off", "normal", "full")
SCHEMA_VERSION: Final = "1"


class StoreError(Exception):
    """The storage failed; the message says why in plain words."""


class StoreLocked(StoreError):
    """Another process (another Titanic) holds the database."""


class Store(Protocol):
    """What the Titanic runtime needs of a storage. Each write is durable when it returns,
    or, inside ``transaction()``, when the transaction ends (all its writes or none)."""

    def transaction(self) -> AbstractContextManager[None]:
        """Group the writes made inside into one commit (TSP-D-01's group commit)."""

    def add(self, requests: Sequence[StoreRequest]) -> None:
        """Store new pending requests, all or none, in one commit."""

    def body(self, request_id: bytes) -> tuple[bytes, list[bytes]] | None:
        """A pending request's service and body, or None if it is not pending any more."""

    def finish(self, request_id: bytes, reply: Sequence[bytes], now: float) -> bool:
        """Store a pending request's reply; False if it is not pending (closed meanwhile)."""

    def fail(self, request_id: bytes, reason: str, now: float) -> bool:
        """Record a pending request as given up; False if it is not pending."""

    def record(self, request_id: bytes) -> Record | None:
        """What ``titanic.reply`` needs to know of ``request_id``, or None if it is unknown."""

    def delete(self, request_id: bytes) -> None:
        """Forget a request and its reply (no error if it is unknown)."""

    def pending(self) -> Iterator[tuple[bytes, bytes, float]]:
        """The pending requests (id, service, created), oldest first: for a restart."""

    def purge(self, finished_before: float) -> int:
        """Delete the records that finished before ``finished_before``; how many went."""

    def close(self) -> None:
        """Release the storage (and its lock)."""


def _plain(error: sqlite3.Error, path: str) -> str:
    """An ``sqlite3`` error in a user's words, naming the file."""
    text = str(error)
    if "readonly" in text or "read-only" in text:
        return f"{path} is read-only (Titanic must write to it): {text}"
    if "disk is full" in text or "database or disk is full" in text:
        return f"{path} is full (the disk, or --max-db-bytes): {text}"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return f"{path} is not a usable SQLite database (corrupt?): {text}"
    if "unable to open" in text:
        return f"cannot open {path}: {text}"
    return f"{path}: {text}"


def _check_writable(path: str) -> None:
    """Refuse a file (or, for a new one, a directory) this process may not write: SQLite would
    open it read-only and fail later, less clearly (TSP-D-08)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise StoreError(
            f"{path}: no directory {directory} (Titanic makes the file, not its directory)"
        )
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise StoreError(f"{path} is read-only (Titanic must write to it)")
    if not os.access(directory, os.W_OK):  # the -wal file is made beside it
        raise StoreError(
            f"{path}: its directory {directory} is read-only (SQLite writes FILE-wal beside it)"
        )


class SqliteStore:
    """``Store`` on one SQLite file in WAL mode; see the module docstring.

    ``max_bytes`` caps the file (SQLite's ``max_page_count``): past it, adding a request fails
    with "full" and nothing stored is touched; closing requests frees room again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "full",
        max_bytes: int | None = None,
    ) -> None:
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}")
        self.path = os.fspath(path)
        self.synchronous = synchronous
        self._grouped = False  # inside transaction(): writes do not commit on their own
        _check_writable(self.path)
        try:
            # isolation_level=None: we say BEGIN and COMMIT ourselves; timeout 0: a file held by
            # another process is refused at once rather than waited for.
            self._db = sqlite3.connect(self.path, timeout=0, isolation_level=None)
        except sqlite3.Error as error:
            raise StoreError(_plain(error, self.path)) from None
        try:
            self._open(max_bytes)
        except sqlite3.OperationalError as error:
            self._db.close()
            if "locked" in str(error) or "busy" in str(error):
                raise StoreLocked(
                    f"{self.path} is in use by another process (another Titanic?): only one "
                    "server may use a database file"
                ) from None
            raise StoreError(_plain(error, self.path)) from None
        except sqlite3.Error as error:
            self._db.close()
            raise StoreError(_plain(error, self.path)) from None

    def _open(self, max_bytes: int | None) -> None:
        db = self._db
        # Exclusive: the lock is taken by the first transaction below and kept until close,
        # so a second server on this file fails at its own first transaction (TSP-D-12).
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"cannot use WAL mode (journal_mode stays {mode})")
        db.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
        if max_bytes is not None:
            page = db.execute("PRAGMA page_size").fetchone()[0]
            db.execute(f"PRAGMA max_page_count={max(1, max_bytes // page)}")
        db.execute("BEGIN EXCLUSIVE")
        try:
            db.execute("CREATE TABLE IF NOT EXISTS titanic_meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute(
                "CREATE TABLE IF NOT EXISTS requests ("
                " id BLOB PRIMARY KEY, service BLOB NOT NULL, body BLOB NOT NULL,"
                " created REAL NOT NULL, state TEXT NOT NULL, reply BLOB, reason TEXT,"
                " finished REAL)"
            )
            db.execute(
                "CREATE INDEX IF NOT EXISTS requests_finished ON requests (finished)"
                " WHERE finished IS NOT NULL"
            )
            row = db.execute("SELECT value FROM titanic_meta WHERE key = 'schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO titanic_meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(
                    f"schema version {row[0]}, this domo reads version {SCHEMA_VERSION}"
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    # --- writes: each one transaction, or part of the one ``transaction()`` opened -----------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One commit for every write inside: all of them are on disk when it ends, or none."""
        db = self._db
        if self._grouped:  # nested: the outer one commits
            yield
            return
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            raise StoreError(_plain(error, self.path)) from None
        self._grouped = True
        try:
            yield
            db.execute("COMMIT")
        except sqlite3.Error as error:
            raise StoreError(_plain(error, self.path)) from None
        finally:
            self._grouped = False
            if db.in_transaction:
                db.execute("ROLLBACK")

    def _write(self, sql: str, rows: Sequence[tuple[object, ...]]) -> int:
        db = self._db
        if self._grouped:
            try:
                return db.executemany(sql, rows).rowcount
            except sqlite3.Error as error:
                raise StoreError(_plain(error, self.path)) from None
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                cursor = db.executemany(sql, rows)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as error:
            raise StoreError(_plain(error, self.path)) from None
        return cursor.rowcount

    def add(self, requests: Sequence[StoreRequest]) -> None:
        self._write(
            "INSERT INTO requests (id, service, body, created, state) VALUES (?, ?, ?, ?, ?)",
            [
                (r.request_id, r.service, pack_frames(r.body), r.created, "pending")
                for r in requests
            ],
        )

    def finish(self, request_id: bytes, reply: Sequence[bytes], now: float) -> bool:
        changed = self._write(
            "UPDATE requests SET state = 'done', reply = ?, finished = ?, body = x''"
            " WHERE id = ? AND state = 'pending'",
            [(pack_frames(reply), now, request_id)],
        )
        return changed == 1

    def fail(self, request_id: bytes, reason: str, now: float) -> bool:
        changed = self._write(
            "UPDATE requests SET state = 'failed', reason = ?, finished = ?, body = x''"
            " WHERE id = ? AND state = 'pending'",
            [(reason, now, request_id)],
        )
        return changed == 1

    def delete(self, request_id: bytes) -> None:
        self._write("DELETE FROM requests WHERE id = ?", [(request_id,)])

    def purge(self, finished_before: float) -> int:
        return self._write("DELETE FROM requests WHERE finished < ?", [(finished_before,)])

    # --- reads ---------------------------------------------------------------------------------

    def _read(self, sql: str, parameters: tuple[object, ...]) -> list[tuple[object, ...]]:
        try:
            return self._db.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise StoreError(_plain(error, self.path)) from None

    def body(self, request_id: bytes) -> tuple[bytes, list[bytes]] | None:
        rows = self._read(
            "SELECT service, body FROM requests WHERE id = ? AND state = 'pending'", (request_id,)
        )
        if not rows:
            return None
        service, blob = rows[0]
        assert isinstance(service, bytes)
        assert isinstance(blob, bytes)
        return service, self._frames(blob)

    def record(self, request_id: bytes) -> Record | None:
        rows = self._read("SELECT state, reply, reason FROM requests WHERE id = ?", (request_id,))
        if not rows:
            return None
        state, reply, reason = rows[0]
        if state == "done":
            assert isinstance(reply, bytes)
            return Record(request_id, RecordState.DONE, reply=tuple(self._frames(reply)))
        if state == "failed":
            return Record(request_id, RecordState.FAILED, reason=str(reason))
        return Record(request_id, RecordState.PENDING)

    def pending(self) -> Iterator[tuple[bytes, bytes, float]]:
        rows = self._read(
            "SELECT id, service, created FROM requests WHERE state = 'pending' ORDER BY rowid", ()
        )
        for request_id, service, created in rows:
            assert isinstance(request_id, bytes)
            assert isinstance(service, bytes)
            assert isinstance(created, float | int)
            yield request_id, service, float(created)

    def counts(self) -> dict[str, int]:
        """How many records are in each state (``pending``, ``done``, ``failed``)."""
        counts = {"pending": 0, "done": 0, "failed": 0}
        for state, count in self._read("SELECT state, count(*) FROM requests GROUP BY state", ()):
            counts[str(state)] = int(count)  # type: ignore[call-overload]
        return counts

    def _frames(self, blob: bytes) -> list[bytes]:
        try:
            return unpack_frames(blob)
        except ValueError as error:
            raise StoreError(f"{self.path}: a stored message is damaged ({error})") from None

    def close(self) -> None:
        self._db.close()
