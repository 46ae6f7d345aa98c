"""Giving memory back to the system after a flood: the C allocator's two levers, for a broker.

A broker relays bodies it does not keep: after a burst of large messages, or a flood of small
ones, the Python heap is back where it started but the process's RSS is not (issue 14: 32 → 152
MiB over four floods). Two things hold on to it, and both are the C library's (glibc) malloc:

- *The dynamic mmap threshold.* glibc serves a block of 128 KiB or more with its own ``mmap``,
  unmapped when freed; but each time such a block is freed it raises the threshold to that size,
  so later 1 MiB bodies come from the heap, whose freed space is kept. ``fix_mmap_threshold``
  sets the threshold once (which turns the raising off): large bodies always go back on free.
- *Free space kept in the heap.* ``trim`` (``malloc_trim(0)``) hands the free pages of every
  arena back (``madvise``), which glibc otherwise does only at the top of the main heap.

Both are process-wide, so only a process that is a broker should call them (``domo broker`` does);
elsewhere (another C library, another OS) they do nothing and return False. ZeroMQ's own buffers
and Python's small-object arenas are not theirs to release: ``docs/reliability.md`` says what
remains.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache
from typing import Final

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold", "trim"]

MMAP_THRESHOLD: Final = 128 * 1024  # glibc's initial threshold: blocks this large are mapped
_M_MMAP_THRESHOLD: Final = -3  # mallopt's parameter number, from glibc's malloc.h


@cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 - glibc has it; musl and others do not
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Serve every block of ``size`` bytes or more by ``mmap``, returned to the system when freed
    (and stop glibc from raising the threshold). True if the C library took it."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(size)))


def trim() -> bool:
    """Give the heap's free pages back to the system; True if the C library released any."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(ctypes.c_size_t(0)))
