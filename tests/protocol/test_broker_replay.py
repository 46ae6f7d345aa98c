"""Recorded inputs replayed into a fresh broker, in this process and in fresh ones (MDP-D-03).

A scripted long run (``long_run``) plays a busy broker: workers with random identities come and
go, answer the requests the broker sends them (PARTIALs, then a FINAL), die silently or say
DISCONNECT; clients ask, ask twice, query ``mmi.service``; garbage arrives; the I/O layer reports
unreachable and congested peers; time moves on a grid and by floats; the run ends with
``shutdown``. Its inputs are recorded with what the broker did.

The recording is then replayed by ``broker_replayer.py`` into a fresh ``Broker``: here, and in
two new interpreters with other ``PYTHONHASHSEED`` values, so that iterating over a set of
peers or any other hash-order dependence shows up as a different line. All must match the
original run line for line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

from domo.protocol.broker import Broker
from domo.protocol.mdp import Frames

from .broker_replayer import CONFIG, Record, apply, replay
from .mdp_strategies import plain

W = b"MDPW02"
C = b"MDPC02"
SERVICES = (b"echo", b"upper", b"slow")
REPLAYER = Path(__file__).with_name("broker_replayer.py")


@dataclass
class SimWorker:
    """A simulated worker: its identity, what it was asked and whether it still talks."""

    peer: bytes
    service: bytes
    jobs: list[bytes] = field(default_factory=list)  # client addresses of requests received
    partials_sent: int = 0
    alive: bool = True


@dataclass
class Recorder:
    """Feeds a broker and records each input with the line it produced."""

    broker: Broker = field(default_factory=lambda: Broker(CONFIG))
    records: list[Record] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    now: float = 0.0

    def call(
        self, kind: str, peer: bytes | None = None, frames: tuple[bytes, ...] = ()
    ) -> list[tuple[bytes, Frames]]:
        """Apply and record one input; returns what the broker sent (bytes only: so it was
        given)."""
        record: Record = [
            kind,
            None if peer is None else peer.hex(),
            [f.hex() for f in frames] if kind == "receive" else None,
            self.now,
        ]
        self.records.append(record)
        line, outbox = apply(self.broker, record)
        self.lines.append(line)
        return [(peer, plain(frames)) for peer, frames in outbox]


def long_run(seed: int, steps: int) -> Recorder:
    """A closed-loop run: the simulated peers react to what the broker sends them."""
    rng = Random(seed)
    rec = Recorder()
    workers: dict[bytes, SimWorker] = {}
    clients = [b"client-" + rng.randbytes(3) for _ in range(12)]

    def act(kind: str, peer: bytes | None = None, frames: tuple[bytes, ...] = ()) -> None:
        for to, sent in rec.call(kind, peer, frames):
            worker = workers.get(to)
            if worker is None:
                continue
            if sent[1] == b"\x02":
                worker.jobs.append(sent[2])
            elif sent[1] == b"\x06":
                worker.alive = False  # told DISCONNECT: this connection is over

    for _ in range(steps):
        choice = rng.random()
        live = [w for w in workers.values() if w.alive]
        if choice < 0.08 or not live:
            peer = b"w-" + rng.randbytes(rng.randint(1, 6))
            service = rng.choice(SERVICES)
            workers[peer] = SimWorker(peer, service)
            act("receive", peer, (W, b"\x01", service))
        elif choice < 0.30:
            worker = rng.choice(live)
            if worker.jobs:
                client = worker.jobs[0]
                body: tuple[bytes, ...] = (rng.randbytes(rng.randint(0, 6)),)
                if rng.random() < 0.3:
                    worker.partials_sent += 1
                    act("receive", worker.peer, (W, b"\x03", client, b"", *body))
                else:
                    worker.jobs.pop(0)
                    act("receive", worker.peer, (W, b"\x04", client, b"", *body))
            else:
                act("receive", worker.peer, (W, b"\x05"))
        elif choice < 0.40:
            for worker in live:
                if rng.random() < 0.9:
                    act("receive", worker.peer, (W, b"\x05"))
        elif choice < 0.43:
            rng.choice(live).alive = False  # silent death
        elif choice < 0.45:
            worker = rng.choice(live)
            worker.alive = False
            act("receive", worker.peer, (W, b"\x06"))
        elif choice < 0.65:
            client = rng.choice(clients)
            service = rng.choice([*SERVICES, b"nobody"])
            body = tuple(rng.randbytes(rng.randint(1, 8)) for _ in range(rng.randint(1, 3)))
            act("receive", client, (C, b"\x01", service, *body))
        elif choice < 0.68:
            client = rng.choice(clients)
            query = rng.choice([*SERVICES, b"nobody", b"ech"])
            act("receive", client, (C, b"\x01", rng.choice([b"mmi.service", b"mmi.x"]), query))
        elif choice < 0.72:
            peer = rng.choice([*clients, *workers])
            frames = tuple(rng.randbytes(rng.randint(0, 4)) for _ in range(rng.randint(0, 5)))
            if rng.random() < 0.6:
                frames = (rng.choice([W, C]), *frames[1:])
            act("receive", peer, frames)
        elif choice < 0.74:
            peer = rng.choice([*clients, *workers])
            act(rng.choice(["unreachable", "congested"]), peer)
        else:
            if rng.random() < 0.7:
                rec.now += rng.randint(0, 4) * 0.25
            else:
                rec.now += rng.uniform(0, 1)
            if rng.random() < 0.5:
                act("tick")
    act("shutdown")
    return rec


def run_replayer(records: list[Record], hash_seed: str) -> list[str]:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    result = subprocess.run(
        [sys.executable, str(REPLAYER)],
        input=json.dumps(records),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    lines: list[str] = json.loads(result.stdout)
    return lines


def first_difference(a: list[str], b: list[str]) -> str:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"call {index}:\n  {x}\n  {y}"
    return f"lengths {len(a)} and {len(b)}"


def test_long_run_is_rich() -> None:
    """The recording exercises what the replay is meant to cover (else it proves little)."""
    rec = long_run(seed=18, steps=2500)
    text = "\n".join(rec.lines)
    for needle in (
        "RequestCompleted",
        "PartialForwarded",
        "RequestRedispatched",
        "WorkerExpired",
        "RequestExpired",
        "MmiReplied",
        "ProtocolViolation",
        "'broker-shutdown'",
        "MDPW02', b'\\x05'",  # heartbeats sent
    ):
        assert needle in text, needle
    assert text.count("broker-shutdown") >= 4  # several workers and requests at the end


def test_replay_in_this_process() -> None:
    """MDP-D-03: a fresh broker fed the same inputs does exactly the same."""
    rec = long_run(seed=18, steps=2500)
    again = replay(rec.records)
    assert again == rec.lines, first_difference(rec.lines, again)


def test_replay_in_fresh_processes_with_other_hash_seeds() -> None:
    """MDP-D-03: the same inputs in a new interpreter, with other string hashing, give
    identical events and outbox (nothing may depend on set or hash order)."""
    rec = long_run(seed=18, steps=2500)
    for hash_seed in ("1", "4242"):
        lines = run_replayer(rec.records, hash_seed)
        assert lines == rec.lines, (hash_seed, first_difference(rec.lines, lines))
