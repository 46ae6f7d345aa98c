"""A worker handler's answer, as every runtime reads it.

A handler returns the FINAL body (``bytes`` for one frame, or a sequence of ``bytes``), or is a
generator (sync or async, by runtime) whose values are bodies: ``Partial(body)`` is a PARTIAL sent
at once; a plain body is the FINAL if it is the last value, else a PARTIAL sent when the next value
comes (only then is it known not to be the last). A generator that yields only ``Partial`` values
ends with a FINAL of one empty frame. ``as_frames`` checks one such value; ``HandlerError`` is what
a handler that broke this contract is reported as (in the error FINAL of MDP-D-23).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from domo.protocol import mdp
from domo.protocol.errors import DomoError

__all__ = ["Body", "HandlerError", "Partial", "as_frames"]

Body: TypeAlias = bytes | Sequence[bytes]


class Partial:
    """A body that a generator handler yields to have it sent as a PARTIAL at once.

    ``yield Partial(b"starting")`` reaches the client before the handler goes on; a plain
    ``yield b"starting"`` would wait until the handler's next value shows it was not the FINAL.
    """

    __slots__ = ("body",)

    def __init__(self, body: Body) -> None:
        self.body = body

    def __repr__(self) -> str:
        return f"Partial({self.body!r})"


class HandlerError(DomoError):
    """A handler broke the handler contract (for example, a generator that yielded nothing)."""


def as_frames(value: object) -> mdp.Frames:
    """A handler's answer as frames; raises if it is not a valid body."""
    return (value,) if isinstance(value, bytes) else mdp.check_body(value)
