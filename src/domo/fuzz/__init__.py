"""``domo fuzz``: model-based fuzzing of MDP/0.2 brokers, workers and clients over real sockets.

Hypothesis generates scenarios (:mod:`domo.fuzz.scenario`); each is played against the target
and every message it sends is checked against the rules of ``specs/mdp-0.2.md``: against a
running broker the fuzzer plays clients and workers (:mod:`domo.fuzz.broker_target`); against a
worker or a client it binds an endpoint and plays the broker (:mod:`domo.fuzz.worker_target`,
:mod:`domo.fuzz.client_target`). Violations are shrunk, reported with their rule id and saved as
replay files (:mod:`domo.fuzz.search`). Needs ``hypothesis`` (the ``fuzz`` extra); the rest of
domo does not.
"""

from __future__ import annotations

from .broker_target import Timing, Unreachable, Violation
from .scenario import TARGETS, Replay, Step, describe, load_replay, save_replay
from .search import (
    Finding,
    FuzzOptions,
    FuzzResult,
    format_coverage,
    format_finding,
    format_rule_coverage,
    fuzz,
    fuzz_broker,
    replay_broker,
    replay_file,
)

__all__ = [
    "TARGETS",
    "Finding",
    "FuzzOptions",
    "FuzzResult",
    "Replay",
    "Step",
    "Timing",
    "Unreachable",
    "Violation",
    "describe",
    "format_coverage",
    "format_finding",
    "format_rule_coverage",
    "fuzz",
    "fuzz_broker",
    "load_replay",
    "replay_broker",
    "replay_file",
    "save_replay",
]
