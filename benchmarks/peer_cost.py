"""What one of domo's clients or workers costs per request, beside a hand-framed one: CPU, or
instructions counted by callgrind (deterministic, where the machine's clock is not).

``python benchmarks/peer_cost.py ROLE KIND [--seconds S] [--callgrind]``

- ROLE ``client``: this process is one client with 8 requests in flight (``_peers.py``'s client
  of KIND: ``hand``, ``sync`` (``Client.map``), ``sync-threads``, ``domo`` (Trio),
  ``asyncio``, ``asyncio-uvloop``), against ``domo``'s broker, 4 hand-framed workers and 3 more
  hand-framed clients (subprocesses).
- ROLE ``worker``: this process is one echo worker of KIND (``hand``, ``sync``, ``domo``,
  ``asyncio``, ``asyncio-uvloop``), serving 2 hand-framed clients of 4 sessions each.

It prints the requests done and this process's CPU per request (all its threads, ZeroMQ's I/O
thread included). With ``--callgrind`` it runs itself under ``valgrind --tool=callgrind``,
counting only the measured window (``callgrind_control -i on/off``), and prints the instructions
per request: user-space instructions of every thread of the process, kernel time excluded, and
the same from run to run within a few per cent, however loaded the machine. Under valgrind the
process runs ~50x slower, so the others wait for it: each wake-up finds fewer messages ready
than at full speed, and the figure is for that pattern; compare kinds with one another.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _peers
import brokers

PYTHON = sys.executable


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _callgrind(on: bool) -> None:
    if os.environ.get("PEER_COST_CALLGRIND"):
        flag = "on" if on else "off"
        subprocess.run(["callgrind_control", "-i", flag, str(os.getpid())], capture_output=True)


def client(kind: str, seconds: float) -> tuple[int, float]:
    """This process as one client of ``kind``; requests done and CPU seconds spent."""
    import domo.asyncio
    import domo.sync
    import domo.trio  # noqa: F401

    _peers._use_uvloop(kind)
    endpoint = brokers._free_endpoint()
    body = os.urandom(16)
    with brokers.group() as g:
        broker = g.start(PYTHON, "broker", "domo", endpoint, "--heartbeat", 2.5)
        brokers.expect(broker, "ready")
        for _ in range(4):
            g.start(PYTHON, "worker", "hand", endpoint, "--heartbeat", 2.5)
        others = [g.start(PYTHON, "client", "hand", endpoint, "--sessions", 8, "--size", 16,
                          "--duration", seconds + 2, "--pause", 0) for _ in range(3)]  # fmt: skip
        for other in others:
            brokers.expect(other, "warm")
        for other in others:
            assert other.stdin is not None
            other.stdin.write("go\n")
            other.stdin.flush()
        started: list[float] = []

        def window() -> None:
            """The client's warm-up is done: the measured window begins (its set-up, and the
            event loop's, are left out)."""
            _callgrind(True)
            started.append(_cpu())

        _peers._wait_for_go = window
        runs: dict[str, Callable[[], dict[str, Any]]] = {
            "hand": lambda: _peers._blocking_client("hand", endpoint, 8, body, seconds, 0),
            "sync": lambda: _peers._sync_map_client(endpoint, 8, body, seconds, 0),
            "sync-threads": lambda: _peers._sync_client(endpoint, 8, body, seconds, 0),
            "domo": lambda: _peers._domo_client(endpoint, 8, body, seconds, 0),
            "asyncio": lambda: _peers._asyncio_client(endpoint, 8, body, seconds, 0),
            "asyncio-uvloop": lambda: _peers._asyncio_client(endpoint, 8, body, seconds, 0),
        }
        record = runs[kind]()
        spent = _cpu() - started[0]
        _callgrind(False)
    return record["count"], spent


def worker(kind: str, seconds: float) -> tuple[int, float]:
    """This process as one echo worker of ``kind``; requests served and CPU seconds spent."""
    import domo.asyncio
    import domo.sync
    import domo.trio  # noqa: F401

    _peers._use_uvloop(kind)
    endpoint = brokers._free_endpoint()
    g = brokers.Group()
    broker = g.start(PYTHON, "broker", "domo", endpoint, "--heartbeat", 2.5)
    brokers.expect(broker, "ready")
    result: list[tuple[int, float]] = []

    def control() -> None:
        try:
            args = ("--sessions", 4, "--size", 16, "--duration", seconds, "--pause", 0)
            clients = [g.start(PYTHON, "client", "hand", endpoint, *args) for _ in range(2)]
            for c in clients:
                brokers.expect(c, "warm", timeout=300)
            _callgrind(True)
            start = _cpu()
            for c in clients:
                assert c.stdin is not None
                c.stdin.write("go\n")
                c.stdin.flush()
            records = [json.loads(brokers.read_line(c, seconds + 300)) for c in clients]
            result.append((sum(r["count"] for r in records), _cpu() - start))
            _callgrind(False)
        finally:
            g.close()
            _report(kind, "worker", *result[0]) if result else None
            os._exit(0 if result else 1)  # the worker runs until its process ends

    threading.Thread(target=control, daemon=True).start()
    _peers.worker(kind, endpoint, 2.5)
    return 0, 0.0  # not reached


def _report(kind: str, role: str, count: int, cpu: float) -> None:
    print(f"{role} {kind}: {count} requests, {cpu / max(count, 1) * 1e6:.1f} us of CPU per "
          "request", flush=True)  # fmt: skip


def under_callgrind(role: str, kind: str, seconds: float) -> None:
    """Run this script under callgrind; print the instructions per request."""
    if shutil.which("valgrind") is None:
        sys.exit("peer_cost.py --callgrind needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                "--instr-atstart=no",
                PYTHON,
                __file__,
                role,
                kind,
                "--seconds",
                str(seconds),
            ],
            env={**os.environ, "PEER_COST_CALLGRIND": "1"},
            capture_output=True,
            text=True,
            check=False,
        )
        found = re.search(r"(\d+) requests", done.stdout)
        if found is None:
            sys.exit(f"no figure from the run:\n{done.stdout}\n{done.stderr[-2000:]}")
        count = int(found.group(1))
        total = 0
        for path in Path(folder).glob("callgrind.out*"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("totals:"):
                    total += int(line.split()[1])
                    break
        print(f"{role} {kind}: {count} requests, {total // max(count, 1)} instructions per "
              "request (callgrind)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["client", "worker"])
    parser.add_argument("kind")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    if args.callgrind:
        under_callgrind(args.role, args.kind, args.seconds)
    elif args.role == "client":
        _report(args.kind, "client", *client(args.kind, args.seconds))
    else:
        worker(args.kind, args.seconds)


if __name__ == "__main__":
    main()
