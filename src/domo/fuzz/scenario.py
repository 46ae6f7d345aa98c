"""Scenarios for ``domo fuzz``: what the fuzzer's clients and workers do, step by step.

A scenario is a plain list of :class:`Step`; Hypothesis generates and shrinks them
(:func:`scenarios`), a finding saves one to a JSON replay file (:func:`save_replay`) and
``domo fuzz --replay FILE`` loads it again (:func:`load_replay`). A step whose precondition does
not hold when it runs (a reply from a worker that holds no request, say) does nothing, so every
list of steps is a valid scenario and shrinking may drop any step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hypothesis import strategies as st

__all__ = [
    "CLIENTS",
    "GARBAGE",
    "KINDS",
    "REPLAY_FORMAT",
    "SERVICES",
    "WORKERS",
    "Replay",
    "Step",
    "describe",
    "load_replay",
    "save_replay",
    "scenarios",
]

WORKERS: Final = 2  # worker actors w0, w1
CLIENTS: Final = 2  # client actors c0..c1
SERVICES: Final = 2  # services s0, s1
REPLAY_FORMAT: Final = "domo-fuzz-replay/1"

# Near-miss malformed messages a worker socket sends (MDP-W-16 asks the broker to drop them).
# ``{svc}`` stands for the actor's service name.
GARBAGE: Final[tuple[tuple[str, tuple[bytes, ...]], ...]] = (
    ("READY with header MDPW01", (b"MDPW01", b"\x01", b"{svc}")),
    ("unknown command 0x09", (b"MDPW02", b"\x09")),
    ("READY without a service frame", (b"MDPW02", b"\x01")),
    ("READY with an extra frame", (b"MDPW02", b"\x01", b"{svc}", b"extra")),
    ("READY with an empty service name", (b"MDPW02", b"\x01", b"")),
    ("header frame only", (b"MDPW02",)),
    ("one empty frame", (b"",)),
    ("FINAL without delimiter and body", (b"MDPW02", b"\x04", b"nobody")),
    ("client REQUEST without a body", (b"MDPC02", b"\x01", b"{svc}")),
)

# kind -> (which actor it uses, what ``arg`` means)
KINDS: Final[dict[str, tuple[str, str]]] = {
    "ready": ("worker", "service index"),
    "request": ("client", "service index"),
    "reply": ("worker", "PARTIALs before the FINAL"),
    "heartbeat": ("worker", "unused"),
    "disconnect": ("worker", "unused"),
    "die": ("worker", "unused"),
    "late-final": ("worker", "unused"),
    "unexpected": (
        "worker",
        "0 READY again, 1 FINAL while idle, 2 REQUEST, 3 HEARTBEAT unregistered",
    ),
    "garbage": ("worker", "index into GARBAGE"),
    "pause": ("worker", "half heartbeat intervals without heartbeats"),
    "wait": ("none", "half heartbeat intervals"),
}

_UNEXPECTED: Final = (
    "READY again",
    "FINAL while idle",
    "REQUEST (a broker command)",
    "HEARTBEAT before READY",
)


# The ordinary dialog is drawn more often than the rest: most rules need a registered worker, a
# request and time passing before anything interesting can happen.
_WEIGHTED_KINDS: Final = (
    *("ready", "request", "wait", "reply") * 3,
    *("pause", "disconnect", "die", "late-final") * 2,
    "heartbeat",
    "unexpected",
    "garbage",
)


@dataclass(frozen=True, slots=True)
class Step:
    """One thing one actor does; ``actor`` and ``arg`` are read as :data:`KINDS` says."""

    kind: str
    actor: int = 0
    arg: int = 0


def describe(step: Step) -> str:
    """``step`` in words, as the report and ``--replay`` print it."""
    w, c = f"w{step.actor}", f"c{step.actor}"
    match step.kind:
        case "ready":
            return f"{w}: connect a new socket, READY s{step.arg}"
        case "request":
            return f"{c}: REQUEST s{step.arg}"
        case "reply":
            return f"{w}: {step.arg} PARTIAL then FINAL to the request it holds"
        case "heartbeat":
            return f"{w}: (READY s0 first if unregistered) HEARTBEAT now"
        case "disconnect":
            return f"{w}: (READY s0 first if unregistered) DISCONNECT"
        case "die":
            return f"{w}: (READY s0 first if unregistered) die silently (sends nothing more)"
        case "late-final":
            return f"{w}: while dead, send FINAL to the request it held"
        case "unexpected":
            return f"{w}: valid but unexpected {_UNEXPECTED[step.arg % len(_UNEXPECTED)]}"
        case "garbage":
            return f"{w}: malformed: {GARBAGE[step.arg % len(GARBAGE)][0]}"
        case "pause":
            return f"{w}: (READY s0 first if needed) skip heartbeats for {step.arg}/2 intervals"
        case "wait":
            return f"wait {step.arg}/2 heartbeat intervals"
    return f"unknown step {step.kind!r}"


def scenarios(max_steps: int) -> st.SearchStrategy[list[Step]]:
    """Scenarios of 1 to ``max_steps`` steps."""
    worker = st.integers(0, WORKERS - 1)
    client = st.integers(0, CLIENTS - 1)
    service = st.integers(0, SERVICES - 1)
    argument = {
        "ready": service,
        "request": service,
        "reply": st.integers(0, 2),
        "wait": st.integers(1, 6),
        "pause": st.integers(1, 4),
        "unexpected": st.integers(0, len(_UNEXPECTED) - 1),
        "garbage": st.integers(0, len(GARBAGE) - 1),
    }

    def build(kind: str) -> st.SearchStrategy[Step]:
        actor = {"worker": worker, "client": client}.get(KINDS[kind][0], st.just(0))
        return st.builds(Step, st.just(kind), actor, argument.get(kind, st.just(0)))

    step = st.sampled_from(_WEIGHTED_KINDS).flatmap(build)
    return st.lists(step, min_size=min(3, max_steps), max_size=max_steps)


@dataclass(frozen=True, slots=True)
class Replay:
    """What a replay file holds: the timing agreed with the target, the steps, the finding."""

    target: str
    heartbeat_interval: float
    liveness: int
    steps: list[Step]
    rule: str = ""
    explanation: str = ""


def save_replay(path: Path, replay: Replay) -> None:
    """Write ``replay`` as JSON to ``path`` (parents created)."""
    data: dict[str, Any] = {
        "format": REPLAY_FORMAT,
        "target": replay.target,
        "heartbeat_interval": replay.heartbeat_interval,
        "liveness": replay.liveness,
        "rule": replay.rule,
        "explanation": replay.explanation,
        "steps": [[s.kind, s.actor, s.arg] for s in replay.steps],
        "readable": [describe(s) for s in replay.steps],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_replay(path: Path) -> Replay:
    """Read a replay file; ``ValueError`` says what is wrong with one that does not parse."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != REPLAY_FORMAT:
            raise ValueError(f"not a {REPLAY_FORMAT} file")
        steps = [Step(str(k), int(a), int(g)) for k, a, g in data["steps"]]
        for s in steps:
            if s.kind not in KINDS:
                raise ValueError(f"unknown step kind {s.kind!r}")
        return Replay(
            target=str(data["target"]),
            heartbeat_interval=float(data["heartbeat_interval"]),
            liveness=int(data["liveness"]),
            steps=steps,
            rule=str(data.get("rule", "")),
            explanation=str(data.get("explanation", "")),
        )
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"bad replay file {path}: {error}") from error
