"""``domo report DIR --follow --html PAGE``: the page follows the directory as files land.

A ``domo report`` process follows a directory that starts empty; trace files arrive one by one,
as a broker's rotation closes them, and one arrives first as a broker leaves it while writing
(no footer yet): it is counted only once complete. Every read of the page, at any moment, is a
whole page (it is replaced by a rename, never written in place). Ctrl-C stops it: 130, one line,
the last page left as it was.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from domo import report

from .conftest import generate_traces

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class _Pages:
    """Reads the page in a loop while the test runs; keeps every distinct text it saw."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            if not self.seen or self.seen[-1] != text:
                self.seen.append(text)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _requests(page: str) -> int | None:
    found = re.search(r"\), (\d+) requests from (\d+) files", page)
    return None if found is None else int(found.group(1))


def test_follow_rewrites_the_page_as_files_land(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    source = generate_traces(tmp_path / "source", 60_000, per_file=20_000)
    files = sorted(source.glob("requests-*.parquet"))
    assert len(files) == 3
    live, page = tmp_path / "live", tmp_path / "page.html"
    live.mkdir()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "domo",
            "report",
            str(live),
            "--follow",
            "--html",
            str(page),
            "--interval",
            "0.5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pages = _Pages(page)
    lines: list[str] = []

    def until(condition: str, timeout: float = 180) -> str:
        """The first stderr line that contains ``condition`` (lines are read as they come)."""
        assert process.stderr is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                raise AssertionError(f"domo report ended: {process.wait()}: {lines}")
            lines.append(line)
            if condition in line:
                return line
        raise AssertionError(f"no {condition!r} in {lines}")

    try:
        until("0 requests from 0 files")
        assert "No complete request trace file" in page.read_text()
        shutil.copy(files[0], live / files[0].name)
        until("20000 requests from 1 files")
        # The second file as a broker leaves it while writing: no footer yet.
        data = files[1].read_bytes()
        (live / files[1].name).write_bytes(data[: len(data) // 2])
        until("20000 requests from 1 files (1 still being written)")
        partial = live / files[1].name
        temporary = live / ".closing"
        temporary.write_bytes(data)
        os.replace(temporary, partial)  # now closed: the footer is there
        shutil.copy(files[2], live / files[2].name)
        until("60000 requests from 3 files")
        final = page.read_text()
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == report.EXIT_INTERRUPTED
        assert process.stderr is not None
        rest = process.stderr.read()
    finally:
        pages.stop()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert rest == "domo report: stopped\n"
    assert page.read_text() == final  # the last page stays, whole
    assert "Last updated 20" in final
    assert "<meta http-equiv='refresh'" in final
    assert _requests(final) == 60000
    counts = [_requests(text) for text in pages.seen]
    assert all(text.endswith("</html>\n") for text in pages.seen)  # never half a page
    assert [count for count in counts if count is not None] == sorted(
        count for count in counts if count is not None
    )
    assert {20000, 60000} <= set(counts)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []
