"""The scheduling jitter of a fuzzing run, measured while it runs, for its timing windows.

Every silence and deadline the fuzzer judges is the agreed interval (times the liveness, where a
rule says so) plus a margin made of the jitter measured here, so that a conforming peer on a
loaded machine is not flagged and an idle machine still gets tight windows. Three kinds of
sample, each a number of seconds a message or a wake-up came later than it should have:

- ``wake``: the fuzzer's own lateness: a poll asked to return by ``t`` returned at ``t + x``
  (the machine's scheduling jitter, as the fuzzer's process meets it);
- ``heartbeat``: the spread of the target's heartbeat arrivals: how far one heartbeat-to-heartbeat
  gap is from the median of the recent ones (a peer heartbeating regularly at a wrong interval
  has no spread, so it cannot widen the windows that judge it);
- ``round_trip``: half the first probe's round trip (a fresh worker and client).

The jitter is the largest sample of the last ``horizon`` seconds (never less than ``floor``, never
more than ``cap``): a stall seen a moment ago widens the windows judged now. The fuzzer drains
what has arrived before it judges a silence, so its own stalls (recorded as ``wake``) cannot be
mistaken for the target's silence.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from typing import Final

__all__ = ["JitterMeter"]

FLOOR: Final = 0.005  # seconds: poll granularity (1 ms) and Python's own overhead
CAP: Final = 1.0  # seconds: beyond this a timing check judges nothing useful anyway
HORIZON: Final = 10.0  # seconds a sample counts for (a hundred intervals at 0.1 s)
_GAPS_KEPT: Final = 20  # heartbeat gaps the median is taken over, per source


class JitterMeter:
    """Samples of lateness from the run so far; :attr:`value` is the jitter to allow now."""

    def __init__(self, floor: float = FLOOR, cap: float = CAP, horizon: float = HORIZON) -> None:
        self.floor = floor
        self.cap = cap
        self.horizon = horizon
        # The largest sample of each second (bucket start, seconds): cheap to take the max of.
        self._buckets: deque[list[float]] = deque()
        self._gaps: dict[object, deque[float]] = {}
        self.largest: dict[str, float] = {}  # kind -> the largest sample ever (for reports)
        self._lock = threading.Lock()  # the lanes of a search share one meter

    def add(self, seconds: float, kind: str, now: float | None = None) -> None:
        """One sample of ``kind``: something came ``seconds`` later than it should have."""
        if seconds <= 0:
            return
        when = time.monotonic() if now is None else now
        with self._lock:
            self._add(seconds, kind, when)

    def _add(self, seconds: float, kind: str, when: float) -> None:
        if self._buckets and when - self._buckets[-1][0] < 1.0:
            self._buckets[-1][1] = max(self._buckets[-1][1], seconds)
        else:
            self._buckets.append([when, seconds])
        self.largest[kind] = max(self.largest.get(kind, 0.0), seconds)

    def wake(self, planned: float, now: float) -> None:
        """The fuzzer asked to wake at ``planned`` and woke at ``now``."""
        self.add(now - planned, "wake", now)

    def heartbeat_gap(self, source: object, gap: float, now: float | None = None) -> None:
        """A gap between two heartbeats of ``source`` (a worker connection, say)."""
        with self._lock:
            gaps = self._gaps.setdefault(source, deque(maxlen=_GAPS_KEPT))
            gaps.append(gap)
            spread = abs(gap - statistics.median(gaps)) if len(gaps) >= 3 else 0.0
        self.add(spread, "heartbeat", now)

    def round_trip(self, seconds: float, now: float | None = None) -> None:
        """A request's round trip through the target: half of it counts."""
        self.add(seconds / 2, "round_trip", now)

    @property
    def value(self) -> float:
        """The jitter to allow now: the largest sample of the last ``horizon`` seconds."""
        now = time.monotonic()
        with self._lock:
            while self._buckets and self._buckets[0][0] < now - self.horizon - 1.0:
                self._buckets.popleft()
            largest = max((seconds for _, seconds in self._buckets), default=0.0)
        return min(self.cap, max(self.floor, largest))
