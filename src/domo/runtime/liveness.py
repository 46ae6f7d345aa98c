"""When a worker runtime tells its session that the messages it finds waiting were heard.

A worker session counts the broker as lost once it has heard nothing for ``liveness`` heartbeat
intervals (MDP-H-06), and a session's ``receive(frames, now)`` first fires what is due at
``now``. A runtime that wakes late (a starved thread, a loop held up by a handler, a loaded
machine) finds the broker's heartbeats waiting in its socket: they arrived in time, but handed
to the session at the late ``now`` they would come after the expiry, and the worker would drop
a live broker and reconnect (seen under load: a busy ``domo.sync`` worker re-registering).

So each message found waiting is handed over (``receive_waiting``) as heard at ``now``, or,
if ``now`` is past the broker's expiry, just before it: the message was in this process before
it was read, and a message that came in time cannot be told apart from one read late. Each
message so heard moves the expiry a span on, so a backlog of the broker's heartbeats (one per
interval, ``liveness`` of them a span) carries the session up to ``now`` however long the
runtime was held up. If the broker really was silent past its span, it has dropped this worker
too, and its answer to the worker's next message is a DISCONNECT (MDP-W-17): the worker
reconnects then. After a late batch the runtime calls ``tick(now)`` (``session.now`` is then
earlier than ``now``) for what is due at the real time, such as a heartbeat to send.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

__all__ = ["heard_at", "receive_waiting"]

E = TypeVar("E")


class WorkerSessionLike(Protocol[E]):
    """What ``receive_waiting`` needs of a ``WorkerSession``."""

    @property
    def now(self) -> float: ...
    @property
    def broker_expires_at(self) -> float | None: ...
    def receive(self, frames: Sequence[bytes], now: float) -> list[E]: ...


def receive_waiting(session: WorkerSessionLike[E], frames: Sequence[bytes], now: float) -> list[E]:
    """``session.receive`` of a message found waiting at ``now``, heard in time (see above)."""
    return session.receive(frames, heard_at(session.broker_expires_at, session.now, now))


def heard_at(expires: float | None, since: float, now: float) -> float:
    """The time to hand a waiting message to a session whose broker ``expires`` then.

    ``since`` is the session's latest time (a session's clock never goes back).
    """
    if expires is None or now < expires:
        return now
    return max(since, math.nextafter(expires, -math.inf))
