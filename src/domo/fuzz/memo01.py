"""``domo fuzz --dialect memo01``: memo01 scenarios against a broker's NNG endpoint.

The MDP fuzzer (``domo.fuzz``) drives ZeroMQ peers; memo01 (``specs/memo01.md``) lives on NNG,
so this is a search of its own, run by :mod:`domo.fuzz.engine` (several scenarios side by
side, steered to the rules judged least, each finding shrunk to a small plan that a replay file
keeps). A plan is a setup seed (the memo01 workers it starts: pynng req0 contexts on one socket,
random service sets) and six steps, each a kind and the seed of its own random choices:

- ``job``: a JOB is answered by a RESULT carrying the payload the worker computed for it, from
  a worker that serves the service (MEMO-05, MEMO-11);
- ``twice``: an identical JOB sent twice while the first runs is run once, and both get the
  RESULT (MEMO-16);
- ``stale``: a HEARTBEAT or RESULT with an id the broker never gave gets DISCONNECT (MEMO-10);
- ``bad-ready``: a READY whose services are not in MEMO-03's order gets DISCONNECT (MEMO-03,
  MEMO-18);
- ``garbage``: garbage and malformed JOBs get no reply, and the broker goes on serving (MEMO-18);
- ``leave``: a worker's RESULT that says it is leaving is forwarded and answered DISCONNECT
  (MEMO-06), and the worker is given no later JOB;
- ``out-of-turn``: a RESULT from an idle worker gets DISCONNECT (MEMO-09).

Every message from the broker is read with the fuzzer's own reading of MEMO-01 and MEMO-02
(CBOR header ``["memo01", type, id, ...]``, then the payload), not ``domo.protocol``'s codec.
Needs the ``nng`` extra (pynng, cbor2).
"""

from __future__ import annotations

import io
import random
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import cbor2
import pynng
import trio

from .engine import Outcome, Violation, search
from .scenario import Step

__all__ = ["Memo01Finding", "Memo01FuzzResult", "Memo01Planner", "fuzz_memo01", "replay_memo01"]

SERVICES = ("a", "b", "cc")
WAIT = 5.0  # seconds a scenario's replies may take on a loaded machine
KINDS = ("job", "job", "twice", "stale", "bad-ready", "garbage", "leave", "out-of-turn")
STEP_RULES: dict[str, tuple[str, ...]] = {
    "job": ("MEMO-05", "MEMO-11", "MEMO-01"),
    "twice": ("MEMO-16",),
    "stale": ("MEMO-10",),
    "bad-ready": ("MEMO-03",),
    "garbage": ("MEMO-18",),
    "leave": ("MEMO-06",),
    "out-of-turn": ("MEMO-09",),
}
RULES = tuple(sorted({r for rules in STEP_RULES.values() for r in rules} | {"MEMO-02"}))
STEPS_PER_SCENARIO = 6


class Kind(IntEnum):
    """memo01's message types (MEMO-02)."""

    READY = 1
    JOB = 2
    RESULT = 3
    HEARTBEAT = 4
    DISCONNECT = 5


@dataclass(frozen=True)
class Message:
    kind: Kind
    ident: bytes
    payload: bytes
    extra: tuple[Any, ...] = ()  # READY: the services; JOB: service, timeout; RESULT: leaving


def encode(kind: Kind, ident: bytes = b"", payload: bytes = b"", *extra: Any) -> bytes:
    """A message as MEMO-01 frames it: the CBOR header, then the payload."""
    return bytes(cbor2.dumps(["memo01", int(kind), ident, *extra], canonical=True)) + payload


def parse(data: bytes) -> Message:
    """A message from the broker; ``ValueError`` naming the rule it breaks (MEMO-01/02)."""
    stream = io.BytesIO(data)
    try:
        header = cbor2.CBORDecoder(stream).decode()
        offset = stream.tell()
    except Exception as error:  # cbor2 raises many kinds: none of them is memo01
        raise ValueError(f"MEMO-01: not a CBOR header: {error}") from None
    if not (isinstance(header, list) and len(header) >= 3 and header[0] == "memo01"):
        raise ValueError(f"MEMO-01: header {header!r:.60} is not ['memo01', type, id, ...]")
    kind, ident = header[1], header[2]
    if type(kind) is not int or kind not in set(Kind) or not isinstance(ident, bytes):
        raise ValueError(f"MEMO-02: header {header!r:.60} has no memo01 type and id")
    payload = data[offset:]
    if kind in (Kind.HEARTBEAT, Kind.DISCONNECT) and (len(header) != 3 or payload):
        raise ValueError(f"MEMO-02: {Kind(kind).name} with more than its header")
    return Message(Kind(kind), ident, payload, tuple(header[3:]))


def _order(name: str) -> tuple[int, bytes]:
    return len(name), name.encode()


def ready(services: Sequence[str]) -> bytes:
    return encode(Kind.READY, b"", b"", sorted(services, key=_order))


def job(service: str, payload: bytes, timeout_ms: int = 5000) -> bytes:
    return encode(Kind.JOB, b"", payload, service, timeout_ms)


@dataclass(frozen=True)
class Memo01Finding:
    """A rule the broker broke, and the smallest plan found that breaks it."""

    rule: str
    explanation: str
    seed: int
    scenario: int
    steps: tuple[Step, ...] = ()
    scenarios: int = 1


@dataclass(frozen=True)
class Memo01FuzzResult:
    """What ``fuzz_memo01`` ran and found."""

    scenarios: int
    seconds: float
    seed: int
    findings: tuple[Memo01Finding, ...]
    judged: Counter[str] = field(default_factory=Counter)
    held: Counter[str] = field(default_factory=Counter)
    rules: tuple[str, ...] = RULES


class _Found(Exception):
    def __init__(self, rule: str, explanation: str) -> None:
        super().__init__(explanation)
        self.rule = rule


def _check(condition: bool, rule: str, explanation: str) -> None:
    if not condition:
        raise _Found(rule, explanation)


def _read(data: bytes) -> Message:
    try:
        return parse(data)
    except ValueError as error:
        rule, _, why = str(error).partition(": ")
        raise _Found(rule, f"the broker sent {data[:40]!r}: {why}") from None


async def _worker(
    socket: pynng.Socket, services: tuple[str, ...], ran: list[tuple[str, bytes]]
) -> None:
    """A well-behaved memo01 worker: RESULT is the payload reversed, tagged with the service."""
    context = socket.new_context()
    try:
        request = ready(services)
        while True:
            await context.asend(request)
            message = _read(bytes(await context.arecv()))
            if message.kind is Kind.JOB:
                service = message.extra[0] if message.extra else ""
                _check(service in services, "MEMO-11", f"a JOB for {service!r}, not offered")
                ran.append((service, message.payload))
                if message.payload.startswith(b"slow"):
                    await trio.sleep(0.2)
                result = str(service).encode() + b":" + message.payload[::-1]
                request = encode(Kind.RESULT, message.ident, result)
            elif message.kind is Kind.HEARTBEAT:
                request = encode(Kind.HEARTBEAT, message.ident)
            else:
                request = ready(services)
    finally:
        context.close()


async def _ask(socket: pynng.Socket, message: bytes, wait: float = WAIT) -> bytes | None:
    """Send one request on a context of its own; the reply, or None after ``wait``."""
    context = socket.new_context()
    try:
        with trio.move_on_after(wait):
            await context.asend(message)
            return bytes(await context.arecv())
        return None
    finally:
        context.close()


async def _ask_into(socket: pynng.Socket, message: bytes, replies: list[bytes | None]) -> None:
    replies.append(await _ask(socket, message))


class _Scenario:
    def __init__(self, url: str, plan: Sequence[Step], tag: str) -> None:
        self.url = url
        self.plan = plan
        self.tag = tag
        self.judged: set[str] = set()

    async def play(self) -> None:
        setup = self.plan[0].arg if self.plan and self.plan[0].kind == "setup" else 0
        rng = random.Random(setup)
        with pynng.Req0(resend_time=-1) as socket:
            socket.dial(self.url, block=False)
            ran: list[tuple[str, bytes]] = []
            async with trio.open_nursery() as nursery:
                offered: set[str] = set()
                for _ in range(rng.randint(1, 3)):
                    chosen = [self.tag + name for name in rng.sample(SERVICES, rng.randint(1, 3))]
                    services = tuple(sorted(chosen, key=_order))
                    offered |= set(services)
                    nursery.start_soon(_worker, socket, services, ran)
                for step in self.plan:
                    if step.kind != "setup":
                        await self.step(step, socket, sorted(offered), ran)
                nursery.cancel_scope.cancel()

    async def step(
        self, step: Step, socket: pynng.Socket, offered: list[str], ran: list[tuple[str, bytes]]
    ) -> None:
        rng = random.Random(step.arg)
        service = rng.choice(offered)
        payload = b"%d" % rng.randrange(10**9)
        self.judged.update(STEP_RULES.get(step.kind, ()))
        self.judged.add("MEMO-02")
        if step.kind == "job":
            reply = await _ask(socket, job(service, payload))
            _check(reply is not None, "MEMO-05", f"no RESULT for a JOB for {service!r}")
            assert reply is not None
            got = _read(reply)
            expected = service.encode() + b":" + payload[::-1]
            _check(
                got.kind is Kind.RESULT and got.payload == expected,
                "MEMO-05",
                f"a JOB for {service!r} answered {got.kind.name} {got.payload!r}",
            )
        elif step.kind == "twice":
            slow = job(service, b"slow" + payload)
            replies: list[bytes | None] = []
            async with trio.open_nursery() as twice:
                twice.start_soon(_ask_into, socket, slow, replies)
                await trio.sleep(0.05)
                twice.start_soon(_ask_into, socket, slow, replies)
            _check(None not in replies, "MEMO-16", "an identical JOB got no RESULT")
            runs = sum(1 for s, p in ran if s == service and p == b"slow" + payload)
            _check(runs == 1, "MEMO-16", f"an identical JOB sent twice ran {runs} times")
        elif step.kind == "stale":
            stale = b"\xde\xad" + payload[:6]
            kind = rng.choice((Kind.HEARTBEAT, Kind.RESULT))
            reply = await _ask(socket, encode(kind, stale))
            _check(
                reply is not None and _read(reply).kind is Kind.DISCONNECT,
                "MEMO-10",
                f"a {kind.name} with an id the broker never gave got no DISCONNECT",
            )
        elif step.kind == "bad-ready":
            unsorted = encode(Kind.READY, b"", b"", ["bb", "a"])
            reply = await _ask(socket, unsorted)
            _check(
                reply is not None and _read(reply).kind is Kind.DISCONNECT,
                "MEMO-03",
                "a READY with its services out of order got no DISCONNECT",
            )
        elif step.kind == "garbage":
            garbage = rng.choice((b"", b"\xff\x00junk", job(service, b"")[:-2]))
            reply = await _ask(socket, garbage, wait=0.3)
            _check(reply is None, "MEMO-18", f"garbage {garbage!r} got a reply")
        elif step.kind == "leave":
            await self.leave(socket, payload)
        elif step.kind == "out-of-turn":
            # A worker of a service of its own, idle, sends a RESULT: out of turn (MEMO-09).
            own = f"{self.tag}o{rng.randrange(1000)}"
            context = socket.new_context()
            answer: Message | None = None
            beat: Message | None = None
            try:
                with trio.move_on_after(WAIT):
                    await context.asend(ready([own]))
                    beat = _read(bytes(await context.arecv()))  # a HEARTBEAT, once idle a while
                    await context.asend(encode(Kind.RESULT, beat.ident, b"unasked"))
                    answer = _read(bytes(await context.arecv()))
            finally:
                context.close()
            if beat is not None:  # no HEARTBEAT to an idle worker: its id is unknown here
                what = "nothing" if answer is None else answer.kind.name
                _check(
                    answer is not None and answer.kind is Kind.DISCONNECT,
                    "MEMO-09",
                    f"a RESULT from an idle worker got {what}, not DISCONNECT",
                )

    async def leave(self, socket: pynng.Socket, payload: bytes) -> None:
        """A worker answers its one JOB saying it is leaving: its RESULT is forwarded, it gets
        DISCONNECT (MEMO-06), and a later JOB for its service is not given to it."""
        own = f"{self.tag}l{payload[:4].decode()}"
        context = socket.new_context()
        replies: list[bytes | None] = []
        answer: Message | None = None
        left = False
        try:
            with trio.move_on_after(WAIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_ask_into, socket, job(own, payload), replies)
                    await context.asend(ready([own]))
                    got = _read(bytes(await context.arecv()))
                    while got.kind is Kind.HEARTBEAT:
                        await context.asend(encode(Kind.HEARTBEAT, got.ident))
                        got = _read(bytes(await context.arecv()))
                    _check(got.kind is Kind.JOB, "MEMO-05", f"a worker got {got.kind.name}")
                    await context.asend(encode(Kind.RESULT, got.ident, b"bye", True))
                    left = True
                    answer = _read(bytes(await context.arecv()))
        finally:
            context.close()
        if left:
            what = "nothing" if answer is None else answer.kind.name
            _check(
                answer is not None and answer.kind is Kind.DISCONNECT,
                "MEMO-06",
                f"a leaving RESULT was answered {what}, not DISCONNECT",
            )
            forwarded = [r for r in replies if r is not None and _read(r).payload == b"bye"]
            _check(bool(forwarded), "MEMO-06", "the leaving worker's RESULT was not forwarded")


def _play(url: str, plan: Sequence[Step], tag: str) -> Outcome:
    scenario = _Scenario(url, plan, tag)

    async def main() -> None:
        with trio.fail_after(60):
            await scenario.play()

    broken: list[Violation] = []
    try:
        trio.run(main)
    except* _Found as group:  # from the scenario, or from a worker task in its nursery
        found = group.exceptions[0]
        assert isinstance(found, _Found)
        broken.append(Violation(found.rule, str(found)))
    return Outcome(broken, frozenset(scenario.judged))


class Memo01Planner:
    """memo01 plans: a setup seed, then six steps, one in two for the rules judged least."""

    rules: tuple[str, ...] = RULES
    death_rule = "MEMO-18"

    def draw(self, rng: random.Random, judged: Mapping[str, int]) -> tuple[Step, ...]:
        plan = [Step("setup", 0, rng.randrange(2**31))]
        for _ in range(STEPS_PER_SCENARIO):
            if rng.random() < 0.5:
                kind = rng.choice(KINDS)
            else:
                kind = min(
                    KINDS,
                    key=lambda k: min(judged.get(r, 0) for r in STEP_RULES[k]) + 3 * rng.random(),
                )
            plan.append(Step(kind, 0, rng.randrange(2**31)))
        return tuple(plan)

    def simpler(self, step: Hashable) -> Sequence[Hashable]:
        return []


def fuzz_memo01(
    url: str,
    *,
    scenarios: int = 20,
    seed: int = 0,
    time_budget: float = 60.0,
    lanes: int = 4,
    stop_after: Sequence[str] = (),
    first: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Memo01FuzzResult:
    """Run up to ``scenarios`` memo01 scenarios, ``lanes`` at a time, against the broker at NNG
    ``url`` (without the ``nng+`` prefix); the rules it broke, one finding per rule with the
    smallest plan found that breaks it."""
    counter = iter(range(10**9))
    lock = threading.Lock()

    class Lane:
        def __init__(self, index: int) -> None:
            self.index = index

        def play(self, plan: Sequence[Hashable]) -> Outcome:
            with lock:
                number = next(counter)
            steps = [s for s in plan if isinstance(s, Step)]
            return _play(url, steps, f"s{seed}-{number}-")

        def close(self) -> None:
            pass

    searched = search(
        Lane,
        Memo01Planner(),
        seed=seed,
        lanes=lanes,
        time_budget=time_budget,
        examples=scenarios,
        stop_after=stop_after,
        first=first,
        progress=progress,
    )
    if searched.errors:
        raise RuntimeError(f"the memo01 fuzzer failed: {searched.errors[0]}")
    findings = tuple(
        Memo01Finding(
            f.violation.rule,
            f.violation.explanation,
            seed,
            -1,
            tuple(s for s in f.plan if isinstance(s, Step)),
            f.scenarios,
        )
        for f in searched.findings
    )
    return Memo01FuzzResult(
        searched.scenarios,
        searched.seconds,
        seed,
        findings,
        Counter(searched.judged),
        Counter(searched.held),
    )


def replay_memo01(url: str, steps: Sequence[Step]) -> list[Violation]:
    """Play one saved memo01 plan once; the rules it broke."""
    return _play(url, steps, f"replay-{random.Random().randrange(10**6)}-").violations
