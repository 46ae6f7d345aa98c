"""``domo fuzz``: model-based fuzzing of an MDP/0.2 broker over real ZeroMQ sockets.

Hypothesis generates scenarios of clients and workers (:mod:`domo.fuzz.scenario`); each is
played against a running broker and every message it sends is checked against the rules of
``specs/mdp-0.2.md`` (:mod:`domo.fuzz.broker_target`); violations are shrunk, reported with their
rule id and saved as replay files (:mod:`domo.fuzz.search`). Needs ``hypothesis`` (the ``fuzz``
extra); the rest of domo does not.
"""

from __future__ import annotations

from .broker_target import Timing, Unreachable, Violation
from .scenario import Replay, Step, describe, load_replay, save_replay
from .search import Finding, FuzzOptions, FuzzResult, format_finding, fuzz_broker, replay_broker

__all__ = [
    "Finding",
    "FuzzOptions",
    "FuzzResult",
    "Replay",
    "Step",
    "Timing",
    "Unreachable",
    "Violation",
    "describe",
    "format_finding",
    "fuzz_broker",
    "load_replay",
    "replay_broker",
    "save_replay",
]
