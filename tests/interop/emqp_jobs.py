"""Jobs for EventMQ's jobmanager in tests/interop/test_eventmq.py (imported by its workers).

Runs inside EventMQ's virtualenv, in a jobmanager's worker process; plain Python, no domo.
"""

from __future__ import annotations

import os
import time


def add(a: int, b: int) -> int:
    """A quick job with a result."""
    return a + b


def once_slow(marker: str, seconds: float, value: str) -> str:
    """Slow the first time (it leaves ``marker`` as it starts), quick when run again: a job
    re-routed after its jobmanager was killed finishes on the next one."""
    if os.path.exists(marker):
        return value + " (again)"
    with open(marker, "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(seconds)
    return value
