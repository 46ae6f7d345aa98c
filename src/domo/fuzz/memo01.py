"""``domo fuzz --dialect memo01``: random memo01 scenarios against a broker's NNG endpoint.

The MDP fuzzer (``domo.fuzz``) drives ZeroMQ peers; memo01 (``specs/memo01.md``) lives on NNG,
so this is a smaller search of its own: each scenario, drawn from a seeded ``random.Random``,
starts memo01 workers (pynng req0 contexts on one socket, random service sets) and clients
(a context per job) and mixes in what a broker must survive, then checks what came back:

- every JOB is answered by a RESULT carrying the payload the worker computed for it, from a
  worker that serves the service (MEMO-05, MEMO-11);
- an identical JOB sent twice while the first runs is run once, and both get the RESULT
  (MEMO-16);
- a HEARTBEAT or RESULT with an id the broker never gave gets DISCONNECT (MEMO-10);
- a READY whose services are not in MEMO-03's order gets DISCONNECT (MEMO-03, MEMO-18);
- garbage and malformed JOBs get no reply, and the broker goes on serving (MEMO-18).

A broken rule is a ``Memo01Finding`` with its rule id, the seed and scenario number that repeat
it. Needs the ``nng`` extra (pynng, cbor2).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import cbor2
import pynng
import trio

from domo.protocol.dialects.memo01 import MessageType, encode, parse

__all__ = ["Memo01Finding", "Memo01FuzzResult", "fuzz_memo01"]

SERVICES = ("a", "b", "cc")
WAIT = 5.0  # seconds a scenario's replies may take on a loaded machine


@dataclass(frozen=True)
class Memo01Finding:
    """A rule the broker broke, and how to repeat it."""

    rule: str
    explanation: str
    seed: int
    scenario: int


@dataclass(frozen=True)
class Memo01FuzzResult:
    """What ``fuzz_memo01`` ran and found."""

    scenarios: int
    seconds: float
    seed: int
    findings: tuple[Memo01Finding, ...]


class _Found(Exception):
    def __init__(self, rule: str, explanation: str) -> None:
        super().__init__(explanation)
        self.rule = rule


def _check(condition: bool, rule: str, explanation: str) -> None:
    if not condition:
        raise _Found(rule, explanation)


async def _worker(
    socket: pynng.Socket, services: tuple[str, ...], ran: list[tuple[str, bytes]]
) -> None:
    """A well-behaved memo01 worker: RESULT is the payload reversed, tagged with the service."""
    ready = encode(MessageType.READY, services=services)
    context = socket.new_context()
    try:
        request = ready
        while True:
            await context.asend(request)
            message = parse(await context.arecv(), from_broker=True)
            if message.type is MessageType.JOB:
                _check(message.service in services, "MEMO-11", "a JOB for a service not offered")
                ran.append((message.service, message.payload))
                if message.payload.startswith(b"slow"):
                    await trio.sleep(0.2)
                result = message.service.encode() + b":" + message.payload[::-1]
                request = encode(MessageType.RESULT, message.id, result)
            elif message.type is MessageType.HEARTBEAT:
                request = encode(MessageType.HEARTBEAT, message.id)
            else:
                request = ready
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


async def _scenario(url: str, rng: random.Random, tag: str) -> None:
    """One scenario; its services are named after ``tag``, so that the workers of earlier
    scenarios (gone, but registered until the broker notices) are never its workers."""
    with pynng.Req0(resend_time=-1) as socket:
        socket.dial(url, block=False)
        ran: list[tuple[str, bytes]] = []
        async with trio.open_nursery() as nursery:
            offered: set[str] = set()
            for _ in range(rng.randint(1, 3)):
                chosen = [tag + name for name in rng.sample(SERVICES, rng.randint(1, 3))]
                services = tuple(sorted(chosen, key=lambda name: (len(name), name)))
                offered |= set(services)
                nursery.start_soon(_worker, socket, services, ran)
            kinds = ("job", "twice", "stale", "bad-ready", "garbage")
            steps = [rng.choice(kinds) for _ in range(6)]
            for step in steps:
                service = rng.choice(sorted(offered))
                payload = b"%d" % rng.randrange(10**9)
                if step == "job":
                    job = encode(MessageType.JOB, b"", payload, service=service, timeout_ms=5000)
                    reply = await _ask(socket, job)
                    _check(reply is not None, "MEMO-05", f"no RESULT for a JOB for {service!r}")
                    assert reply is not None
                    got = parse(reply, from_broker=True)
                    expected = service.encode() + b":" + payload[::-1]
                    _check(
                        got.type is MessageType.RESULT and got.payload == expected,
                        "MEMO-05",
                        f"a JOB for {service!r} answered {got.type.name} {got.payload!r}",
                    )
                elif step == "twice":
                    slow = b"slow" + payload
                    job = encode(MessageType.JOB, b"", slow, service=service, timeout_ms=5000)
                    replies: list[bytes | None] = []

                    async with trio.open_nursery() as twice:
                        twice.start_soon(_ask_into, socket, job, replies)
                        await trio.sleep(0.05)
                        twice.start_soon(_ask_into, socket, job, replies)
                    _check(None not in replies, "MEMO-16", "an identical JOB got no RESULT")
                    runs = sum(1 for s, p in ran if s == service and p == slow)
                    _check(runs == 1, "MEMO-16", f"an identical JOB sent twice ran {runs} times")
                elif step == "stale":
                    stale = b"\xde\xad" + payload[:6]
                    kind = rng.choice((MessageType.HEARTBEAT, MessageType.RESULT))
                    reply = await _ask(socket, encode(kind, stale))
                    _check(
                        reply is not None
                        and parse(reply, from_broker=True).type is MessageType.DISCONNECT,
                        "MEMO-10",
                        f"a {kind.name} with an id the broker never gave got no DISCONNECT",
                    )
                elif step == "bad-ready":
                    reply = await _ask(socket, _unsorted_ready())
                    _check(
                        reply is not None
                        and parse(reply, from_broker=True).type is MessageType.DISCONNECT,
                        "MEMO-03",
                        "a READY with its services out of order got no DISCONNECT",
                    )
                else:
                    garbage = rng.choice((b"", b"\xff\x00junk", encode(MessageType.JOB)[:-2]))
                    reply = await _ask(socket, garbage, wait=0.3)
                    _check(reply is None, "MEMO-18", f"garbage {garbage!r} got a reply")
            nursery.cancel_scope.cancel()


async def _ask_into(socket: pynng.Socket, message: bytes, replies: list[bytes | None]) -> None:
    replies.append(await _ask(socket, message))


def _unsorted_ready() -> bytes:
    return bytes(cbor2.dumps(["memo01", 1, b"", ["bb", "a"]], canonical=True))


async def _fuzz(url: str, scenarios: int, seed: int, time_budget: float) -> Memo01FuzzResult:
    started = time.monotonic()
    findings: dict[str, Memo01Finding] = {}
    ran = 0
    for number in range(scenarios):
        if time.monotonic() - started > time_budget:
            break
        ran += 1
        try:
            with trio.fail_after(60):
                await _scenario(url, random.Random(seed * 1_000_003 + number), f"s{seed}-{number}-")
        except* _Found as group:  # from the scenario, or from a worker task in its nursery
            found = group.exceptions[0]
            assert isinstance(found, _Found)
            findings.setdefault(found.rule, Memo01Finding(found.rule, str(found), seed, number))
    seconds = time.monotonic() - started
    return Memo01FuzzResult(ran, seconds, seed, tuple(findings.values()))


def fuzz_memo01(
    url: str, *, scenarios: int = 20, seed: int = 0, time_budget: float = 60.0
) -> Memo01FuzzResult:
    """Run up to ``scenarios`` memo01 scenarios against the broker at NNG ``url`` (without the
    ``nng+`` prefix); the rules it broke, one finding per rule."""
    return trio.run(_fuzz, url, scenarios, seed, time_budget)
