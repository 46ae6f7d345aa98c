"""``domo titanic``, ``domo submit``, ``domo fetch`` and ``domo close`` as real processes:
exit codes, a Titanic SIGKILLed and restarted, and the database files it must refuse."""

from __future__ import annotations

import os
import shutil
import signal
import stat
from pathlib import Path

import pytest
import trio

from domo.cli import EXIT_CODES

from ..cli.conftest import DOMO, QUICK_BEATS, StartDomo, run_domo

EXIT_PENDING, EXIT_UNKNOWN, EXIT_STORE = 15, 16, 17
QUICK_RETRIES = ["--retry-initial", "0.2", "--retry-max", "0.5"]  # a worker is tried soon


async def _broker_and_titanic(domo: StartDomo, db: Path) -> tuple[str, int]:
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS)
    endpoint = await broker.endpoint()
    titanic = await domo(
        "titanic", "--connect", endpoint, "--db", str(db), *QUICK_BEATS, *QUICK_RETRIES
    )
    await titanic.line("domo titanic: serving")
    return endpoint, titanic.pid


def test_exit_codes_are_listed_for_each_new_command() -> None:
    assert (EXIT_PENDING, "stored, not answered yet: fetch again later") in EXIT_CODES["fetch"]
    assert EXIT_UNKNOWN in dict(EXIT_CODES["fetch"])
    assert EXIT_STORE in dict(EXIT_CODES["titanic"])
    assert len({code for code, _ in EXIT_CODES["fetch"]}) == len(EXIT_CODES["fetch"])


async def test_submit_fetch_close_exit_codes_and_a_killed_titanic(
    domo: StartDomo, tmp_path: Path
) -> None:
    """TSP-F-02, TSP-F-03, TSP-D-01, TSP-D-04: pending 10, done 0, unknown 11; a request
    stored before Titanic is SIGKILLed is served by the Titanic started after it."""
    db = tmp_path / "t.db"
    with trio.fail_after(90):
        endpoint, titanic_pid = await _broker_and_titanic(domo, db)
        at = ["--connect", endpoint]
        submitted = await run_domo("submit", "echo", "one", "two", *at)
        assert submitted.code == 0, submitted
        request_id = submitted.stdout.strip()
        assert len(request_id) == 32
        pending = await run_domo("fetch", request_id, *at, "--wait", "0.5")
        assert (pending.code, pending.stdout) == (EXIT_PENDING, ""), pending
        assert "pending" in pending.stderr
        assert pending.elapsed >= 0.5  # it fetched again for the time it was given

        os.kill(titanic_pid, signal.SIGKILL)  # a process this test started
        again = await domo(
            "titanic", "--connect", endpoint, "--db", str(db), *QUICK_BEATS, *QUICK_RETRIES
        )
        line = await again.line("domo titanic: serving")
        assert "1 pending" in line
        await domo("worker", "echo", *at, *QUICK_BEATS)
        with trio.fail_after(30):
            # 9/TSP is polled: 300 means "ask again later" (TSP-F-02).
            while (done := await run_domo("fetch", request_id, *at)).code == EXIT_PENDING:  # noqa: ASYNC110
                await trio.sleep(0.1)
        assert (done.code, done.stdout) == (0, "one\ntwo\n"), done
        closed = await run_domo("fetch", request_id, *at, "--close")
        assert closed.code == 0, closed
        unknown = await run_domo("fetch", request_id, *at)
        assert unknown.code == EXIT_UNKNOWN, unknown
        assert "unknown request id" in unknown.stderr
        assert (await run_domo("close", request_id, *at)).code == 0  # unknown: 200 all the same
        bad = await run_domo("fetch", "not-an-id", *at)
        assert bad.code == 2
        assert "not a request id" in bad.stderr


async def test_submit_without_titanic_times_out_with_a_hint() -> None:
    broker_less = await run_domo(
        "submit",
        "echo",
        "x",
        "--connect",
        "tcp://127.0.0.1:9",
        "--timeout",
        "0.2",
        "--retries",
        "0",
    )
    assert broker_less.code == 3, broker_less
    assert "is `domo titanic` running" in broker_less.stderr
    assert "Traceback" not in broker_less.stderr


async def test_a_second_titanic_on_the_same_file_is_refused(
    domo: StartDomo, tmp_path: Path
) -> None:
    """TSP-D-12: exit 17, one line, no traceback; the first one keeps serving."""
    db = tmp_path / "t.db"
    with trio.fail_after(60):
        endpoint, _ = await _broker_and_titanic(domo, db)
        second = await run_domo("titanic", "--connect", endpoint, "--db", str(db))
        assert second.code == EXIT_STORE, second
        assert "in use by another process" in second.stderr
        assert "Traceback" not in second.stderr
        submitted = await run_domo("submit", "echo", "still", "--connect", endpoint)
        assert submitted.code == 0, submitted


async def test_a_corrupt_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    """TSP-D-08: nothing is written over it."""
    db = tmp_path / "t.db"
    garbage = os.urandom(8192)
    db.write_bytes(garbage)
    refused = await run_domo("titanic", "--connect", "tcp://127.0.0.1:9", "--db", str(db))
    assert refused.code == EXIT_STORE, refused
    assert "not a usable SQLite database" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert db.read_bytes() == garbage


def _without_root_powers() -> list[str]:
    """A command prefix under which root obeys file modes (as any user does), or [] if the
    tests do not run as root. Root writes read-only files: setpriv drops the capabilities that
    let it (util-linux; the test is skipped where it is missing)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only file is writable by root")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


async def test_a_read_only_file_is_refused_and_keeps_its_requests(tmp_path: Path) -> None:
    """TSP-D-08: exit 17 with a plain reason; the stored requests are still in the file."""
    from domo.titanic.protocol import StoreRequest
    from domo.titanic.store import SqliteStore

    db = tmp_path / "t.db"
    store = SqliteStore(db)
    store.add([StoreRequest(b"a" * 32, b"echo", (b"kept",), 1.0)])
    store.close()
    db.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    prefix = _without_root_powers()
    with trio.fail_after(30):
        done = await trio.run_process(
            [*prefix, *DOMO, "titanic", "--connect", "tcp://127.0.0.1:9", "--db", str(db)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_STORE, stderr
    assert "read-only" in stderr
    assert "Traceback" not in stderr
    db.chmod(0o644)
    store = SqliteStore(db)
    assert list(store.pending()) == [(b"a" * 32, b"echo", 1.0)]
    store.close()
