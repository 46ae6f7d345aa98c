"""Worker churn a peer can cause is rate-limited in the log (issue 27, finding 3).

One memo01 READY registers up to 256 services; 3,036 of them wrote 449,000 INFO lines (77 MB) in
10 s before. Now at most ``CHURN.burst`` lines of each kind a second are written, and the next
line written says how many were left out.
"""

from __future__ import annotations

import logging

import pytest

from domo import eventlog
from domo.eventlog import ViolationLimiter, log_event
from domo.protocol.events import WorkerDisconnected, WorkerRegistered


def test_a_burst_of_registrations_writes_a_bounded_number_of_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [0.0]
    monkeypatch.setattr(eventlog, "CHURN", ViolationLimiter(burst=100, clock=lambda: clock[0]))
    logger = logging.getLogger("domo.test.churn")
    with caplog.at_level(logging.INFO, logger="domo.test.churn"):
        for n in range(256 * 40):  # 40 READYs of 256 names in one second
            log_event(logger, WorkerRegistered(b"w%d" % n, b"svc-%d" % n, 0.0))
        for n in range(50):  # another kind has its own budget
            log_event(
                logger, WorkerDisconnected(b"w%d" % n, b"svc", "worker-disconnect", False, 0.0)
            )
        assert len(caplog.records) == 100 + 50
        clock[0] = 1.5  # the next second: the first line says what was left out
        log_event(logger, WorkerRegistered(b"late", b"svc", 1.5))
    last = caplog.records[-1].getMessage()
    assert "WorkerRegistered: worker 6c617465 serves 'svc'" in last
    assert f"and {256 * 40 - 100} more registrations of WorkerRegistered left out" in last
