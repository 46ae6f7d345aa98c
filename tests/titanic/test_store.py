"""``SqliteStore`` on real files: what it keeps, and how it refuses what it cannot do.

Every test uses a real SQLite file in a temporary directory; nothing is mocked.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from domo.titanic.protocol import RecordState, StoreRequest
from domo.titanic.store import SqliteStore, StoreError, StoreLocked


def rid(n: int) -> bytes:
    return f"{n:032x}".encode()


def request(n: int, service: bytes = b"echo", body: tuple[bytes, ...] = (b"x",)) -> StoreRequest:
    return StoreRequest(rid(n), service, body, float(n))


def test_a_request_is_committed_when_add_returns(tmp_path: Path) -> None:
    """TSP-D-01, TSP-D-03: another connection sees it at once: it is in the file, not a buffer."""
    path = tmp_path / "t.db"
    store = SqliteStore(path, synchronous="full")
    store.add([request(1, body=(b"a", b"", b"c"))])
    store.close()  # the lock goes with it; a new reader sees what was committed
    reader = sqlite3.connect(path)
    rows = reader.execute("SELECT id, service, state FROM requests").fetchall()
    reader.close()
    assert rows == [(rid(1), b"echo", "pending")]


def test_states_bodies_and_replies_round_trip(tmp_path: Path) -> None:
    """TSP-D-02, TSP-D-15: frames kept exactly; the body goes once the request is done."""
    store = SqliteStore(tmp_path / "t.db", synchronous="normal")
    store.add([request(1, body=(b"a", b"", b"\x00\xff")), request(2), request(3)])
    assert store.body(rid(1)) == (b"echo", [b"a", b"", b"\x00\xff"])
    assert store.record(rid(1)) is not None
    assert store.record(rid(1)).state is RecordState.PENDING  # type: ignore[union-attr]
    assert store.finish(rid(1), [b"r1", b""], 10.0)
    assert not store.finish(rid(1), [b"again"], 11.0)  # the first reply stored wins (TSP-D-04)
    done = store.record(rid(1))
    assert done is not None
    assert (done.state, done.reply) == (RecordState.DONE, (b"r1", b""))
    assert store.body(rid(1)) is None
    assert store.fail(rid(2), "no worker", 12.0)
    failed = store.record(rid(2))
    assert failed is not None
    assert (failed.state, failed.reason) == (RecordState.FAILED, "no worker")
    assert list(store.pending()) == [(rid(3), b"echo", 3.0)]
    assert store.counts() == {"pending": 1, "done": 1, "failed": 1}
    store.delete(rid(1))
    store.delete(rid(1))  # idempotent (TSP-S-11)
    assert store.record(rid(1)) is None
    store.close()


def test_pending_requests_survive_a_reopen_in_storing_order(tmp_path: Path) -> None:
    """TSP-D-04, TSP-D-14."""
    path = tmp_path / "t.db"
    store = SqliteStore(path)
    store.add([request(9), request(2)])
    store.add([request(5)])
    store.close()
    again = SqliteStore(path)
    assert [r for r, _, _ in again.pending()] == [rid(9), rid(2), rid(5)]
    again.close()


def test_purge_deletes_only_finished_records_older_than_the_cut(tmp_path: Path) -> None:
    """TSP-D-07: pending requests are never purged."""
    store = SqliteStore(tmp_path / "t.db")
    store.add([request(1), request(2), request(3), request(4)])
    store.finish(rid(1), [b"old"], 100.0)
    store.fail(rid(2), "old", 100.0)
    store.finish(rid(3), [b"new"], 200.0)
    assert store.purge(150.0) == 2
    assert store.record(rid(1)) is None
    assert store.record(rid(2)) is None
    assert store.record(rid(3)) is not None
    assert [r for r, _, _ in store.pending()] == [rid(4)]
    store.close()


def test_a_second_store_on_the_same_file_is_refused_and_the_first_keeps_working(
    tmp_path: Path,
) -> None:
    """TSP-D-12."""
    path = tmp_path / "t.db"
    first = SqliteStore(path)
    first.add([request(1)])
    with pytest.raises(StoreLocked, match="in use by another process"):
        SqliteStore(path)
    first.add([request(2)])
    assert len(list(first.pending())) == 2
    first.close()
    second = SqliteStore(path)  # free once the first is closed
    assert len(list(second.pending())) == 2
    second.close()


def test_a_full_database_refuses_new_requests_and_keeps_the_stored_ones(tmp_path: Path) -> None:
    """TSP-D-08: SQLITE_FULL from max_bytes; closing frees room again."""
    store = SqliteStore(tmp_path / "t.db", max_bytes=64 * 1024)
    stored = 0
    refused: StoreError | None = None
    for n in range(1000):
        try:
            store.add([request(n, body=(b"x" * 2000,))])
        except StoreError as error:
            refused = error
            break
        stored += 1
    assert refused is not None
    assert "is full" in str(refused)
    assert 5 < stored < 1000
    assert len(list(store.pending())) == stored
    assert store.body(rid(0)) == (b"echo", [b"x" * 2000])
    for n in range(stored):
        store.delete(rid(n))
    store.add([request(5000, body=(b"x" * 2000,))])  # room again
    store.close()


def test_a_file_that_is_not_a_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """TSP-D-08: nothing is written over a damaged (or foreign) file."""
    path = tmp_path / "t.db"
    garbage = b"this is not SQLite at all\n" * 200
    path.write_bytes(garbage)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        SqliteStore(path)
    assert path.read_bytes() == garbage


def test_a_database_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE titanic_meta SET value = '99' WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        SqliteStore(path)


def test_a_damaged_stored_message_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SqliteStore(path)
    store.add([request(1)])
    store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE requests SET body = x'00000009ff'")
    db.commit()
    db.close()
    store = SqliteStore(path)
    with pytest.raises(StoreError, match="damaged"):
        store.body(rid(1))
    store.close()


def test_synchronous_must_be_a_known_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteStore(tmp_path / "t.db", synchronous="extra")  # type: ignore[arg-type]


def test_a_transaction_commits_its_writes_together_or_not_at_all(tmp_path: Path) -> None:
    """TSP-D-01: group commit; a failure inside leaves nothing of the group."""
    path = tmp_path / "t.db"
    store = SqliteStore(path)
    with store.transaction():
        store.add([request(1)])
        store.add([request(2)])
        with store.transaction():  # nested: part of the outer one
            store.finish(rid(1), [b"r"], 5.0)
    assert store.counts() == {"pending": 1, "done": 1, "failed": 0}

    def twice() -> None:
        with store.transaction():
            store.add([request(3)])
            store.add([request(3)])  # the same id again: the whole group goes

    with pytest.raises(StoreError):
        twice()
    assert store.record(rid(3)) is None
    assert store.counts() == {"pending": 1, "done": 1, "failed": 0}
    store.add([request(4)])  # usable afterwards
    store.close()


def test_a_file_in_a_missing_directory_is_refused_plainly(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no directory"):
        SqliteStore(tmp_path / "nowhere" / "t.db")
