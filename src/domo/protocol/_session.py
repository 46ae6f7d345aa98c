"""What the worker and client sessions share: the clock rule, the outbox and table cells.

Both sessions are one peer talking to one broker over one DEALER socket at a time. Their
transition tables map ``(state, input)`` to a ``Cell``: the next state, the actions in order, the
rule of ``specs/mdp-0.2.md`` that decides it, and whether the input is a violation by the broker.
A cell whose ``error`` is set is local API misuse: the call raises ``LocalProtocolError`` and
nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from .errors import LocalProtocolError
from .mdp import Frames

__all__ = ["Cell", "SessionBase"]

StateT = TypeVar("StateT", bound=Enum)
ActionT = TypeVar("ActionT", bound=Enum)
InputT = TypeVar("InputT", bound=Enum)


@dataclass(frozen=True, slots=True)
class Cell(Generic[StateT, ActionT]):
    """One cell of a session's transition table."""

    next_state: StateT | None  # None: unchanged (or, with ``error``, refused)
    actions: tuple[ActionT, ...]
    rule: str
    violation: bool = False
    error: str | None = None  # local misuse: raise LocalProtocolError with this message


class SessionBase(Generic[StateT, InputT, ActionT]):
    """Clock, outbox and table lookup for a session; subclasses supply the table and actions."""

    _table: Mapping[tuple[StateT, InputT], Cell[StateT, ActionT]]

    def __init__(self, state: StateT) -> None:
        self._state = state
        self._now = float("-inf")
        self._outbox: list[Frames] = []

    @property
    def state(self) -> StateT:
        """The session's current state."""
        return self._state

    @property
    def now(self) -> float:
        """The latest time given to the session."""
        return self._now

    def take_outgoing(self) -> list[Frames]:
        """Drain the outbox: messages to send on the current socket, in order."""
        outbox = self._outbox
        self._outbox = []
        return outbox

    def _check_time(self, now: float) -> None:
        if now < self._now:
            raise LocalProtocolError(f"time went backwards: {now} after {self._now}")

    def _cell(self, input_: InputT) -> Cell[StateT, ActionT]:
        cell = self._table[self._state, input_]
        if cell.error is not None:
            raise LocalProtocolError(f"{cell.error} (state {self._state.name})")
        return cell

    def _move(self, cell: Cell[StateT, ActionT]) -> None:
        if cell.next_state is not None:
            self._state = cell.next_state
