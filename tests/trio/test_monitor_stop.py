"""A broker's stop cannot hang in libzmq's socket monitor (the closed-connection report of
MDP-D-31): the shutdown paths of ``tests/trio/monitor_stop.py``, looped in a subprocess that
dumps its threads' stacks and exits 1 if it is stuck (a lock held in libzmq is out of reach of
any Python timeout). Before the fix, ``broker`` hung within 10 of its 40 rounds here, in
``disable_monitor`` from the broker's ``_report_closed``, as the issue saw it; ``close`` hung
in its first round and ``unread`` stopped serving after about 2,000 connections."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.io


@pytest.mark.parametrize(("mode", "rounds"), [("close", 50), ("unread", 2100), ("broker", 40)])
def test_watched_socket_stops_without_hanging(mode: str, rounds: int) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tests.trio.monitor_stop", mode, str(rounds)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,  # the script's own deadline is 30 s
        check=False,
    )
    assert (run.returncode, run.stdout) == (0, "ok\n"), run.stderr
