"""A worker handler's answer, as every runtime reads it.

A handler returns the FINAL body (``bytes`` for one frame, or a sequence of ``bytes``), or is a
generator (sync or async, by runtime) whose every value is a body: the last is the FINAL, every
earlier one a PARTIAL. ``as_frames`` checks one such value; ``HandlerError`` is what a handler
that broke this contract is reported as (in the error FINAL of MDP-D-23).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from domo.protocol import mdp
from domo.protocol.errors import DomoError

__all__ = ["Body", "HandlerError", "as_frames"]

Body: TypeAlias = bytes | Sequence[bytes]


class HandlerError(DomoError):
    """A handler broke the handler contract (for example, a generator that yielded nothing)."""


def as_frames(value: object) -> mdp.Frames:
    """A handler's answer as frames; raises if it is not a valid body."""
    return (value,) if isinstance(value, bytes) else mdp.check_body(value)
