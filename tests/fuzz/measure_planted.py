"""Measure ``domo fuzz`` on the planted suite, and on domo's own peers as a control.

``python tests/fuzz/measure_planted.py [--budget 60] [--seed 1] [--jobs 2] [--controls 10]
[--control-budget 20] [--hog [N]] [--controls-only] [--only FLAW ...]`` (or ``nox -s fuzz_planted
-- ARGS``) runs the search against every planted broker, worker and client of
``tests/fuzz/planted_*.py`` at a 0.1 s heartbeat, each until it names the planted rule or the
budget is spent, then against ``domo broker``, ``domo worker`` and ``domo call --repeat 0`` with
``--controls`` different seeds each. It prints a Markdown table: per plant whether the rule was
found, after how many seconds and scenarios; per control run what (if anything) was found. ``--hog
N`` runs N busy loops (one per core you mean to load; ``--hog`` alone: one) meanwhile, started and
killed by their PIDs; ``--controls-only`` runs only the control. Exit 1 if a control run found
anything.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import cast

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from domo.fuzz import FuzzOptions, fuzz  # noqa: E402
from tests.fuzz.test_planted_brokers import DIRECT as BROKER_PLANTS  # noqa: E402
from tests.fuzz.test_planted_peers import DIRECT as PEER_PLANTS  # noqa: E402

INTERVAL, LIVENESS = 0.1, 3
# A flaw that breaks more than one rule in the same act is found by naming either.
ALSO: dict[str, tuple[str, ...]] = {"forward-stray-reply": ("MDP-D-13",)}


def _domo(*argv: str) -> list[str]:
    return [sys.executable, "-m", "domo", *argv, "--log-level", "error"]


def _start_broker(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().split()[-1]


def one(
    role: str, flaw: str, rules: tuple[str, ...], seed: int, budget: float
) -> dict[str, object]:
    """One search against one target; what it found and when."""
    proc = None
    common = dict(heartbeat_interval=INTERVAL, liveness=LIVENESS, examples=100_000,
                  time_budget=budget, seed=seed, stop_after=rules)  # fmt: skip
    try:
        if role == "broker":
            if flaw == "domo":
                argv = _domo("broker", "--bind", "tcp://127.0.0.1:0", "--heartbeat-interval",
                             str(INTERVAL), "--liveness", str(LIVENESS))  # fmt: skip
            else:
                argv = [sys.executable, str(HERE / "planted_broker.py"), flaw, str(INTERVAL),
                        str(LIVENESS)]  # fmt: skip
            proc, endpoint = _start_broker(argv)
            options = FuzzOptions(endpoint, **common)  # type: ignore[arg-type]
        else:
            if flaw == "domo":
                command = (
                    _domo(
                        "worker",
                        "--connect",
                        "{endpoint}",
                        "--heartbeat-interval",
                        str(INTERVAL),
                        "--liveness",
                        str(LIVENESS),
                        "echo",
                    )
                    if role == "worker"
                    else _domo(
                        "call",
                        "--connect",
                        "{endpoint}",
                        "--repeat",
                        "0",
                        "--timeout",
                        "0.5",
                        "--retries",
                        "1",
                        "echo",
                        "hello",
                    )
                )
            else:
                command = [sys.executable, str(HERE / "planted_peers.py"), role, flaw, "{endpoint}"]
                if role == "worker":
                    command += [str(INTERVAL), str(LIVENESS)]
            options = FuzzOptions(
                "tcp://127.0.0.1:0",
                target=role,
                command=command,
                **common,  # type: ignore[arg-type]
            )
        try:
            result = fuzz(options, progress=None)
        except Exception as error:  # a crash of the fuzzer is a result too, not the end of all
            return {"role": role, "flaw": flaw, "rules": rules, "seed": seed, "found": False,
                    "seconds": None, "examples": 0, "elapsed": 0.0,
                    "others": [f"the fuzzer crashed: {error!r}"[:300]], "jitter": {}}  # fmt: skip
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    hit = next((f for f in result.findings if f.violation.rule in rules), None)
    return {
        "role": role,
        "flaw": flaw,
        "rules": rules,
        "seed": seed,
        "found": hit is not None,
        "seconds": hit.seconds if hit is not None else None,
        "examples": result.examples,
        "elapsed": result.seconds,
        "others": [str(f.violation) for f in result.findings if f is not hit],
        "jitter": result.jitter,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--controls", type=int, default=10)
    parser.add_argument("--control-budget", type=float, default=20.0)
    parser.add_argument("--hog", type=int, nargs="?", const=1, default=0, metavar="N")
    parser.add_argument("--controls-only", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help="only these flaws (no controls)")
    parser.add_argument("--control-roles", nargs="*", default=["broker", "worker", "client"])
    args = parser.parse_args()
    plants = [("broker", f, (r, *ALSO.get(f, ()))) for f, (r, _) in BROKER_PLANTS.items()]
    plants += [(role, f, (r,)) for (role, f), (r, _) in PEER_PLANTS.items()]
    if args.only is not None:
        plants = [p for p in plants if p[1] in args.only]
    if args.controls_only:
        plants = []
    controls = [] if args.only is not None else [
        (role, "domo", (), args.seed + i, args.control_budget)
        for i in range(args.controls)
        for role in args.control_roles
    ]  # fmt: skip
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
    started = time.monotonic()
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
            jobs = [pool.submit(one, r, f, rules, args.seed, args.budget) for r, f, rules in plants]
            jobs += [pool.submit(one, *c) for c in controls]
            results = [job.result() for job in jobs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    planted = [r for r in results if r["flaw"] != "domo"]
    found = [r for r in planted if r["found"]]
    print(f"planted suite: {len(found)}/{len(planted)} found, seed {args.seed}, "
          f"{args.budget:.0f} s budget each, jobs {args.jobs}, hog {args.hog}, "
          f"{time.monotonic() - started:.0f} s in all\n")  # fmt: skip
    print("| target | flaw | rule | found after | scenarios | also found |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in planted:
        when = f"{r['seconds']:.1f} s" if r["found"] else "**missed**"
        others = "; ".join(cast(list[str], r["others"]))
        rules = " or ".join(cast(tuple[str, ...], r["rules"]))
        print(f"| {r['role']} | {r['flaw']} | {rules} | {when} | {r['examples']} | {others} |")
    dirty = [r for r in results if r["flaw"] == "domo" and r["others"]]
    clean = len([r for r in results if r["flaw"] == "domo"]) - len(dirty)
    print(f"\ncontrol (domo's own peers): {clean} clean of {clean + len(dirty)} runs")
    for r in dirty:
        print(f"- {r['role']} seed {r['seed']}: {r['others']}")
    for role in ("broker", "worker", "client"):
        runs = [r for r in results if r["flaw"] == "domo" and r["role"] == role]
        if runs:
            largest: dict[str, float] = {}
            for r in runs:
                for kind, seconds in cast(dict[str, float], r["jitter"]).items():
                    largest[kind] = max(largest.get(kind, 0.0), seconds)
            shown = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in sorted(largest.items()))
            print(f"- {role}: largest jitter samples over the runs: {shown}")
    return 1 if dirty else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
