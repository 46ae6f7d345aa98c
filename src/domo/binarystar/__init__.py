"""Binary Star: a primary and a backup broker that decide between them which one serves.

- ``fsm``: the pair's state machine, sans-IO (specs/binary-star.md);
- ``pair``: the Trio runtime: the state messages between the two brokers, and the gate that
  ``domo broker --primary`` / ``--backup`` puts in front of the broker's core.
"""

from __future__ import annotations

from .fsm import PairConfig, PairMachine, Role, State, Transition

__all__ = ["PairConfig", "PairMachine", "Role", "State", "Transition"]
