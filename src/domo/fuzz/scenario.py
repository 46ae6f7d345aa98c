"""Scenarios for ``domo fuzz``: what the fuzzer does to its target, step by step.

A scenario is a plain list of :class:`Step`; Hypothesis generates and shrinks them
(:func:`scenarios`), a finding saves one to a JSON replay file (:func:`save_replay`) and
``domo fuzz --replay FILE`` loads it again (:func:`load_replay`). Each target has its own step
kinds: against a broker the fuzzer plays clients and workers (:data:`KINDS`); against a worker
(:data:`WORKER_TARGET_KINDS`) or a client (:data:`CLIENT_TARGET_KINDS`) it plays the broker. A
step whose precondition does not hold when it runs (a reply from a worker that holds no request,
say) does nothing, so every list of steps is a valid scenario and shrinking may drop any step.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hypothesis import strategies as st

__all__ = [
    "BODIES",
    "CLIENTS",
    "CLIENT_TARGET_KINDS",
    "GARBAGE",
    "GARBAGE_TO_CLIENT",
    "GARBAGE_TO_WORKER",
    "JUDGED_RULES",
    "KINDS",
    "MMI_QUERIES",
    "REPLAY_FORMAT",
    "REPLY_BODIES",
    "REQUEST_SHAPES",
    "SERVICES",
    "STEP_RULES",
    "STRAY_REPLIES",
    "TARGETS",
    "WORKERS",
    "WORKER_TARGET_KINDS",
    "Replay",
    "Step",
    "describe",
    "kinds_of",
    "load_replay",
    "random_step",
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

# The request bodies a client sends (``arg // SERVICES`` of a "request" step picks one): 0, 1 and
# many frames, empty frames, sizes on both sides of 64 KiB (where a broker may switch to
# zero-copy). ``{id}`` becomes a text unique to the request.
BODIES: Final[tuple[tuple[str, tuple[bytes, ...]], ...]] = (
    ("one short frame", (b"{id}",)),
    ("one empty frame", (b"",)),
    ("four frames, two of them empty", (b"{id}", b"", b"x", b"")),
    ("one frame of 64 KiB - 1", (b"a" * 65535,)),
    ("a frame of 64 KiB + 1 and a short one", (b"b" * 65537, b"{id}")),
)
# What a worker's PARTIAL or FINAL carries after its first frame (a token the fuzzer knows it by);
# ``arg // 3`` of a "reply" step picks one.
REPLY_BODIES: Final[tuple[tuple[str, tuple[bytes, ...]], ...]] = (
    ("", ()),
    (" and an empty frame", (b"",)),
    (" and 70 KiB", (b"r" * 71680,)),
)
# MMI queries (``arg`` of an "mmi" step): service name queried, or another mmi.* service.
MMI_QUERIES: Final = (
    "mmi.service s0",
    "mmi.service s1",
    "mmi.service of a name nobody serves",
    "mmi.nosuch (an MMI service that does not exist)",
    "mmi.service of the service of a worker holding a request (else s0)",
)
# Replies from peers that hold no request for that client (``arg`` of a "stray-reply" step).
STRAY_REPLIES: Final = (
    "FINAL from a peer that never sent READY",
    "PARTIAL from a peer that never sent READY",
    "FINAL naming another client than the request it holds",
    "PARTIAL naming another client than the request it holds",
    "DISCONNECT, then FINAL (a silenced peer)",
)

# kind -> (which actor it uses, what ``arg`` means)
KINDS: Final[dict[str, tuple[str, str]]] = {
    "ready": ("worker", "service index (SERVICES: a reserved mmi.* name)"),
    "request": ("client", "service index (arg % 2), body (arg // 2 indexes BODIES)"),
    "second-request": ("client", "service index; a second REQUEST on the same socket"),
    "mmi": ("client", "index into MMI_QUERIES"),
    "reply": ("worker", "PARTIALs before the FINAL (arg % 3), body (arg // 3: REPLY_BODIES)"),
    "stray-reply": ("worker", "index into STRAY_REPLIES"),
    "heartbeat": ("worker", "unused"),
    "disconnect": ("worker", "0 this worker, 1 the worker holding a request (if any)"),
    "die": ("worker", "0 this worker, 1 the worker holding a request (if any)"),
    "late-final": ("worker", "unused"),  # dies first if alive
    "partial": ("worker", "unused; one PARTIAL from the worker holding a request, no FINAL"),
    "unexpected": (
        "worker",
        "0 READY again, 1 FINAL while idle, 2 REQUEST, 3 HEARTBEAT unregistered",
    ),
    "garbage": ("worker", "index into GARBAGE"),
    "pause": ("worker", "half heartbeat intervals without heartbeats"),
    "wait": ("none", "half heartbeat intervals"),
    "settle": ("none", "unused; wait until every queued request has certainly reached the broker"),
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
    *("ready", "wait") * 3,
    *("request",) * 5,
    *("reply",) * 3,
    *("late-final", "pause", "disconnect", "die", "mmi", "stray-reply") * 2,
    *("heartbeat", "unexpected", "garbage", "second-request", "partial"),
)


TARGETS: Final = ("broker", "worker", "client")

# --- the fuzzer as the broker, against a worker (--target worker) ------------------------------

# The request bodies and client addresses the fuzzer's REQUESTs use; ``arg`` of a "request"
# step picks one of each (body = arg % 5, address = arg // 5 % 3).
REQUEST_SHAPES: Final[tuple[tuple[str, tuple[bytes, ...]], ...]] = (
    ("one short frame", (b"fuzz",)),
    ("one empty frame", (b"",)),
    ("three frames, the middle one empty", (b"a", b"", b"c")),
    ("256 bytes of every value", (bytes(range(256)),)),
    ("64 KiB", (b"x" * 65536,)),
)
REQUEST_ADDRESSES: Final[tuple[bytes, ...]] = (b"\x00", b"c\x00\xff\n7", bytes(range(1, 256)))
# The client address of a malformed REQUEST, so that a worker answering one is recognised.
GARBAGE_ADDRESS: Final = b"malformed-request"

# Near-miss malformed messages the fuzzer's broker sends a worker (MDP-W-08: it can tell).
GARBAGE_TO_WORKER: Final[tuple[tuple[str, tuple[bytes, ...]], ...]] = (
    ("REQUEST with header MDPW01", (b"MDPW01", b"\x02", GARBAGE_ADDRESS, b"", b"x")),
    ("unknown command 0x09", (b"MDPW02", b"\x09")),
    ("REQUEST without the empty delimiter", (b"MDPW02", b"\x02", GARBAGE_ADDRESS, b"x")),
    ("REQUEST without a body", (b"MDPW02", b"\x02", GARBAGE_ADDRESS, b"")),
    ("REQUEST with an empty client address", (b"MDPW02", b"\x02", b"", b"", b"x")),
    ("HEARTBEAT with an extra frame", (b"MDPW02", b"\x05", b"extra")),
    ("header frame only", (b"MDPW02",)),
    ("one empty frame", (b"",)),
    ("a client-protocol FINAL", (b"MDPC02", b"\x03", b"echo", b"x")),
)

_UNEXPECTED_TO_WORKER: Final = (
    "READY (a command only workers send)",
    "PARTIAL (a command only workers send)",
    "FINAL (a command only workers send)",
    "a second REQUEST while it holds one",
)

WORKER_TARGET_KINDS: Final[dict[str, str]] = {
    "request": "REQUEST_SHAPES and REQUEST_ADDRESSES index (body = arg % 5, address = arg // 5)",
    "heartbeat": "unused",
    "silence": "half heartbeat intervals without sending the worker anything",
    "disconnect": "unused",
    "unexpected": "index into the unexpected broker commands",
    "garbage": "index into GARBAGE_TO_WORKER",
    "wait": "half heartbeat intervals",
}
_WEIGHTED_WORKER_KINDS: Final = (
    *("request", "wait") * 4,
    *("silence", "disconnect") * 2,
    "heartbeat",
    "unexpected",
    "garbage",
)

# --- the fuzzer as the broker, against a client (--target client) ------------------------------

# Near-miss malformed messages the fuzzer's broker sends a client; ``{svc}`` stands for the
# service of the client's request.
GARBAGE_TO_CLIENT: Final[tuple[tuple[str, tuple[bytes, ...]], ...]] = (
    ("FINAL with header MDPC01", (b"MDPC01", b"\x03", b"{svc}", b"x")),
    ("unknown command 0x09", (b"MDPC02", b"\x09", b"{svc}", b"x")),
    ("FINAL without a body", (b"MDPC02", b"\x03", b"{svc}")),
    ("FINAL with an empty service name", (b"MDPC02", b"\x03", b"", b"x")),
    ("header frame only", (b"MDPC02",)),
    ("one empty frame", (b"",)),
    ("REQUEST (a command only clients send)", (b"MDPC02", b"\x01", b"{svc}", b"x")),
    ("a worker-protocol HEARTBEAT", (b"MDPW02", b"\x05")),
    ("FINAL behind an empty delimiter frame", (b"", b"MDPC02", b"\x03", b"{svc}", b"x")),
)

CLIENT_TARGET_KINDS: Final[dict[str, str]] = {
    "answer": "PARTIALs before the FINAL",
    "partial": "unused",
    "wrong-service": "0 a FINAL, 1 a PARTIAL, naming another service",
    "garbage": "index into GARBAGE_TO_CLIENT",
    "lose": "unused; no answer until the client asks again (its timeout)",
    "wait": "half heartbeat intervals",
}
_WEIGHTED_CLIENT_KINDS: Final = (
    *("answer", "wait") * 3,
    *("partial", "wrong-service", "garbage") * 2,
    "lose",
)


# The rules each step kind of a worker or client scenario exercises (the broker target counts
# its checks where they are armed; see ``broker_target``), for the coverage report.
STEP_RULES: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "broker": {},
    "worker": {
        "request": ("MDP-R-01", "MDP-R-03", "MDP-W-02", "MDP-W-09", "MDP-W-10"),
        "heartbeat": ("MDP-H-02",),
        "silence": ("MDP-H-05", "MDP-H-06"),
        "disconnect": ("MDP-W-17",),
        "unexpected": ("MDP-D-17",),
        "garbage": ("MDP-W-08",),
        "wait": ("MDP-H-04",),
    },
    "client": {
        "answer": ("MDP-C-01", "MDP-C-05", "MDP-C-07"),
        "partial": ("MDP-C-05",),
        "wrong-service": ("MDP-D-20",),
        "garbage": ("MDP-W-08", "MDP-D-20"),
        "lose": ("MDP-C-01", "MDP-C-07"),
        "wait": ("MDP-C-07", "MDP-C-02", "MDP-C-03"),
    },
}

# The rules each target's checks can judge: a run warns about those it never exercised.
JUDGED_RULES: Final[dict[str, tuple[str, ...]]] = {
    "broker": (
        "MDP-A-04",
        "MDP-A-05",
        "MDP-A-06",
        "MDP-C-06",
        "MDP-C-09",
        "MDP-C-10",
        "MDP-D-10",
        "MDP-D-13",
        "MDP-D-14",
        "MDP-H-04",
        "MDP-H-05",
        "MDP-H-07",
        "MDP-M-01",
        "MDP-M-02",
        "MDP-R-01",
        "MDP-R-03",
        "MDP-S-01",
        "MDP-S-02",
        "MDP-S-03",
        "MDP-W-08",
        "MDP-W-13",
        "MDP-W-14",
        "MDP-W-15",
        "MDP-W-16",
    ),
    "worker": (
        "MDP-D-17",
        "MDP-H-04",
        "MDP-H-05",
        "MDP-H-06",
        "MDP-R-01",
        "MDP-R-03",
        "MDP-W-02",
        "MDP-W-08",
        "MDP-W-09",
        "MDP-W-10",
        "MDP-W-17",
    ),
    "client": ("MDP-C-01", "MDP-C-02", "MDP-C-03", "MDP-C-05", "MDP-C-07", "MDP-D-20", "MDP-W-08"),
}


@dataclass(frozen=True, slots=True)
class Step:
    """One thing one actor does; ``actor`` and ``arg`` are read as :data:`KINDS` says."""

    kind: str
    actor: int = 0
    arg: int = 0


def describe(step: Step, target: str = "broker") -> str:
    """``step`` in words, as the report and ``--replay`` print it; ``target`` says whose step."""
    if target == "worker":
        return _describe_to_worker(step)
    if target == "client":
        return _describe_to_client(step)
    return _describe_broker_step(step)


def _describe_broker_step(step: Step) -> str:
    w, c = f"w{step.actor}", f"c{step.actor}"
    match step.kind:
        case "ready" if step.arg == SERVICES:
            return f"{w}: connect a new socket, READY for a reserved mmi.* name"
        case "ready":
            return f"{w}: connect a new socket, READY s{step.arg % SERVICES}"
        case "request":
            body = BODIES[step.arg // SERVICES % len(BODIES)][0]
            return (
                f"{c}: REQUEST s{step.arg % SERVICES}, body {body} (on a new socket if it still "
                "waits for a reply)"
            )
        case "second-request":
            return (
                f"{c}: (REQUEST s0 first if none outstanding) a second REQUEST "
                f"s{step.arg % SERVICES} on the same socket"
            )
        case "mmi":
            query = MMI_QUERIES[step.arg % len(MMI_QUERIES)]
            return f"{c}: REQUEST {query} (on a new socket if it still waits for a reply)"
        case "reply":
            extra = REPLY_BODIES[step.arg // 3 % len(REPLY_BODIES)][0]
            return (
                f"{w} (or the worker holding a request if it holds none): {step.arg % 3} PARTIAL "
                f"then FINAL{extra} to the request it holds"
            )
        case "stray-reply":
            return f"{w}: {STRAY_REPLIES[step.arg % len(STRAY_REPLIES)]}"
        case "heartbeat":
            return f"{w}: (READY s0 first if unregistered) HEARTBEAT now"
        case "disconnect":
            who = "the worker holding a request (else " + w + ")" if step.arg == 1 else w
            return f"{who}: (READY s0 first if unregistered) DISCONNECT"
        case "die":
            who = "the worker holding a request (else " + w + ")" if step.arg == 1 else w
            return f"{who}: (READY s0 first if unregistered) die silently (sends nothing more)"
        case "partial":
            return f"{w} (or the worker holding a request if it holds none): one PARTIAL, no FINAL"
        case "late-final":
            return (
                f"{w}: (READY s0 first if unregistered) die silently, and once certainly expired "
                "send FINAL to the request it held"
            )
        case "unexpected":
            return f"{w}: valid but unexpected {_UNEXPECTED[step.arg % len(_UNEXPECTED)]}"
        case "garbage":
            return f"{w}: malformed: {GARBAGE[step.arg % len(GARBAGE)][0]}"
        case "pause":
            return f"{w}: (READY s0 first if needed) skip heartbeats for {step.arg}/2 intervals"
        case "wait":
            return f"wait {step.arg}/2 heartbeat intervals"
        case "settle":
            return "wait until every request queued has certainly reached the broker"
    if step.kind not in KINDS:  # a step of a dialect with a search of its own
        return f"{step.kind} (its choices seeded {step.arg})"
    return f"unknown step {step.kind!r}"


def _describe_to_worker(step: Step) -> str:
    match step.kind:
        case "request":
            shape = REQUEST_SHAPES[step.arg % len(REQUEST_SHAPES)][0]
            address = REQUEST_ADDRESSES[step.arg // len(REQUEST_SHAPES) % len(REQUEST_ADDRESSES)]
            return f"broker: REQUEST ({shape}) for a client address of {len(address)} byte(s)"
        case "heartbeat":
            return "broker: an extra HEARTBEAT now"
        case "silence":
            return f"broker: send the worker nothing for {step.arg}/2 heartbeat intervals"
        case "disconnect":
            return "broker: DISCONNECT, then wait for the worker to come back"
        case "unexpected":
            which = _UNEXPECTED_TO_WORKER[step.arg % len(_UNEXPECTED_TO_WORKER)]
            return f"broker: valid but unexpected {which}"
        case "garbage":
            return f"broker: malformed: {GARBAGE_TO_WORKER[step.arg % len(GARBAGE_TO_WORKER)][0]}"
        case "wait":
            return f"wait {step.arg}/2 heartbeat intervals"
    return f"unknown step {step.kind!r}"


def _describe_to_client(step: Step) -> str:
    match step.kind:
        case "answer":
            return f"broker: {step.arg} PARTIAL then the FINAL to the client's request"
        case "partial":
            return "broker: one PARTIAL to the client's request"
        case "wrong-service":
            which = "FINAL" if step.arg % 2 == 0 else "PARTIAL"
            return f"broker: a {which} naming another service than the request's"
        case "garbage":
            return f"broker: malformed: {GARBAGE_TO_CLIENT[step.arg % len(GARBAGE_TO_CLIENT)][0]}"
        case "lose":
            return "broker: lose the client's request (no answer until it asks again)"
        case "wait":
            return f"wait {step.arg}/2 heartbeat intervals"
    return f"unknown step {step.kind!r}"


def kinds_of(target: str) -> dict[str, str]:
    """The step kinds of ``target`` and what their ``arg`` means."""
    if target == "worker":
        return WORKER_TARGET_KINDS
    if target == "client":
        return CLIENT_TARGET_KINDS
    return {kind: meaning for kind, (_, meaning) in KINDS.items()}


def scenarios(max_steps: int, target: str = "broker") -> st.SearchStrategy[list[Step]]:
    """Scenarios of 1 to ``max_steps`` steps against ``target``."""
    if target == "worker":
        step = st.sampled_from(_WEIGHTED_WORKER_KINDS).flatmap(_to_worker_step)
    elif target == "client":
        step = st.sampled_from(_WEIGHTED_CLIENT_KINDS).flatmap(_to_client_step)
    else:
        step = st.sampled_from(_WEIGHTED_KINDS).flatmap(_broker_step)
    return st.lists(step, min_size=min(3, max_steps), max_size=max_steps)


def _broker_step(kind: str) -> st.SearchStrategy[Step]:
    # Most steps use s0, the service a step that needs a worker registers it for: rules about
    # busy workers and their requests need a worker and requests on one service.
    service = st.sampled_from((0, 0, 0, *range(1, SERVICES)))
    argument = {
        "ready": st.sampled_from((0, 0, 0, *range(1, SERVICES), SERVICES)),
        "request": st.builds(
            lambda svc, body: svc + SERVICES * body,
            service,
            st.sampled_from((0, 0, *range(1, len(BODIES)))),
        ),
        "second-request": service,
        "mmi": st.integers(0, len(MMI_QUERIES) - 1),
        "stray-reply": st.integers(0, len(STRAY_REPLIES) - 1),
        "die": st.integers(0, 1),
        "reply": st.integers(0, 3 * len(REPLY_BODIES) - 1),
        "wait": st.integers(1, 6),
        "pause": st.integers(1, 4),
        "unexpected": st.integers(0, len(_UNEXPECTED) - 1),
        "garbage": st.integers(0, len(GARBAGE) - 1),
    }
    actors = {"worker": st.integers(0, WORKERS - 1), "client": st.integers(0, CLIENTS - 1)}
    actor = actors.get(KINDS[kind][0], st.just(0))
    return st.builds(Step, st.just(kind), actor, argument.get(kind, st.just(0)))


def random_step(rng: random.Random) -> Step:
    """One broker-target step drawn as :func:`scenarios` draws them, from ``rng``."""
    kind = rng.choice(_WEIGHTED_KINDS)
    service = rng.choice((0, 0, 0, *range(1, SERVICES)))
    arguments: dict[str, Callable[[], int]] = {
        "ready": lambda: rng.choice((0, 0, 0, *range(1, SERVICES), SERVICES)),
        "request": lambda: service + SERVICES * rng.choice((0, 0, *range(1, len(BODIES)))),
        "second-request": lambda: service,
        "mmi": lambda: rng.randrange(len(MMI_QUERIES)),
        "stray-reply": lambda: rng.randrange(len(STRAY_REPLIES)),
        "die": lambda: rng.randrange(2),
        "reply": lambda: rng.randrange(3 * len(REPLY_BODIES)),
        "wait": lambda: rng.randint(1, 6),
        "pause": lambda: rng.randint(1, 4),
        "unexpected": lambda: rng.randrange(len(_UNEXPECTED)),
        "garbage": lambda: rng.randrange(len(GARBAGE)),
    }
    who = KINDS[kind][0]
    actor = rng.randrange(WORKERS if who == "worker" else CLIENTS) if who != "none" else 0
    return Step(kind, actor, arguments.get(kind, lambda: 0)())


def _to_worker_step(kind: str) -> st.SearchStrategy[Step]:
    argument = {
        "request": st.integers(0, len(REQUEST_SHAPES) * len(REQUEST_ADDRESSES) - 1),
        "silence": st.integers(1, 8),
        "unexpected": st.integers(0, len(_UNEXPECTED_TO_WORKER) - 1),
        "garbage": st.integers(0, len(GARBAGE_TO_WORKER) - 1),
        "wait": st.integers(1, 4),
    }
    return st.builds(Step, st.just(kind), st.just(0), argument.get(kind, st.just(0)))


def _to_client_step(kind: str) -> st.SearchStrategy[Step]:
    argument = {
        "answer": st.integers(0, 2),
        "wrong-service": st.integers(0, 1),
        "garbage": st.integers(0, len(GARBAGE_TO_CLIENT) - 1),
        "wait": st.integers(1, 4),
    }
    return st.builds(Step, st.just(kind), st.just(0), argument.get(kind, st.just(0)))


@dataclass(frozen=True, slots=True)
class Replay:
    """What a replay file holds: the timing agreed with the target, the steps, the finding."""

    target: str
    heartbeat_interval: float
    liveness: int
    steps: list[Step]
    rule: str = ""
    explanation: str = ""
    dialect: str = "mdp02"  # the dialect of the peers played against a broker


def save_replay(path: Path, replay: Replay) -> None:
    """Write ``replay`` as JSON to ``path`` (parents created)."""
    data: dict[str, Any] = {
        "format": REPLAY_FORMAT,
        "target": replay.target,
        "heartbeat_interval": replay.heartbeat_interval,
        "liveness": replay.liveness,
        "dialect": replay.dialect,
        "rule": replay.rule,
        "explanation": replay.explanation,
        "steps": [[s.kind, s.actor, s.arg] for s in replay.steps],
        "readable": [describe(s, replay.target) for s in replay.steps],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_replay(path: Path) -> Replay:
    """Read a replay file; ``ValueError`` says what is wrong with one that does not parse."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != REPLAY_FORMAT:
            raise ValueError(f"not a {REPLAY_FORMAT} file")
        target = str(data["target"])
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}")
        steps = [Step(str(k), int(a), int(g)) for k, a, g in data["steps"]]
        dialect = str(data.get("dialect", "mdp02"))  # files from before --dialect: MDP/0.2
        for s in steps:
            # The dialects with a search of their own have kinds of their own.
            if dialect in ("mdp02", "mdp01", "majortomo") and s.kind not in kinds_of(target):
                raise ValueError(f"unknown step kind {s.kind!r} for a {target}")
        return Replay(
            target=target,
            heartbeat_interval=float(data["heartbeat_interval"]),
            liveness=int(data["liveness"]),
            steps=steps,
            rule=str(data.get("rule", "")),
            explanation=str(data.get("explanation", "")),
            dialect=dialect,
        )
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"bad replay file {path}: {error}") from error
