"""The broker's count of bytes pending in ZeroMQ's outbound pipes, all peers together (MDP-D-30).

ZeroMQ bounds each peer's pipe in messages only (MDP-D-27), so N peers that stop reading can
hold N times ``max_peer_bytes``. ``PendingBytes`` bounds their sum. It counts what it can know:
a message of ``PENDING_FROM`` bytes or more is sent with its last frame handed to ZeroMQ
without a copy and *tracked* (pyzmq's ``MessageTracker``), so the count learns when ZeroMQ has
let go of it: written to the network, or discarded with its connection. A peer's pipe is
first in, first out, so once a message's last frame is let go of, the whole message is. A
message that would take the count over the bound is not sent, and the runtime reports its peer
as it reports a full pipe (``PENDING_FULL``, then MDP-D-15).

Smaller messages are copied by ZeroMQ, whose copies pyzmq cannot track; they stay bounded per
peer only, at most ``pipe_messages`` of under ``PENDING_FROM`` bytes each (docs/reliability.md).

The count is an upper bound: a tracker is seen done a moment after ZeroMQ let go (pyzmq's
garbage-collection thread sets it), and done trackers are collected only when a message would
not fit otherwise, or when the entries pile up (amortized O(1) per message).
"""

from __future__ import annotations

import errno
from collections import deque
from typing import Final, Protocol

from domo.protocol.broker import PENDING_FROM

__all__ = ["PENDING_FROM", "PENDING_FULL", "PendingBytes", "Tracker"]

# The send result a connection gives for a message refused by the bound (besides SENT, EAGAIN
# and EHOSTUNREACH): "no buffer space available" is what it is.
PENDING_FULL: Final = errno.ENOBUFS
_SLACK: Final = 64  # entries allowed beyond twice the live ones before a collection


class Tracker(Protocol):
    """What ``PendingBytes`` needs of a ``zmq.MessageTracker``."""

    @property
    def done(self) -> bool: ...


class PendingBytes:
    """Bytes of tracked messages handed to ZeroMQ and not yet let go of, against ``limit``.

    ``admit(size)`` before the send, ``add(tracker, size)`` after it. ``total`` never exceeds
    ``limit``: ``admit`` says no to a message that would take it over, after collecting what
    ZeroMQ has let go of. ``peak`` is the largest ``total`` seen, ``refused`` the messages
    refused.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the pending bytes' limit must be >= 1, got {limit}")
        self.limit = limit
        self.total = 0
        self.peak = 0
        self.refused = 0
        self._entries: deque[tuple[Tracker, int]] = deque()
        self._collect_at = _SLACK

    def admit(self, size: int) -> bool:
        """May a tracked message of ``size`` bytes be sent now? Counts a refusal."""
        if self.total + size <= self.limit:
            return True
        self.collect()
        if self.total + size <= self.limit:
            return True
        self.refused += 1
        return False

    def add(self, tracker: Tracker, size: int) -> None:
        """Count a message just handed to ZeroMQ, until ``tracker`` is done."""
        self._entries.append((tracker, size))
        self.total += size
        if self.total > self.peak:
            self.peak = self.total
        if len(self._entries) > self._collect_at:
            self.collect()

    def collect(self) -> int:
        """Forget the messages ZeroMQ has let go of; return the bytes still pending."""
        live = deque(entry for entry in self._entries if not entry[0].done)
        self._entries = live
        self.total = sum(size for _, size in live)
        self._collect_at = 2 * len(live) + _SLACK
        return self.total
