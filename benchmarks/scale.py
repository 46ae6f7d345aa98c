"""One broker, as many peers as this machine allows: idle workers up to the open-file limit, and
10,000 clients with one request in flight each.

``domo broker`` (the command, as an operator runs it, with ``--metrics``) on tcp loopback, and
hand-framed DEALERs in farm processes (``_peers.py farm``), each of which holds up to 4,000
sockets:

- **workers**: idle workers (READY for ``idle``, then a HEARTBEAT every ``--heartbeat`` s, each
  at its own phase) are added step by step (``--steps``, up to the broker's room for peers,
  which it prints at start); at each step, once the broker's metrics count them all
  registered and two intervals have passed, its CPU (% of one core) and RSS over ``--window``
  seconds. Then ``--over`` more than the broker has room for: how many it took, and whether it
  said it could not take the rest (its log; ZeroMQ refuses them without a word).
- **clients**: on a fresh broker, ``--clients`` DEALERs send one REQUEST each for ``echo``,
  served by 4 ``domo.sync`` workers; every reply is checked: all answered, and how long it took.

``--json`` keeps every figure, ``--plot`` draws broker CPU and RSS against workers (matplotlib).
``--quick`` (the CI smoke test): tiny sizes. ``benchmarks/heartbeat_sim.py`` takes it past this
machine's limit, in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import brokers
from brokers import FDS_PER_FARM, Group, cpu_seconds, expect, read_line, rss_bytes

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().with_name("_peers.py")


def _start_broker(
    g: Group, heartbeat: float, log: Path
) -> tuple[subprocess.Popen[str], str, str, int]:
    """``domo broker`` with metrics; its process, endpoint, metrics URL and room for peers."""
    endpoint = brokers._free_endpoint()
    sink = log.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "domo",
            "broker",
            "--bind",
            endpoint,
            "--heartbeat-interval",
            str(heartbeat),
            "--metrics",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=sink,
        stdin=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    sink.close()
    g.procs.append(proc)
    room = url = ""
    listening = False
    while not url or not room or not listening:  # the room is said after the endpoints
        line = read_line(proc, 60)
        if "room for about" in line:
            room = re.search(r"room for about (\d+)", line).group(1)  # type: ignore[union-attr]
        if "metrics on " in line:
            url = line.split("metrics on ", 1)[1]
        listening = listening or "listening on" in line
    return proc, endpoint, url, int(room)


def _registered(url: str, timeout: float = 60.0) -> int:
    """Workers the broker counts for ``idle`` (its ``domo_workers`` gauge)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("domo_workers{") and 'service="idle"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _count(log: Path, word: str) -> int:
    """Lines of the broker's log that name ``word`` (say, workers it found silent)."""
    return sum(word in line for line in log.read_text(errors="replace").splitlines())


def _add_workers(g: Group, endpoint: str, count: int, heartbeat: float) -> None:
    while count > 0:
        n = min(count, FDS_PER_FARM)
        count -= n
        farm = g.start(sys.executable, "farm", "domo", endpoint, "--count", n, "--kind",
                       "workers", "--heartbeat", heartbeat, "--spread")  # fmt: skip
        expect(farm, "sent", timeout=120)


def _wait_registered(url: str, want: int, limit: float) -> int:
    """Until the broker counts ``want`` workers, or ``limit`` s pass; the count then."""
    deadline = time.monotonic() + limit
    seen = _registered(url)
    while seen < want and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = _registered(url)
    return seen


def workers_run(steps: list[int], heartbeat: float, window: float, over: int) -> dict[str, Any]:
    """Idle workers step by step on one broker, then past its room (see the module)."""
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"domo-scale-{os.getpid()}.log"
    samples = []
    with brokers.group() as g:
        broker, endpoint, url, room = _start_broker(g, heartbeat, log)
        steps = [n for n in steps if n <= room]
        have = 0
        for target in steps:
            started = time.perf_counter()
            _add_workers(g, endpoint, target - have, heartbeat)
            have = target
            seen = _wait_registered(url, target, 120)
            register_s = time.perf_counter() - started
            time.sleep(2 * heartbeat)  # every worker heartbeating at its steady pace
            cpu0, t0 = cpu_seconds(broker.pid), time.perf_counter()
            time.sleep(window)
            cpu1, t1 = cpu_seconds(broker.pid), time.perf_counter()
            sample = {
                "workers": target,
                "registered": seen,
                "expired_in_log": _count(log, "WorkerExpired"),
                "register_s": register_s,
                "broker_cpu_percent": (cpu1 - cpu0) / (t1 - t0) * 100,
                "broker_rss_bytes": rss_bytes(broker.pid),
                "heartbeats_per_s": 2 * target / heartbeat,  # both ways
            }
            samples.append(sample)
            print(f"workers {target}: " + ", ".join(f"{k} {v:.4g}" for k, v in sample.items()),
                  flush=True)  # fmt: skip
        beyond: dict[str, Any] = {}
        if over:
            extra = room + over - have
            _add_workers(g, endpoint, extra, heartbeat)
            time.sleep(10)  # the farm's connections accepted, or refused, by now
            said = ""
            deadline = time.monotonic() + 20  # the broker looks at its open files every 5 s
            while not said and time.monotonic() < deadline:
                time.sleep(0.5)
                said = next(
                    (x for x in log.read_text().splitlines() if "cannot take more peers" in x), ""
                )
            # At the limit the metrics server cannot accept a scrape either: libzmq's listener
            # retries its failed accept in a loop and takes any descriptor that comes free
            # (docs/performance.md, "One broker, as many workers as the machine allows").
            try:
                registered: int | None = _registered(url, timeout=10)
            except OSError:  # TimeoutError, URLError
                registered = None
            beyond = {"attempted": room + over, "registered": registered, "said": said}
            print(f"past the room: {beyond}", flush=True)
    log.unlink(missing_ok=True)
    return {"room": room, "heartbeat": heartbeat, "window": window, "steps": samples,
            "beyond": beyond}  # fmt: skip


def clients_run(clients: int, heartbeat: float) -> dict[str, Any]:
    """``clients`` DEALERs, one REQUEST each, 4 domo.sync echo workers: all answered?"""
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"domo-scale-c-{os.getpid()}.log"
    with brokers.group() as g:
        broker, endpoint, _, _ = _start_broker(g, heartbeat, log)
        for _ in range(4):
            g.start(sys.executable, "worker", "sync", endpoint, "--heartbeat", heartbeat)
        rss0 = rss_bytes(broker.pid)
        farms = []
        left = clients
        while left > 0:
            n = min(left, FDS_PER_FARM)
            left -= n
            farms.append(g.start(sys.executable, "farm", "domo", endpoint, "--count", n,
                                 "--kind", "clients", "--heartbeat", heartbeat))  # fmt: skip
        peak = rss0
        for farm in farms:
            expect(farm, "sent", timeout=120)
        records = []
        for farm in farms:
            records.append(json.loads(read_line(farm, 300)))
            peak = max(peak, rss_bytes(broker.pid))
    log.unlink(missing_ok=True)
    result = {
        "clients": clients,
        "answered": sum(r["answered"] for r in records),
        "seconds": max(r["seconds"] for r in records),
        "broker_rss_growth_bytes": peak - rss0,
    }
    print(f"clients: {result}", flush=True)
    return result


def rss_per_peer(count: int) -> dict[str, float]:
    """Broker RSS growth per idle peer, same method for both: ``domo broker`` with ``count``
    registered workers, and the raw forwarder with ``count`` connections that said ``ready``
    (what ZeroMQ itself holds per connection). Heartbeats every 60 s: none in the window."""
    out: dict[str, float] = {}
    for name in ("domo", "zmq"):
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"domo-scale-r-{os.getpid()}.log"
        with brokers.group() as g:
            if name == "domo":
                broker, endpoint, url, _ = _start_broker(g, 60.0, log)
            else:
                endpoint = brokers._free_endpoint()
                broker = g.start(sys.executable, "broker", "raw", endpoint)
                expect(broker, "ready")
            time.sleep(1.0)
            before = rss_bytes(broker.pid)
            left = count
            while left > 0:
                n = min(left, FDS_PER_FARM)
                left -= n
                framing = "domo" if name == "domo" else "raw"
                farm = g.start(sys.executable, "farm", framing, endpoint, "--count", n,
                               "--kind", "workers", "--heartbeat", 60)  # fmt: skip
                expect(farm, "sent", timeout=120)
            if name == "domo":
                _wait_registered(url, count, 120)
            brokers.wait_quiet(broker.pid, time.perf_counter(), limit=120)
            out[f"{name}_rss_bytes_per_peer"] = (rss_bytes(broker.pid) - before) / count
        log.unlink(missing_ok=True)
    print(f"rss per peer: {out}", flush=True)
    return out


def project(record: dict[str, Any], workers: int = 50_000) -> dict[str, Any]:
    """From the largest step measured here and the simulation: ``workers`` on one broker.

    The broker's CPU per heartbeat (both ways) at the largest step, times the heartbeats of
    ``workers``: valid if the core's cost per heartbeat stays flat past this machine's limit
    (the simulation says whether) and ZeroMQ's per message does (epoll wakes for ready
    connections only). RSS per worker over ZeroMQ's own per connection, from ``rss``.
    """
    last = record["workers"]["steps"][-1]
    seconds_per_heartbeat = last["broker_cpu_percent"] / 100 / last["heartbeats_per_s"]
    heartbeats_per_s = 2 * workers / record["workers"]["heartbeat"]
    sim = record.get("simulation") or []
    flat = None
    if len(sim) >= 2:
        costs = [r["us_per_heartbeat"] for r in sim]
        flat = max(costs) / min(costs)
    rss = record.get("rss") or {}
    ratio = None
    if rss:
        ratio = rss["domo_rss_bytes_per_peer"] / rss["zmq_rss_bytes_per_peer"]
    return {
        "workers": workers,
        "measured_at": last["workers"],
        "us_per_heartbeat_measured": seconds_per_heartbeat * 1e6,
        "cpu_percent_50k": seconds_per_heartbeat * heartbeats_per_s * 100,
        "simulated_cost_spread": flat,
        "rss_per_worker_over_zmq": ratio,
        "rss_50k_mib": None if not rss else rss["domo_rss_bytes_per_peer"] * workers / 2**20,
    }


def plot(record: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = record["workers"]["steps"]
    xs = [s["workers"] for s in steps]
    fig, cpu_ax = plt.subplots(figsize=(8, 5))
    cpu_ax.plot(xs, [s["broker_cpu_percent"] for s in steps], "o-", color="#4c72b0")
    cpu_ax.set_xlabel(f"idle workers (heartbeat every {record['workers']['heartbeat']:g} s)")
    cpu_ax.set_ylabel("broker CPU, % of one core", color="#4c72b0")
    rss_ax = cpu_ax.twinx()
    rss_ax.plot(xs, [s["broker_rss_bytes"] / 2**20 for s in steps], "s--", color="#dd8452")
    rss_ax.set_ylabel("broker RSS, MiB", color="#dd8452")
    cpu_ax.set_title("domo broker: CPU and RSS against idle workers, up to this machine's limit")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    # SIGTERM ends the run through its ``finally`` blocks: every process started is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="1000,2000,5000,10000,15000,19500")
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--over", type=int, default=500, help="workers past the broker's room")
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the CI smoke test)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--report", type=Path, help="print (and plot) a saved --json run")
    args = parser.parse_args()
    if args.report:
        record = json.loads(args.report.read_text(encoding="utf-8"))
    else:
        if args.quick:
            args.steps, args.heartbeat, args.window, args.over, args.clients = (
                "50,100",
                1.0,
                1.0,
                0,
                300,
            )
        started = time.time()
        steps = [int(n) for n in args.steps.split(",")]
        record = {
            "script": "benchmarks/scale.py",
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "load_average": os.getloadavg(),
            "workers": workers_run(steps, args.heartbeat, args.window, args.over),
            "clients": clients_run(args.clients, args.heartbeat),
        }
        if not args.quick:
            from heartbeat_sim import simulate

            record["simulation"] = [
                simulate(count, args.heartbeat, 0.01, 3) for count in (10_000, 50_000, 100_000)
            ]
            for r in record["simulation"]:
                print(f"simulated {r['workers']}: {r['us_per_heartbeat']:.2f} us/heartbeat")
            record["rss"] = rss_per_peer(5000)
            record["projection"] = project(record)
            print(f"projection: {record['projection']}", flush=True)
        record["seconds"] = round(time.time() - started)
        if args.json:
            args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for s in record["workers"]["steps"]:
        rss = s["broker_rss_bytes"] / 2**20
        print(
            f"{s['workers']:>6} workers: {s['registered']} registered, broker CPU "
            f"{s['broker_cpu_percent']:.1f} % of a core, RSS {rss:.0f} MiB"
        )
    if args.plot:
        plot(record, args.plot)


if __name__ == "__main__":
    main()
