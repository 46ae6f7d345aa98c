"""Ctrl-C at each stage of ``domo report``: exit 130, one line, no output file, no JVM left.

A real SIGINT, sent as a terminal sends it, to the whole process group of a ``domo report``
subprocess (its own session: the group is the one this test started, nothing else). Its stderr
is a pseudo-terminal, so that the progress line says which stage it is in: the signal goes when
the JVM is starting, while Spark folds the records, and while the report is drawn.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from domo import report

from .conftest import descendants, generate_traces

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PROGRESS = re.compile(r"domo report: \[\d+/\d+\] ")


@pytest.fixture(scope="module")
def million(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 M synthetic records: the fold runs for seconds, long enough to be interrupted."""
    pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'domo[spark]'")
    return generate_traces(tmp_path_factory.mktemp("million"), 1_000_000)


def _interrupt(
    traces: Path, out: Path, when: Callable[[str, list[int]], bool]
) -> tuple[int | None, str, set[int]]:
    """Run ``domo report``, SIGINT its process group once ``when(stderr, jvms)`` holds.

    Returns the exit code (None: it ended before the signal), the terminal's text, and the
    JVMs it had started.
    """
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "domo",
            "report",
            str(traces),
            "--html",
            str(out / "report.html"),
            "--out",
            str(out / "tables"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    text = ""
    jvms: set[int] = set()
    signalled = False
    deadline = time.monotonic() + 240
    try:
        os.set_blocking(master, False)
        while process.poll() is None and time.monotonic() < deadline:
            try:
                text += os.read(master, 4096).decode(errors="replace")
            except BlockingIOError:
                time.sleep(0.05)
            except OSError:  # the other end closed
                break
            jvms |= {pid for pid, name in descendants(process.pid) if name == "java"}
            if not signalled and when(text, sorted(jvms)):
                os.killpg(process.pid, signal.SIGINT)
                signalled = True
        code = process.wait(timeout=60)
        while True:
            try:
                chunk = os.read(master, 4096)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            text += chunk.decode(errors="replace")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        os.close(master)
    return (code if signalled else None), text, jvms


def _check(code: int | None, text: str, jvms: set[int], out: Path) -> None:
    """130, one line (besides the progress line, which rewrites itself), nothing written."""
    lines = text.replace("\x1b[K", "").replace("\r", "\n").split("\n")
    said = [line for line in lines if line.strip() and not PROGRESS.match(line)]
    assert code == report.EXIT_INTERRUPTED == 130, text
    assert said == ["domo report: interrupted, nothing written"], text
    assert sorted(path.name for path in out.iterdir()) == []  # no file, no temporary
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() for pid in jvms) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in jvms if Path(f"/proc/{pid}").exists()] == []  # the JVM is gone


def test_ctrl_c_while_the_jvm_starts(million: Path, tmp_path: Path) -> None:
    code, text, jvms = _interrupt(million, tmp_path, lambda text, jvms: bool(jvms))
    assert jvms
    assert "[1/3]" not in text  # still starting: Spark had not begun the fold
    _check(code, text, jvms, tmp_path)


def test_ctrl_c_while_spark_folds(million: Path, tmp_path: Path) -> None:
    code, text, jvms = _interrupt(million, tmp_path, lambda text, _: "[1/3] folding" in text)
    _check(code, text, jvms, tmp_path)
