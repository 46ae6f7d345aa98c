"""``domo.protocol`` is sans-IO and deterministic (``/work/shared/design.md`` §1, §2).

- Statically: no module under ``src/domo/protocol`` imports anything but pure standard-library
  modules, ``typing_extensions`` and its own package; no ``open``/``print``/``__import__`` call.
- Dynamically: importing ``domo.protocol`` and every submodule in a fresh interpreter loads no
  trio, zmq, socket, asyncio, selectors, threading, random, uuid... (``sys.modules`` before and
  after).
- Deterministically: a seeded script of a broker, worker sessions and client sessions wired
  together in memory gives the very same transcript (events, messages, deadlines) in this process
  and in fresh ones with other ``PYTHONHASHSEED`` values (MDP-D-03: time is an input, and nothing
  iterates in hash order).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import domo.protocol
from domo.protocol import (
    Broker,
    BrokerConfig,
    ClientConfig,
    ClientSession,
    ClientState,
    LocalProtocolError,
    WorkerConfig,
    WorkerSession,
    WorkerState,
)

from .mdp_strategies import plain

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_DIR = Path(domo.protocol.__file__).resolve().parent  # the copy under test (mutants too)

# Standard-library modules that do no I/O, read no clock and draw no random number.
PURE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "contextlib",
        "copy",
        "dataclasses",
        "enum",
        "functools",
        "heapq",
        "itertools",
        "keyword",
        "math",
        "numbers",
        "operator",
        "re",
        "string",
        "struct",
        "types",
        "typing",
    }
)
# cbor2: memo01's CBOR codec (the nng extra), bytes in and bytes out; the dynamic check below
# holds it to the same "loads no I/O" bar as the rest.
ALLOWED_THIRD_PARTY = frozenset({"typing_extensions", "cbor2"})
# Named in the failure message when one of them shows up: I/O, clocks, randomness, concurrency.
FORBIDDEN = frozenset(
    {
        "asyncio",
        "concurrent",
        "datetime",
        "importlib",
        "io",
        "logging",
        "multiprocessing",
        "os",
        "pathlib",
        "random",
        "secrets",
        "select",
        "selectors",
        "signal",
        "socket",
        "ssl",
        "subprocess",
        "sys",
        "threading",
        "time",
        "trio",
        "uuid",
        "zmq",
    }
)
FORBIDDEN_CALLS = frozenset({"open", "print", "input", "__import__", "breakpoint"})


def impurities(source: str, filename: str = "<source>") -> list[str]:
    """Every import or call in ``source`` that a sans-IO module must not make."""
    problems: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                problems.append(f"{filename}:{node.lineno}: relative import leaves domo.protocol")
            elif node.level == 0 and node.module is not None:
                modules = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            problems.append(f"{filename}:{node.lineno}: calls {node.func.id}()")
        for module in modules:
            top = module.split(".")[0]
            if top in FORBIDDEN or top not in PURE_STDLIB | ALLOWED_THIRD_PARTY:
                problems.append(f"{filename}:{getattr(node, 'lineno', '?')}: imports {module}")
    return problems


def test_the_scanner_finds_what_it_looks_for() -> None:
    """The static check can fail: each kind of impurity is reported."""
    source = (
        "import trio\n"
        "import os.path\n"
        "from zmq import Socket\n"
        "from time import monotonic\n"
        "from .. import trio as sibling\n"
        "import numpy\n"
        "from . import mdp\n"
        "from collections.abc import Sequence\n"
        "def f():\n"
        "    import socket\n"
        "    print(open('x'))\n"
        "    return __import__('random')\n"
    )
    found = impurities(source)
    assert len(found) == 10, found
    for word in ("trio", "os.path", "zmq", "time", "leaves", "numpy", "socket", "print()"):
        assert any(word in problem for problem in found), word


def test_protocol_modules_import_nothing_impure() -> None:
    """Every module under domo/protocol, statically: imports and calls."""
    files = sorted(PROTOCOL_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"mdp.py", "worker.py", "client.py", "_session.py"}
    problems = [
        problem
        for path in files
        for problem in impurities(path.read_text(encoding="utf-8"), path.name)
    ]
    assert problems == []


# Loaded at import time by nothing pure. ``_socket`` (the C module) is not listed: the
# ``typing_extensions`` dependency imports it for ``CapsuleType``; ``socket`` itself is.
NOT_LOADED = (
    "trio",
    "zmq",
    "socket",
    "asyncio",
    "selectors",
    "select",
    "threading",
    "subprocess",
    "multiprocessing",
    "concurrent",
    "random",
    "uuid",
    "signal",
    "ssl",
    "queue",
)

_IMPORT_PROBE = """
import sys
before = sorted(sys.modules)
for name in NAMES:
    __import__(name)
import domo
print(repr({"before": before, "after": sorted(sys.modules), "domo": domo.__file__}))
"""


def test_importing_the_core_loads_no_io() -> None:
    """A fresh interpreter: domo.protocol and all its submodules load no I/O or concurrency."""
    # memo01 needs cbor2 (the nng extra): without it, the rest is checked.
    optional = set() if importlib.util.find_spec("cbor2") else {"memo01"}
    names = ["domo.protocol"] + [
        f"domo.protocol.{path.stem}"
        for path in sorted(PROTOCOL_DIR.glob("*.py"))
        if path.stem != "__init__" and path.stem not in optional
    ]
    probe = _IMPORT_PROBE.replace("NAMES", repr(names))
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    seen = ast.literal_eval(result.stdout)
    assert Path(seen["domo"]).resolve().parent == PROTOCOL_DIR.parent  # the same domo as here
    before, after = set(seen["before"]), set(seen["after"])
    assert set(names) <= after
    for module in NOT_LOADED:
        assert module not in before, f"{module} is loaded at startup: this check would be void"
        loaded = sorted(m for m in after if m == module or m.startswith(module + "."))
        assert loaded == [], f"importing domo.protocol loaded {loaded}"


# --- determinism ------------------------------------------------------------------------------

SEED = 18  # RFC 18


def transcript(seed: int = SEED, steps: int = 400) -> str:
    """Run a broker, 5 worker sessions and 4 client sessions from a seeded script; log all.

    The "runtime" here moves messages between the machines in memory, opens a new identity for
    each new socket, and makes the applications act at random (replies, requests, cancels,
    closes, garbage). Everything observable goes into the log, in order.
    """
    rng = random.Random(seed)
    log: list[str] = []
    broker = Broker(BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=4.0))
    workers = [
        WorkerSession(b"svc%d" % (i % 3), WorkerConfig(heartbeat_interval=1.0, liveness=3))
        for i in range(5)
    ]
    clients = [ClientSession(ClientConfig(timeout=2.0, retries=1)) for _ in range(4)]
    sessions: list[WorkerSession | ClientSession] = [*workers, *clients]
    identity: dict[int, bytes] = {}  # id(session) -> its current socket's ROUTER identity
    sockets = 0
    now = 0.0

    def record(what: str, result: object) -> None:
        log.append(f"{now!r} {what} {result!r}")

    def open_socket(session: WorkerSession | ClientSession, name: str) -> None:
        nonlocal sockets
        sockets += 1
        identity[id(session)] = b"%s-%d" % (name.encode(), sockets)
        record(f"{name}.connected", session.connected(now))

    def pump() -> None:
        for _ in range(20):  # bounded: a message exchange settles in a few rounds
            moved = False
            for session in sessions:
                for frames in session.take_outgoing():
                    moved = True
                    peer = identity[id(session)]
                    record(f"broker.receive {peer!r} {frames!r}", broker.receive(peer, frames, now))
            by_identity = {identity[id(s)]: s for s in sessions if id(s) in identity}
            for peer, relayed in broker.take_outgoing():
                moved = True
                target = by_identity.get(peer)
                if target is not None:
                    frames = plain(relayed)
                    record(f"{peer!r}.receive {frames!r}", target.receive(frames, now))
            record("broker.flushed", broker.flushed())  # what was taken was sent (MDP-D-24)
            if not moved:
                return

    def act() -> None:
        choice = rng.randrange(10)
        if choice < 3:
            worker = rng.choice(workers)
            if worker.state is WorkerState.BUSY:
                body = (b"reply %d" % rng.randrange(100),)
                final = rng.random() < 0.6
                call = worker.send_final if final else worker.send_partial
                record("worker.reply", call(body, now))
            elif rng.random() < 0.05 and worker.state is not WorkerState.CLOSED:
                record("worker.disconnect", worker.disconnect(now))
        elif choice < 6:
            client = rng.choice(clients)
            if client.state is ClientState.IDLE:
                service = rng.choice([b"svc0", b"svc1", b"svc2", b"nobody", b"mmi.service"])
                record("client.request", client.request(service, (b"q%d" % choice,), now))
            elif client.state is ClientState.WAITING and rng.random() < 0.05:
                record("client.cancel", client.cancel(now))
        elif choice == 6:
            peer = rng.choice([b"stranger", *identity.values()])
            garbage = rng.choice([[b"junk"], [b"MDPW02", b"\x05", b"x"], [b"MDPC02", b"\x02"]])
            record(f"broker.receive garbage {peer!r}", broker.receive(peer, garbage, now))
        elif choice == 7:
            try:  # misuse: refused, and changes nothing
                rng.choice(workers).send_final((b"not busy?",), now)
            except LocalProtocolError as error:
                record("refused", str(error))

    for index, worker in enumerate(workers):
        open_socket(worker, f"w{index}")
    for index, client in enumerate(clients):
        open_socket(client, f"c{index}")
    for _ in range(steps):
        now += rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()])
        record("broker.tick", broker.tick(now))
        for index, session in enumerate(sessions):
            record(f"session{index}.tick", session.tick(now))
            reconnect = isinstance(session, WorkerSession) and (
                session.state is WorkerState.DISCONNECTED and now >= session.reconnect_at
            )
            reconnect = reconnect or (
                isinstance(session, ClientSession)
                and session.state in (ClientState.DISCONNECTED, ClientState.RECONNECTING)
            )
            if reconnect:
                open_socket(session, f"s{index}")
        act()
        pump()
        deadlines = [broker.next_deadline()] + [s.next_deadline() for s in sessions]
        record("deadlines", deadlines)
        record("states", [s.state.name for s in sessions])
        record("broker", (broker.workers(), broker.requests(), broker.services()))
    return "\n".join(log)


def test_the_transcript_exercises_the_protocol() -> None:
    """The determinism check below means something: the script does real work."""
    text = transcript()
    for needle in (
        "RequestReceived",
        "PartialReceived",
        "FinalReceived",
        "RequestCompleted",
        "ReconnectRequired",
        "RequestFailed",
        "WorkerRegistered",
        "MmiReplied",
        "ProtocolViolation",
        "refused",
    ):
        assert needle in text, needle


@pytest.mark.parametrize("hash_seed", ["0", "4242"])
def test_same_inputs_same_outputs_in_a_fresh_process(hash_seed: str) -> None:
    """MDP-D-03: the same script in a fresh interpreter with another hash seed: same transcript."""
    here = transcript()
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    code = (
        "import sys; from tests.protocol.test_purity import transcript as t; sys.stdout.write(t())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env
    )
    here_lines, there_lines = here.splitlines(), result.stdout.splitlines()
    for line, (mine, theirs) in enumerate(zip(here_lines, there_lines, strict=False)):
        assert theirs == mine, f"line {line} differs"
    assert len(there_lines) == len(here_lines)
