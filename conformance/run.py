"""Run ``domo fuzz`` against majortomo's broker, worker and client, and domo's own as a control.

``nox -s conformance`` runs this script; ``python conformance/run.py --help`` for options. Each
target is one ``domo fuzz`` command with a fixed seed and time budget, the peer started by this
script (the broker) or by ``domo fuzz --exec`` (worker, client), every process stopped by its PID
at the end. It writes every command line, exit code and finding (rule, explanation, shrunk
scenario from the replay file) to ``docs/conformance.json`` and regenerates the table of
``docs/conformance.md`` between its markers. majortomo runs from its own virtualenv,
``.bench-venvs/majortomo`` (shared with the benchmarks, created on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).resolve().with_name("majortomo_peers.py")
MAJORTOMO_VENV = ROOT / ".bench-venvs" / "majortomo"
DOC = ROOT / "docs" / "conformance.md"
RECORD = ROOT / "docs" / "conformance.json"
BEGIN, END = "<!-- conformance table: begin -->", "<!-- conformance table: end -->"
TARGETS = ("broker", "worker", "client")


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


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def peer_commands(system: str, args: argparse.Namespace) -> dict[str, list[str]]:
    """How ``system``'s broker, worker and client are started (``{endpoint}`` filled later)."""
    beats = ["--heartbeat-interval", str(args.interval), "--liveness", str(args.liveness)]
    if system == "majortomo":
        python = [majortomo_python(), str(PEERS)]
        return {
            "broker": [*python, "broker", "{endpoint}", *beats],
            "worker": [*python, "worker", "{endpoint}", *beats],
            "client": [*python, "client", "{endpoint}", "--timeout", "0.5"],
        }
    domo = [sys.executable, "-m", "domo"]
    quiet = ["--log-level", "error"]
    return {
        "broker": [*domo, "broker", "--bind", "{endpoint}", *beats, *quiet],
        "worker": [*domo, "worker", "echo", "--connect", "{endpoint}", *beats, *quiet],
        "client": [
            *domo, "call", "echo", "hello", "--connect", "{endpoint}", "--repeat", "0",
            "--timeout", "0.5", "--retries", "1", *quiet,
        ],
    }  # fmt: skip


def run_target(
    system: str, target: str, args: argparse.Namespace, findings: Path
) -> dict[str, Any]:
    """One ``domo fuzz`` run; what it did and found."""
    peer = peer_commands(system, args)[target]
    endpoint = free_endpoint()
    fuzz = [
        sys.executable, "-m", "domo", "fuzz", "--target", target,
        "--heartbeat-interval", str(args.interval), "--liveness", str(args.liveness),
        "--time-budget", str(args.time_budget), "--examples", str(args.examples),
        "--seed", str(args.seed), "--findings-dir", str(findings),
    ]  # fmt: skip
    started: subprocess.Popen[bytes] | None = None
    if target == "broker":
        argv = [arg.replace("{endpoint}", endpoint) for arg in peer]
        started = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        time.sleep(1.0)  # let it bind
        fuzz += [endpoint]
    else:
        fuzz += [endpoint, "--exec", shlex.join(peer)]
    print(f"== {system} {target}: {shlex.join(fuzz)}", flush=True)
    began = time.monotonic()
    try:
        done = subprocess.run(
            fuzz, capture_output=True, text=True, timeout=args.time_budget + 120, check=False
        )
    finally:
        if started is not None:
            started.terminate()
            try:
                started.wait(timeout=5)
            except subprocess.TimeoutExpired:
                started.kill()
                started.wait()
    print(done.stdout, end="", flush=True)
    found = []
    for path in sorted(findings.glob(f"{target}-*.json")):
        replay = json.loads(path.read_text(encoding="utf-8"))
        found.append(
            {"rule": replay["rule"], "explanation": replay["explanation"],
             "scenario": replay["readable"]}
        )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return {
        "system": system,
        "target": target,
        "peer": shlex.join(peer),
        "command": shlex.join(fuzz),
        "exit_code": done.returncode,
        "seconds": round(time.monotonic() - began, 1),
        "summary": summary,
        "stderr_tail": done.stderr.strip().splitlines()[-3:],
        "findings": found,
    }


def table(runs: list[dict[str, Any]]) -> str:
    """The markdown table of ``docs/conformance.md``."""
    meaning = {0: "nothing found", 1: "rules broken", 3: "unreachable"}
    lines = [
        "| system | target | exit | rule | what the fuzzer saw |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        head = f"| {run['system']} | {run['target']} | {run['exit_code']} "
        head += f"({meaning.get(run['exit_code'], 'error')})"
        if not run["findings"]:
            why = run["summary"] if run["exit_code"] == 0 else " ".join(run["stderr_tail"])
            lines.append(f"{head} | — | {_cell(why)} |")
        for finding in run["findings"]:
            lines.append(f"{head} | {finding['rule']} | {_cell(finding['explanation'])} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_doc(record: dict[str, Any]) -> None:
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = (
        f"\n_Run {record['date']} on {record['machine']}; seed {record['seed']}, "
        f"{record['time_budget']:g} s per target, heartbeat interval {record['interval']:g} s, "
        f"liveness {record['liveness']}; every finding with its scenario in "
        f"[`conformance.json`](conformance.json)._\n\n{table(record['runs'])}\n"
    )
    DOC.write_text(head + BEGIN + body + END + tail, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="majortomo,domo", help="comma-separated")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    parser.add_argument("--time-budget", type=float, default=60.0, help="seconds per target")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--liveness", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="leave docs/ alone")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="domo-conformance-") as tmp:
        for system in args.systems.split(","):
            for target in args.targets.split(","):
                findings = Path(tmp) / system / target
                runs.append(run_target(system, target, args, findings))
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}",
        "seed": args.seed,
        "time_budget": args.time_budget,
        "interval": args.interval,
        "liveness": args.liveness,
        "runs": runs,
    }
    if not args.no_write:
        RECORD.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        write_doc(record)
        print(f"wrote {RECORD} and the table of {DOC}")


if __name__ == "__main__":
    main()
