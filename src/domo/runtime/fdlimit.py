"""A broker's open files: raise its limit as far as the system lets it, and say when it is full.

Every peer connected to a broker over TCP or IPC holds one of the broker's file descriptors, so a
broker takes at most its open-file limit of peers, less what it needs itself (its sockets' own
descriptors, ZeroMQ's threads, log and trace files, the metrics server). Linux gives a process
a soft limit (often 1,024) that it may raise by itself up to a hard limit (often much higher):
``raise_open_file_limit`` does that and keeps ``reserve`` descriptors for the broker's own use
out of the count of peers it says it can take.

When the limit is reached, ZeroMQ's listener fails to accept the next connection (``EMFILE``)
and says so to nobody: that peer is simply never served (seen: 859 of 21,000 workers never
registered, and the broker logged nothing). libzmq then retries the accept for as long as the
limit holds, so a broker at its limit also burns CPU. ``OpenFileWatch`` looks at the process's
open files every few seconds and says it, on the broker's log and in its metrics
(``domo_open_files``, ``domo_open_files_limit``, ``domo_open_file_limit_reached_total``): a
warning when fewer than ``reserve`` descriptors are left, an error while the limit is reached,
each with the limit and what to change (``refusal_reason``). It does not watch the sockets'
monitors for the failed accepts: while the limit holds, libzmq reports one per retry, as fast
as it can, which would flood the monitor's unbounded queue. The reserve is counted, not held:
at the limit that retry loop takes any descriptor that comes free, so the broker's own (a
metrics scrape's connection, a new trace file) fail too until peers leave.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "RESERVE",
    "FileBudget",
    "OpenFileWatch",
    "file_budget",
    "open_files",
    "raise_open_file_limit",
    "refusal_reason",
]

RESERVE: Final = 64  # descriptors kept for the broker itself, beyond those open when it starts
_UNLIMITED_CAP: Final = 1 << 20  # if the hard limit is "unlimited": Linux's default nr_open

if sys.platform != "win32":  # Windows has no such limit to raise or read
    import resource


@dataclass(frozen=True)
class FileBudget:
    """The open-file limit of this process and the peers it leaves room for.

    ``soft`` is the limit in force, ``hard`` the most it may be raised to without privileges,
    ``was`` the soft limit before ``raise_open_file_limit``; ``in_use`` the descriptors open when
    it was measured and ``reserve`` those kept for later needs of the process itself. ``peers``
    is what is left for peer connections (one descriptor each).
    """

    soft: int
    hard: int
    was: int
    in_use: int
    reserve: int

    @property
    def peers(self) -> int:
        return max(0, self.soft - self.in_use - self.reserve)

    def describe(self) -> str:
        """One line for the log: the limit and the room it leaves for peers."""
        raised = f" (raised from {self.was})" if self.was != self.soft else ""
        return (
            f"open-file limit {self.soft}{raised}, hard limit {self.hard}: room for about "
            f"{self.peers} peer connections ({self.in_use} descriptors in use, {self.reserve} "
            "kept for the broker)"
        )


def open_files() -> int:
    """How many file descriptors this process has open (0 if it cannot tell).

    At the limit, listing them takes one descriptor too many (``EMFILE``): then it is the
    whole soft limit.
    """
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(folder)) - 1)  # less the one listing it
        except OSError as error:
            if error.errno == errno.EMFILE and sys.platform != "win32":
                return _finite(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            continue
    return 0


def file_budget(reserve: int = RESERVE, was: int | None = None) -> FileBudget:
    """This process's open-file limit as it stands, and the peers it leaves room for."""
    if sys.platform == "win32":
        return FileBudget(0, 0, 0, open_files(), reserve)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = _finite(soft), _finite(hard)
    return FileBudget(soft, hard, soft if was is None else was, open_files(), reserve)


def raise_open_file_limit(want: int | None = None, reserve: int = RESERVE) -> FileBudget:
    """Raise this process's soft open-file limit to ``want`` (default: the hard limit), as far
    as the hard limit allows; never lower it. Returns the budget that results."""
    if sys.platform == "win32":
        return file_budget(reserve)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = _finite(hard)
    target = ceiling if want is None else min(want, ceiling)
    if target > _finite(soft):
        with contextlib.suppress(ValueError, OSError):  # a container may forbid it
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return file_budget(reserve, was=_finite(soft))


def refusal_reason(error: int, budget: FileBudget | None = None) -> str:
    """Why a peer's connection could not be accepted (``error`` is an errno), and what to do."""
    budget = file_budget() if budget is None else budget
    if error == errno.EMFILE:
        return (
            f"the broker's open-file limit ({budget.soft}, hard {budget.hard}) is reached: raise "
            "it (ulimit -n, or LimitNOFILE= for a systemd service; past the hard limit as root: "
            "/etc/security/limits.conf) or spread the peers over more brokers"
        )
    if error == errno.ENFILE:
        return (
            "the system's open-file table is full: raise fs.file-max (sysctl) or run fewer "
            "processes on this host"
        )
    if error in (errno.ENOBUFS, errno.ENOMEM):
        return "the system is out of memory for sockets"
    name = errno.errorcode.get(error, str(error))
    return f"accept failed: {name} ({os.strerror(error)})"


class OpenFileWatch:
    """Says, on ``logger`` and in its counts, when the process runs out of open files.

    Call ``check(now)`` every ``every`` seconds (a runtime's timer). While fewer than
    ``budget.reserve`` descriptors are left, a warning; while none is left (the next peer is
    refused), an error; each at most once every ``repeat`` seconds, with the count of checks
    that found the limit reached since the last line.
    """

    def __init__(
        self,
        budget: FileBudget,
        logger: logging.Logger,
        every: float = 5.0,
        repeat: float = 30.0,
    ) -> None:
        self.budget = budget
        self.every = every
        self._logger = logger
        self._repeat = repeat
        self.in_use = budget.in_use
        self.reached = 0  # checks that found the limit reached
        self._said_at = -float("inf")
        self._unsaid = 0

    def check(self, now: float) -> None:
        """Count the open files now; log if the limit is near or reached (see the class)."""
        soft = self.budget.soft
        self.in_use = in_use = open_files()
        left = soft - in_use
        if left > self.budget.reserve or soft <= 0:
            return
        at_limit = left <= 1  # the descriptor that lists them is one of the limit's
        if at_limit:
            self.reached += 1
            self._unsaid += 1
        if now - self._said_at < self._repeat:
            return
        self._said_at = now
        if at_limit:
            since = f" (limit reached at {self._unsaid} checks since the last line)"
            self._unsaid = 0
            self._logger.error(
                "cannot take more peers: %d of %d open files in use, new connections are "
                "refused%s; %s",
                in_use,
                soft,
                since,
                refusal_reason(errno.EMFILE, self.budget),
            )
        else:
            self._logger.warning(
                "%d of %d open files in use: %d left before new peers are refused and the "
                "broker cannot open files of its own; %s",
                in_use,
                soft,
                left,
                refusal_reason(errno.EMFILE, self.budget),
            )

    def register_metrics(self, registry: Any) -> None:
        """``domo_open_files``, ``domo_open_files_limit`` and
        ``domo_open_file_limit_reached_total`` on a ``prometheus_client`` registry."""
        from prometheus_client import Counter, Gauge

        Gauge(
            "domo_open_files", "file descriptors the broker has open", registry=registry
        ).set_function(lambda: self.in_use)
        Gauge(
            "domo_open_files_limit", "the broker's open-file limit (soft)", registry=registry
        ).set_function(lambda: self.budget.soft)
        reached = Counter(
            "domo_open_file_limit_reached",
            "checks that found the open-file limit reached (new peers refused)",
            registry=registry,
        )
        watch_check = self.check

        def check(now: float) -> None:
            before = self.reached
            watch_check(now)
            if self.reached > before:
                reached.inc(self.reached - before)

        self.check = check  # type: ignore[method-assign]


def _finite(limit: int) -> int:
    if sys.platform == "win32":
        return limit
    return _UNLIMITED_CAP if limit == resource.RLIM_INFINITY else limit
