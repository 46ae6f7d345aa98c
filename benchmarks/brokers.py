"""domo's broker beside majortomo's and a raw pyzmq forwarder, each in its own processes.

Systems (broker / workers and clients):

- ``domo``: ``serve_broker`` / ``run_worker`` and ``Client``;
- ``domo+pyzmq``: ``serve_broker`` / blocking pyzmq peers framed by hand (broker cost alone);
- ``majortomo``: majortomo 0.2.0's ``Broker`` / its ``Worker`` and ``Client`` (its own variant
  of the framing), run from ``.bench-venvs/majortomo``, which this script creates with
  ``python -m venv`` and pip the first time (``--no-majortomo`` skips it);
- ``raw``: a ROUTER forwarding bodies between DEALERs with no protocol logic: the ceiling for a
  brokered round trip.

Scenarios: (a) one client, one request at a time, one echo worker, 16-byte bodies; (b) 8 client
processes x 8 sessions = 64 in flight, 4 echo workers; (c) 1 MiB bodies, 8 in flight, 4 workers;
(d) 2,000 idle workers heartbeating every second plus (a)'s client and worker, the client
pausing 20 ms between requests (the broker's CPU is then mostly the heartbeats'); (e) 10,000
workers registering (broker RSS, time until the broker is quiet again) and, on a fresh broker,
10,000 queued requests (for the raw forwarder: connections that say "ready" or send a body,
which is what ZeroMQ itself holds per peer). Scenarios and systems are interleaved (a: A B C D,
b: A B C D, ..., then again) over ``--reps`` repetitions so that drift hits every system alike;
medians and min-max are reported, with the ratios domo/majortomo and domo/raw against the goals
of issue 5.

Broker CPU is the broker process's own user+system time (``/proc/PID/stat``, which is what
``getrusage`` reports inside it) over the measured window; RSS is its ``VmRSS``. The workers' and
the clients' CPU per request are measured the same way (all their processes together): in (b)
every process shares the machine's cores, so they explain a system's throughput as much as
its broker does.

``--quick`` (the CI smoke test): tiny sizes, one repetition, no majortomo, no plot.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().with_name("_peers.py")
MAJORTOMO_VENV = ROOT / ".bench-venvs" / "majortomo"
RESULTS = ROOT / "benchmarks" / "results"
MIB = 1 << 20
FDS_PER_FARM = 4000  # sockets per farm process: two descriptors each, under a 20,000 limit


@dataclass(frozen=True)
class System:
    """Which code runs the broker and which the peers, and with which interpreter."""

    name: str
    python: str
    broker: str
    peers: str
    framing: str  # for the idle-peer farms: "domo" (RFC 18), "majortomo" or "raw"


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; ``--quick`` shrinks them."""

    reps: int
    duration: float
    idle_workers: int
    register_workers: int
    queued_requests: int
    big_body: int


FULL = Sizes(reps=3, duration=3.0, idle_workers=2000, register_workers=10_000,
             queued_requests=10_000, big_body=MIB)  # fmt: skip
QUICK = Sizes(reps=1, duration=0.3, idle_workers=50, register_workers=200,
              queued_requests=200, big_body=MIB)  # fmt: skip


# --- processes ---------------------------------------------------------------------------------


def _free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class Group:
    """Processes started for one run; each is killed by its PID when the run ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, python: str, *args: object) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [python, str(PEERS), *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(timeout=30)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


@contextmanager
def group() -> Iterator[Group]:
    g = Group()
    try:
        yield g
    finally:
        g.close()


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line the process prints; fails if it prints none in ``timeout`` s or exits."""
    out = proc.stdout
    assert out is not None
    # A thread, not select(2): a line already in the text wrapper's buffer (two printed at once)
    # leaves the pipe empty, and select would wait for a line that was read.
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    line = got[0] if got else ""
    if not line:
        raise RuntimeError(f"{_who(proc)} printed nothing in {timeout} s (rc {proc.poll()})")
    return line.strip()


def _who(proc: subprocess.Popen[str]) -> str:
    args = proc.args
    return " ".join(map(str, args[2:4])) if isinstance(args, list) else str(args)


def expect(proc: subprocess.Popen[str], word: str, timeout: float = 60.0) -> None:
    line = read_line(proc, timeout)
    if line != word:
        raise RuntimeError(f"{_who(proc)} said {line!r}, not {word!r}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


SYSCALLS = ("poll", "ppoll", "read", "write", "recvfrom", "sendto", "epoll_wait", "epoll_pwait",
            "futex", "getpid", "select")  # fmt: skip


def thread_stats(pids: list[int]) -> dict[str, float]:
    """Per kind of thread of ``pids`` (``main``: each process's first thread; ``zmq``:
    ZeroMQ's I/O threads; ``other``): user and system CPU seconds and the voluntary and
    involuntary context switches, from /proc/PID/task/TID/{stat,status}."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                    head, rest = f.read().rsplit(")", 1)
                with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
            except FileNotFoundError:
                continue  # the thread ended meanwhile
            comm = head.split("(", 1)[1]
            kind = "main" if int(tid) == pid else "zmq" if comm.startswith("ZMQbg/IO") else "other"
            fields = rest.split()
            for name, value in (
                ("user", int(fields[11]) / tick),
                ("sys", int(fields[12]) / tick),
                ("vcsw", int(status["voluntary_ctxt_switches"])),
                ("ivcsw", int(status["nonvoluntary_ctxt_switches"])),
            ):
                out[f"{kind}_{name}"] = out.get(f"{kind}_{name}", 0) + value
    return out


class SyscallCounter:
    """``perf stat`` counting the system calls of ``pids`` (every thread they have now) by
    kind, from ``start`` until ``stop``; counting, not tracing, so the peers run at speed."""

    def __init__(self, pids: list[int]) -> None:
        fd, self._out = tempfile.mkstemp(suffix=".perf")
        os.close(fd)
        events = ["raw_syscalls:sys_enter", "context-switches"]
        events += [f"syscalls:sys_enter_{name}" for name in SYSCALLS]
        command = ["perf", "stat", "-x", ",", "-o", self._out, "-e", ",".join(events)]
        self._proc = subprocess.Popen(
            [*command, "-p", ",".join(map(str, pids))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> dict[str, float]:
        self._proc.send_signal(2)  # SIGINT: perf prints its counts and exits
        self._proc.wait(timeout=30)
        counts: dict[str, float] = {}
        with open(self._out, encoding="utf-8") as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) > 3 and parts[0].replace(".", "").isdigit():
                    name = parts[2].rsplit("sys_enter_", 1)[-1].replace("raw_syscalls:", "")
                    counts["syscalls" if name == "sys_enter" else name] = float(parts[0])
        os.unlink(self._out)
        return counts


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def wait_quiet(pid: int, since: float, limit: float, quiet: float = 1.0) -> float:
    """Seconds from ``since`` until the process last used CPU, once quiet for ``quiet`` s."""
    last_cpu, last_busy = cpu_seconds(pid), time.perf_counter()
    while time.perf_counter() - last_busy < quiet:
        if time.perf_counter() - since > limit:
            raise RuntimeError(f"broker still busy after {limit} s")
        time.sleep(0.05)
        now_cpu = cpu_seconds(pid)
        if now_cpu != last_cpu:
            last_cpu, last_busy = now_cpu, time.perf_counter()
    return last_busy - since


# --- scenarios ---------------------------------------------------------------------------------


def load_run(
    system: System,
    *,
    workers: int,
    clients: int,
    sessions: int,
    size: int,
    duration: float,
    idle: int = 0,
    heartbeat: float = 2.5,
    pause: float = 0.0,
    probe: bool = False,
) -> dict[str, float]:
    """Broker, workers, clients (and optionally idle workers); one measured window.

    ``probe``: also each role's user and system CPU, context switches (per thread kind, from
    /proc) and system calls (by kind, ``perf stat``) per request."""
    endpoint = _free_endpoint()
    py = system.python
    with group() as g:
        broker = g.start(py, "broker", system.broker, endpoint, "--heartbeat", heartbeat)
        expect(broker, "ready")
        farms = _start_farms(g, system, endpoint, idle, "workers", heartbeat)
        echoes = [
            g.start(py, "worker", system.peers, endpoint, "--heartbeat", heartbeat)
            for _ in range(workers)
        ]
        peers = [
            g.start(
                py,
                "client",
                system.peers,
                endpoint,
                "--sessions",
                sessions,
                "--size",
                size,
                "--duration",
                duration,
                "--pause",
                pause,
            )
            for _ in range(clients)
        ]
        for farm in farms:
            expect(farm, "sent")
        for peer in peers:
            expect(peer, "warm")
        if idle:
            time.sleep(2 * heartbeat)  # registered, and heartbeating at a steady pace
        roles = ([broker], echoes, peers)  # broker, workers, clients
        pids = [[p.pid for p in r] for r in roles]
        if probe:
            counters = [SyscallCounter(r) for r in pids]
            time.sleep(0.5)  # perf attached
            stats0 = [thread_stats(r) for r in pids]
        cpu0, t0 = [sum(map(cpu_seconds, (p.pid for p in r))) for r in roles], time.perf_counter()
        for peer in peers:
            assert peer.stdin is not None
            peer.stdin.write("go\n")
            peer.stdin.flush()
        records = [json.loads(read_line(peer, duration + 60)) for peer in peers]
        cpu1, t1 = [sum(map(cpu_seconds, (p.pid for p in r))) for r in roles], time.perf_counter()
        if probe:
            # A client has ended its context (and its threads) by now: it noted its own.
            stats1 = [thread_stats(pids[0]), thread_stats(pids[1]), {}]
            for record in records:
                for key, value in record["threads"].items():
                    stats1[2][key] = stats1[2].get(key, 0) + value
            calls = [c.stop() for c in counters]  # including the 0.5 s idle before ``go``
    latencies = sorted(x for r in records for x in r["latencies"])
    count = sum(r["count"] for r in records)
    rate = sum(r["count"] / r["elapsed"] for r in records)
    probed: dict[str, float] = {}
    if probe:
        for role, before, after, counted in zip(
            ("broker", "worker", "client"), stats0, stats1, calls, strict=True
        ):
            for key in sorted(after):
                unit = 1e6 if key.endswith(("user", "sys")) else 1  # seconds -> us
                spent = after[key] - before.get(key, 0)
                probed[f"{role}_{key}_per_request"] = spent * unit / count
            for key, value in counted.items():
                probed[f"{role}_{key}_per_request"] = value / count
    return probed | {
        "requests": count,
        "requests_per_s": rate,
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)] * 1e6,
        "broker_cpu_us_per_request": (cpu1[0] - cpu0[0]) / count * 1e6,
        "broker_cpu_percent": (cpu1[0] - cpu0[0]) / (t1 - t0) * 100,
        "worker_cpu_us_per_request": (cpu1[1] - cpu0[1]) / count * 1e6,
        "client_cpu_us_per_request": (cpu1[2] - cpu0[2]) / count * 1e6,
        "mib_per_s": rate * size / MIB,
    }


def _start_farms(
    g: Group, system: System, endpoint: str, count: int, kind: str, heartbeat: float
) -> list[subprocess.Popen[str]]:
    farms = []
    while count > 0:
        n = min(count, FDS_PER_FARM)
        count -= n
        farms.append(
            g.start(
                system.python,
                "farm",
                system.framing,
                endpoint,
                "--count",
                n,
                "--kind",
                kind,
                "--heartbeat",
                heartbeat,
            )
        )
    return farms


def core_memory(workers: int, requests: int) -> dict[str, float]:
    """Bytes the sans-IO core allocates per registered worker and per queued request.

    Measured with ``tracemalloc`` in this process (the peers' identities excluded), to tell
    domo's own share of the broker's RSS from ZeroMQ's per-connection buffers.
    """
    import tracemalloc

    from domo.protocol import Broker

    workers_ids = [b"W%08d" % i for i in range(workers)]
    client_ids = [b"C%08d" % i for i in range(requests)]
    tracemalloc.start()
    try:
        broker = Broker()
        start = tracemalloc.get_traced_memory()[0]
        for peer in workers_ids:
            broker.receive(peer, [b"MDPW02", b"\x01", b"idle"], now=1.0)
        broker.take_outgoing()
        registered = tracemalloc.get_traced_memory()[0]
        for peer in client_ids:
            broker.receive(peer, [b"MDPC02", b"\x01", b"nobody", b"x"], now=1.0)
        queued = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert broker.queued(b"nobody") == requests
    assert len(broker.workers()) == workers
    return {
        "core_bytes_per_worker": (registered - start) / workers,
        "core_bytes_per_queued_request": (queued - registered) / requests,
    }


def register_run(system: System, workers: int, requests: int) -> dict[str, float]:
    """(e): RSS and time to register ``workers`` idle workers; RSS of ``requests`` queued."""
    result: dict[str, float] = {}
    if system.broker == "domo" and system.python == sys.executable:  # this checkout's core
        result.update(core_memory(workers, requests))
    for kind, count in (("workers", workers), ("requests", requests)):
        endpoint = _free_endpoint()
        with group() as g:
            broker = g.start(system.python, "broker", system.broker, endpoint, "--heartbeat", 60)
            expect(broker, "ready")
            time.sleep(0.5)
            before = rss_bytes(broker.pid)
            start = time.perf_counter()
            for farm in _start_farms(g, system, endpoint, count, kind, 60.0):
                expect(farm, "sent", timeout=120)
            busy_for = wait_quiet(broker.pid, start, limit=300)
            grown = rss_bytes(broker.pid) - before
        if kind == "workers":
            result["register_s"] = busy_for
            result["rss_bytes_per_worker"] = grown / count
        else:
            result["rss_bytes_per_queued_request"] = grown / count
    return result


# --- the run, the table, the goals -------------------------------------------------------------

SCENARIOS: dict[str, tuple[str, tuple[str, ...]]] = {
    "a": ("1 client, 1 in flight, 1 worker, 16 B", ("requests_per_s", "p50_us", "p99_us")),
    "b": (
        "64 in flight (8 procs x 8), 4 workers, 16 B",
        (
            "requests_per_s",
            "p50_us",
            "p99_us",
            "broker_cpu_us_per_request",
            "worker_cpu_us_per_request",
            "client_cpu_us_per_request",
        ),
    ),
    "c": (
        "1 MiB bodies, 8 in flight, 4 workers",
        ("mib_per_s", "p50_us", "broker_cpu_us_per_request"),
    ),
    "d": ("idle workers at 1 s heartbeat + 1 client", ("broker_cpu_percent", "p50_us", "p99_us")),
    "e": (
        "workers registering; queued requests",
        (
            "register_s",
            "rss_bytes_per_worker",
            "rss_bytes_per_queued_request",
            "core_bytes_per_worker",
            "core_bytes_per_queued_request",
        ),
    ),
}


@dataclass(frozen=True)
class Goal:
    """A goal as data: ``num``'s ``metric`` in ``scenario`` over ``den``'s (None: absolute) is
    at least (``ge``) or at most (``le``) ``bound``. ``retired``: why it is no longer pursued."""

    issue: int
    scenario: str
    metric: str
    num: str
    den: str | None
    bound: float
    how: str
    retired: str = ""

    @property
    def name(self) -> str:
        ratio = f"{self.num}/{self.den}" if self.den else self.num
        sign = ">=" if self.how == "ge" else "<="
        return f"({self.scenario}) {self.metric} {ratio} {sign} {self.bound:g}"


_FLOOR = (
    "below ZeroMQ's own floor (docs/performance.md, 'Why the remaining goals are out of reach')"
)
_SUPERSEDED = "superseded by issue 25's goal for the same figure"
# ``domo+pyzmq`` has the hand-framed blocking peers: its worker and client CPU is the anchor.
GOALS: list[Goal] = [
    # Issue 25 (the peers end to end), in force.
    Goal(25, "b", "requests_per_s", "domo.sync", "majortomo", 1.2, "ge"),
    Goal(25, "b", "requests_per_s", "domo", "majortomo", 1.0, "ge"),
    Goal(25, "b", "requests_per_s", "domo.asyncio", "majortomo", 1.0, "ge"),
    Goal(25, "b", "worker_cpu_us_per_request", "domo.sync", "domo+pyzmq", 1.1, "le"),
    Goal(25, "b", "client_cpu_us_per_request", "domo.sync", "domo+pyzmq", 1.1, "le"),
    Goal(25, "b", "worker_cpu_us_per_request", "domo", "domo+pyzmq", 1.3, "le"),
    Goal(25, "b", "client_cpu_us_per_request", "domo", "domo+pyzmq", 1.3, "le"),
    Goal(25, "b", "worker_cpu_us_per_request", "domo.asyncio", "domo+pyzmq", 1.3, "le"),
    Goal(25, "b", "client_cpu_us_per_request", "domo.asyncio", "domo+pyzmq", 1.3, "le"),
    Goal(25, "a", "p50_us", "domo.sync", "raw", 1.2, "le"),
    # The same goals for domo.asyncio on uvloop's loop (the uvloop extra), for comparison.
    Goal(25, "b", "requests_per_s", "domo.asyncio+uvloop", "majortomo", 1.0, "ge"),
    Goal(25, "b", "worker_cpu_us_per_request", "domo.asyncio+uvloop", "domo+pyzmq", 1.3, "le"),
    Goal(25, "b", "client_cpu_us_per_request", "domo.asyncio+uvloop", "domo+pyzmq", 1.3, "le"),
    # Issue 5 (the broker) and issue 13 (the runtimes): what is still in force, then the rest.
    Goal(5, "c", "mib_per_s", "domo", "raw", 0.9, "ge"),
    Goal(5, "d", "broker_cpu_percent", "domo", None, 10.0, "le"),
    Goal(13, "c", "mib_per_s", "domo", "raw", 0.8, "ge"),
    Goal(5, "b", "requests_per_s", "domo", "majortomo", 2.5, "ge",
         f"{_FLOOR}: it needs a sum of CPU per request under the raw forwarder's"),
    Goal(5, "b", "requests_per_s", "domo", "raw", 1.0, "ge",
         f"{_FLOOR}: the raw forwarder is the ceiling of a brokered round trip"),
    Goal(5, "b", "broker_cpu_us_per_request", "domo", "majortomo", 0.4, "le",
         f"{_FLOOR}: the raw forwarder's broker alone costs 0.55x majortomo's"),
    Goal(5, "a", "p50_us", "domo", "raw", 1.1, "le",
         f"{_FLOOR}: two more wake-ups per round trip than the forwarder's"),
    Goal(5, "e", "rss_bytes_per_worker", "domo", None, 2048.0, "le",
         f"{_FLOOR}: ZeroMQ holds 26.5 KiB per connection (raw, (e)); issue 25 asks 1.05x that"),
    Goal(13, "b", "broker_cpu_us_per_request", "domo", "raw", 1.0, "le",
         f"{_FLOOR}: the raw forwarder's broker runs no protocol"),
    Goal(13, "b", "requests_per_s", "domo.sync", "majortomo", 1.5, "ge", _SUPERSEDED),
    Goal(13, "b", "requests_per_s", "domo", "majortomo", 1.2, "ge", _SUPERSEDED),
    Goal(13, "b", "worker_cpu_us_per_request", "domo.asyncio", "domo+pyzmq", 1.5, "le",
         _SUPERSEDED),
    Goal(13, "b", "client_cpu_us_per_request", "domo.asyncio", "domo+pyzmq", 1.5, "le",
         _SUPERSEDED),
    Goal(13, "a", "p50_us", "domo.sync", "raw", 1.1, "le", _SUPERSEDED),
]  # fmt: skip


def evaluate(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal with the ratio measured (None if a system was not run) and whether it is met."""
    data = medians(samples)
    out = []
    for goal in GOALS:
        num_values = data.get((goal.scenario, goal.num, goal.metric))
        den_values = data.get((goal.scenario, goal.den, goal.metric)) if goal.den else [1.0]
        value = None
        if num_values and den_values:
            value = statistics.median(num_values) / statistics.median(den_values)
        met = None
        if value is not None:
            met = value >= goal.bound if goal.how == "ge" else value <= goal.bound
        out.append({"goal": goal.name, "issue": goal.issue, "value": value, "met": met,
                    "retired": goal.retired})  # fmt: skip
    return out


def run_scenario(name: str, system: System, sizes: Sizes, probe: bool = False) -> dict[str, float]:
    d = sizes.duration
    if name == "a":
        return load_run(system, workers=1, clients=1, sessions=1, size=16, duration=d, probe=probe)
    if name == "b":
        return load_run(system, workers=4, clients=8, sessions=8, size=16, duration=d, probe=probe)
    if name == "c":
        return load_run(system, workers=4, clients=1, sessions=8, size=sizes.big_body, duration=d)
    if name == "d":
        return load_run(system, workers=1, clients=1, sessions=1, size=16, duration=d,
                        idle=sizes.idle_workers, heartbeat=1.0, pause=0.02)  # fmt: skip
    return register_run(system, sizes.register_workers, sizes.queued_requests)


def majortomo_python() -> str:
    """The virtualenv with majortomo 0.2.0 and six, created on first use."""
    python = MAJORTOMO_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {MAJORTOMO_VENV} (majortomo 0.2.0, six)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(MAJORTOMO_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "majortomo==0.2.0", "six"], check=True
        )
    return str(python)


def baseline_python(rev: str) -> tuple[str, str]:
    """A virtualenv with domo as of git revision ``rev``, created on first use; and its hash.

    It holds that revision's package (``git archive``, then pip) and nothing of this checkout:
    its systems run this checkout's ``_peers.py`` against the older ``domo``.
    """
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    venv = ROOT / ".bench-venvs" / f"domo-{sha}"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} (domo as of {sha})", flush=True)
        with tempfile.TemporaryDirectory() as tree:
            archive = subprocess.run(
                ["git", "archive", sha], cwd=ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", tree], check=True)
    return str(python), sha


def medians(samples: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[float]]:
    out: dict[tuple[str, str, str], list[float]] = {}
    for s in samples:
        for metric, value in s["metrics"].items():
            out.setdefault((s["scenario"], s["system"], metric), []).append(value)
    return out


def fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def table(samples: list[dict[str, Any]], systems: list[str]) -> str:
    data = medians(samples)
    ours = [
        n
        for n in ("domo", "domo+pyzmq", "domo.sync", "domo.asyncio", "domo.asyncio+uvloop")
        if n in systems
    ]
    pairs: list[tuple[str, str]] = [
        (a, b) for a in ours for b in ("majortomo", "raw") if b in systems
    ]
    pairs += [(a, b) for a in ours for b in systems if b.startswith(f"{a}@")]  # --baseline
    head = ["scenario", "metric", *systems, *(f"{a}/{b}" for a, b in pairs)]
    rows = [head]
    for scen, (_, metrics) in SCENARIOS.items():
        for metric in metrics:
            cells = [scen, metric]
            med: dict[str, float] = {}
            for name in systems:
                values = data.get((scen, name, metric))
                if not values:
                    cells.append("-")
                    continue
                med[name] = statistics.median(values)
                cells.append(f"{fmt(med[name])} [{fmt(min(values))}-{fmt(max(values))}]")
            for a, b in pairs:
                cells.append(f"{med[a] / med[b]:.2f}" if a in med and med.get(b) else "-")
            rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(samples: list[dict[str, Any]], systems: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("a", "p50_us", "(a) p50 latency, µs (lower is better)"),
        ("b", "requests_per_s", "(b) requests/s, 64 in flight"),
        ("b", "broker_cpu_us_per_request", "(b) broker CPU µs/request (lower)"),
        ("c", "mib_per_s", "(c) MiB/s, 1 MiB bodies"),
        ("d", "broker_cpu_percent", "(d) broker CPU %, idle workers (lower)"),
        ("e", "rss_bytes_per_worker", "(e) broker RSS bytes/worker (lower)"),
    ]
    data = medians(samples)
    fig, axes = plt.subplots(2, 3, figsize=(13, 8))
    for ax, (scen, metric, title) in zip(axes.flat, panels, strict=True):
        names = [s for s in systems if data.get((scen, s, metric))]
        values = [data[(scen, s, metric)] for s in names]
        mids = [statistics.median(v) for v in values]
        errs = [[m - min(v) for m, v in zip(mids, values, strict=True)],
                [max(v) - m for m, v in zip(mids, values, strict=True)]]  # fmt: skip
        colors = ["#9a9a9a" if "@" in name else "#4c72b0" for name in names]  # --baseline: grey
        ax.bar(names, mids, yerr=errs, capsize=4, color=colors)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8, labelrotation=30)
    fig.suptitle("domo, majortomo and a raw pyzmq forwarder (medians, min-max bars)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 rep, no majortomo")
    parser.add_argument("--reps", type=int, help="repetitions (default 3; 1 with --quick)")
    parser.add_argument("--duration", type=float, help="seconds per measured window")
    parser.add_argument("--scenarios", default="abcde")
    parser.add_argument("--systems", help="comma-separated subset of the systems")
    parser.add_argument("--no-majortomo", action="store_true")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also run domo as of git revision REV (domo@REV, domo+pyzmq@REV): before/after "
        "ratios from one run",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="(a), (b): also each role's user/system CPU, context switches and system calls "
        "(perf stat, which needs the right to trace) per request",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every sample as JSON")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw the plot (matplotlib)")
    parser.add_argument("--report", type=Path, metavar="FILE", help="re-print a saved --json run")
    parser.add_argument(
        "--scale",
        type=Path,
        metavar="FILE",
        help="with --report: a benchmarks/scale.py --json record, whose goals are printed too "
        "(default: performance-scale.json beside FILE, if there)",
    )
    args = parser.parse_args()
    if not (args.quick or args.report):  # a full run keeps its record and plot
        args.json = args.json or RESULTS / "brokers.json"
        if args.plot is None and importlib.util.find_spec("matplotlib") is not None:
            args.plot = RESULTS / "brokers.png"
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        args.plot = None
    sizes = QUICK if args.quick else FULL
    if args.reps or args.duration:
        sizes = Sizes(args.reps or sizes.reps, args.duration or sizes.duration,
                      *list(vars(sizes).values())[2:])  # fmt: skip

    py = sys.executable
    systems = [
        System("domo", py, "domo", "domo", "domo"),
        System("domo+pyzmq", py, "domo", "hand", "domo"),
        System("domo.sync", py, "domo", "sync", "domo"),
        System("domo.asyncio", py, "asyncio", "asyncio", "domo"),
        System("domo.asyncio+uvloop", py, "asyncio-uvloop", "asyncio-uvloop", "domo"),
        System("raw", py, "raw", "raw", "raw"),
    ]
    if importlib.util.find_spec("uvloop") is None:  # the uvloop extra is not installed
        systems = [s for s in systems if "uvloop" not in s.name]
    if not (args.quick or args.no_majortomo):
        systems.insert(
            2, System("majortomo", majortomo_python(), "majortomo", "majortomo", "majortomo")
        )
    if args.baseline:
        before, sha = baseline_python(args.baseline)
        systems[1:1] = [System(f"domo@{sha}", before, "domo", "domo", "domo")]
        systems[3:3] = [System(f"domo+pyzmq@{sha}", before, "domo", "hand", "domo")]
        at = next(i for i, s in enumerate(systems) if s.name == "domo.sync") + 1
        systems[at:at] = [System(f"domo.sync@{sha}", before, "domo", "sync", "domo")]
    if args.systems:
        wanted = args.systems.split(",")
        systems = [s for s in systems if s.name in wanted]

    if args.report:  # print (and plot) a saved run again
        record = json.loads(args.report.read_text(encoding="utf-8"))
        scale_path = args.scale or args.report.with_name("performance-scale.json")
        scale = None
        if scale_path.exists():
            scale = json.loads(scale_path.read_text(encoding="utf-8"))
        summarize(record["samples"], record["systems"], scale)
        if args.plot:
            plot(record["samples"], record["systems"], args.plot)
        return

    samples: list[dict[str, Any]] = []
    started = time.time()
    for rep in range(sizes.reps):
        for scen in args.scenarios:
            for system in systems:
                if scen == "d" and system.broker == "raw":
                    continue  # no heartbeats: nothing to compare
                metrics = run_scenario(scen, system, sizes, args.probe)
                samples.append({"scenario": scen, "system": system.name, "rep": rep,
                                "metrics": metrics})  # fmt: skip
                shown = ", ".join(f"{k} {fmt(v)}" for k, v in metrics.items())
                print(f"rep {rep} ({scen}) {system.name}: {shown}", flush=True)

    names = [s.name for s in systems]
    results = summarize(samples, names)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "script": "benchmarks/brokers.py",
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "seconds": round(time.time() - started),
            "sizes": vars(sizes),
            "systems": names,
            "samples": samples,
            "goals": results,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(samples, names, args.plot)


def summarize(
    samples: list[dict[str, Any]], names: list[str], scale: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Print the table and each goal against what was measured; return the goals.

    ``scale``: a ``benchmarks/scale.py --json`` record, whose goals (issue 25, item 3) are
    printed too.
    """
    print()
    print(table(samples, names))
    print()
    results = evaluate(samples)
    if scale is not None:
        results += scale_goals(scale)
    for g in results:
        value = "not measured" if g["value"] is None else f"{g['value']:.3g}"
        if g["retired"]:
            print(f"retired goal of issue {g['issue']} {g['goal']}: {value} ({g['retired']})")
            continue
        verdict = {True: "met", False: "NOT met", None: ""}[g["met"]]
        print(f"goal of issue {g['issue']} {g['goal']}: {value} {verdict}")
    return results


def scale_goals(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 25's goals for one broker's scale, from a ``benchmarks/scale.py`` record."""

    def goal(name: str, value: float | None, met: bool | None) -> dict[str, Any]:
        return {"goal": name, "issue": 25, "value": value, "met": met, "retired": ""}

    out = []
    workers = record.get("workers") or {}
    steps = workers.get("steps") or []
    if steps:
        last = steps[-1]
        out.append(goal(f"idle workers up to the room ({last['workers']}) all registered",
                        last["registered"] / last["workers"],
                        last["registered"] == last["workers"]))  # fmt: skip
    beyond = workers.get("beyond") or {}
    if beyond:
        out.append(goal("past the room, the broker says it refuses peers", None,
                        "cannot take more peers" in beyond.get("said", "")))  # fmt: skip
    projection = record.get("projection") or {}
    if projection:
        cpu = projection["cpu_percent_50k"]
        out.append(goal("50,000 idle workers at 5 s: broker CPU % of a core < 50 (projected)",
                        cpu, cpu < 50))  # fmt: skip
        ratio = projection["rss_per_worker_over_zmq"]
        out.append(goal("RSS per worker / ZeroMQ's own per connection <= 1.05", ratio,
                        ratio <= 1.05))  # fmt: skip
    clients = record.get("clients") or {}
    if clients:
        out.append(goal(f"{clients['clients']} clients, one request in flight each: all answered",
                        clients["answered"] / clients["clients"],
                        clients["answered"] == clients["clients"]))  # fmt: skip
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
