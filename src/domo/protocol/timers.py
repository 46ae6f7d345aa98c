"""A deadline heap with lazy invalidation, for timers that only ever move later.

Heartbeats, liveness expiry and queue expiry all have deadlines that move *later* as traffic
arrives (a heartbeat heard pushes a worker's expiry back). Updating a heap entry on every message
would cost a heap operation per message; instead the owner keeps the true deadline on its own
record and leaves the old entry in the heap. When an entry comes due, ``pop_due`` hands it back
and the owner compares it with the record: a stale entry is pushed again at the true deadline, a
record that is gone is simply forgotten. Work is therefore proportional to the timers that are
due, never to the number of records (``specs/mdp-0.2.md`` MDP-S-04).

The sequence number breaks ties deterministically (first pushed, first popped) and keeps the
heap from ever comparing two payloads.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["DeadlineHeap"]

T = TypeVar("T")


class DeadlineHeap(Generic[T]):
    """A min-heap of ``(deadline, payload)`` entries, popped in deadline then insertion order."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, deadline: float, payload: T) -> None:
        """Schedule ``payload`` at ``deadline``."""
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, payload))

    def earliest(self) -> float | None:
        """The earliest deadline in the heap (possibly of a stale entry), or None if empty."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> bool:
        """True if some entry has ``deadline <= now``."""
        heap = self._heap
        return bool(heap) and heap[0][0] <= now

    def compact(self, live: Callable[[float, T], bool]) -> None:
        """Drop every entry for which ``live(deadline, payload)`` is false, in O(n).

        Entries of records that left early (a queued request dispatched at once) would otherwise
        stay until their deadline; an owner that calls this once the heap is twice its live
        entries keeps it within a constant factor of them, at amortized O(1) per push.
        """
        self._heap = [entry for entry in self._heap if live(entry[0], entry[2])]
        heapq.heapify(self._heap)  # the sequence numbers keep their order

    def pop_due(self, now: float) -> Iterator[tuple[float, T]]:
        """Pop and yield every entry with ``deadline <= now``, earliest first.

        Entries pushed while iterating are popped too if they are already due, so a caller may
        re-push a stale entry at its true deadline from inside the loop.
        """
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, _, payload = heapq.heappop(heap)
            yield deadline, payload
