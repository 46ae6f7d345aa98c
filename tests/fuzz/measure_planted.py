"""Measure ``domo fuzz`` on the planted suite of every dialect, and on domo's own peers as a
control.

``python tests/fuzz/measure_planted.py [--budget 40] [--seed 1] [--jobs 2] [--lanes 8]
[--controls 3] [--control-budget 20] [--hog [N]] [--controls-only] [--dialects D ...]
[--only FLAW ...]`` (or ``nox -s fuzz_planted -- ARGS``) runs the search against every planted
broker (``planted_broker.py`` in MDP/0.2, MDP/0.1 and majortomo's framing, ``planted_emqp_broker``,
``planted_dcp_broker``, ``planted_memo01_broker``), worker and client (``planted_peers.py``) at a
0.1 s heartbeat, each until it names the planted rule or the budget is spent, then against
``domo broker`` (each dialect), ``domo worker`` and ``domo call --repeat 0`` with ``--controls``
different seeds each. It prints per dialect the share found and a Markdown table: per plant
whether the rule was found, after how many seconds and scenarios; per control run what (if
anything) was found. ``--hog N`` runs N busy loops meanwhile (one per core you mean to load),
started and killed by their PIDs. Exit 1 if a control run found anything, 2 if a dialect's
share found is under ``--require`` (default 0: report only).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from domo.fuzz import FuzzOptions, fuzz  # noqa: E402
from domo.fuzz.dcp import fuzz_dcp  # noqa: E402
from domo.fuzz.emqp import fuzz_emqp  # noqa: E402
from tests.fuzz.planted_dcp_broker import FLAWS as DCP_FLAWS  # noqa: E402
from tests.fuzz.test_fuzz_dcp import DCP_PLANTS  # noqa: E402
from tests.fuzz.test_planted_brokers import plants as broker_plants  # noqa: E402
from tests.fuzz.test_planted_peers import DIRECT as PEER_PLANTS  # noqa: E402

INTERVAL, LIVENESS = 0.1, 3
MDP_DIALECTS = ("mdp02", "mdp01", "majortomo")
DIALECTS = (*MDP_DIALECTS, "emqp", "dcp", "memo01", "peers")
# A flaw that breaks more than one rule in the same act is found by naming either.
ALSO: dict[str, tuple[str, ...]] = {
    "forward-stray-reply": ("MDP-D-13", "MDP-D-10"),
    "no-disconnect-on-unexpected": ("MDP-W-10", "MDP-H-01", "MDP-D-14", "MDP-D-13"),
}


def _domo(*argv: str) -> list[str]:
    return [sys.executable, "-m", "domo", *argv, "--log-level", "error"]


def _start(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().split()[-1]


def plants(dialects: tuple[str, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(dialect, flaw, rules) of every plant of ``dialects``."""
    found: list[tuple[str, str, tuple[str, ...]]] = []
    for dialect in dialects:
        if dialect in MDP_DIALECTS:
            found += [
                (dialect, f, (r, *ALSO.get(f, ()))) for f, (r, _) in broker_plants(dialect).items()
            ]
        elif dialect == "emqp":
            from tests.fuzz.planted_emqp_broker import PLANTS

            found += [("emqp", f, (r, *ALSO.get(f, ()))) for f, (_, r, _) in PLANTS.items()]
        elif dialect == "dcp":
            found += [("dcp", f, (DCP_PLANTS[f],)) for f in DCP_FLAWS if f != "none"]
        elif dialect == "memo01":
            from tests.fuzz.planted_memo01_broker import PLANTS as MEMO

            found += [("memo01", f, (r,)) for f, (_, r) in MEMO.items()]
        elif dialect == "peers":
            found += [(f"{role}", f, (r,)) for (role, f), (r, _) in PEER_PLANTS.items()]
    return found


def one(
    dialect: str, flaw: str, rules: tuple[str, ...], seed: int, budget: float, lanes: int
) -> dict[str, Any]:
    """One search against one target; what it found and when. ``lanes`` is the MDP
    dialects'; eMQP and DCP run at most 8, memo01 4 (their CLI defaults)."""
    lanes = min(lanes, {"emqp": 8, "dcp": 8, "memo01": 4}.get(dialect, lanes))
    proc = None
    started = time.monotonic()
    record: dict[str, Any] = {"dialect": dialect, "flaw": flaw, "rules": rules, "seed": seed,
                              "found": False, "seconds": None, "examples": 0, "elapsed": 0.0,
                              "others": [], "jitter": {}}  # fmt: skip
    tmp = tempfile.mkdtemp(prefix="domo-fuzz-measure-")
    try:
        hits: list[tuple[str, float | None]] = []
        if dialect in MDP_DIALECTS or dialect in ("worker", "client"):
            role = "broker" if dialect in MDP_DIALECTS else dialect
            common = dict(heartbeat_interval=INTERVAL, liveness=LIVENESS, examples=1_000_000,
                          time_budget=budget, seed=seed, stop_after=rules, lanes=lanes)  # fmt: skip
            if role == "broker":
                mdp = dialect
                if flaw == "domo":
                    argv = _domo("broker", "--bind", "tcp://127.0.0.1:0", "--heartbeat-interval",
                                 str(INTERVAL), "--liveness", str(LIVENESS))  # fmt: skip
                else:
                    argv = [sys.executable, str(HERE / "planted_broker.py"), flaw, str(INTERVAL),
                            str(LIVENESS), mdp]  # fmt: skip
                proc, endpoint = _start(argv)
                options = FuzzOptions(endpoint, dialect=mdp, **common)  # type: ignore[arg-type]
            else:
                options = FuzzOptions(
                    "tcp://127.0.0.1:0",
                    target=role,
                    command=_peer_command(role, flaw),
                    **common,  # type: ignore[arg-type]
                )
            result = fuzz(options, progress=None)
            record["examples"], record["jitter"] = result.examples, result.jitter
            hits = [(f.violation.rule, f.seconds) for f in result.findings]
            others = [str(f.violation) for f in result.findings if f.violation.rule not in rules]
        elif dialect == "emqp":
            argv = [sys.executable, str(HERE / "planted_emqp_broker.py"), flaw if flaw != "domo"
                    else "none", str(INTERVAL), str(LIVENESS)]  # fmt: skip
            proc, endpoint = _start(argv)
            from domo.protocol import BrokerConfig
            from domo.protocol.layers.emqp import credit_cap

            credits = credit_cap(BrokerConfig().pipe_messages)
            emqp = fuzz_emqp(endpoint, scenarios=1_000_000, seed=seed, time_budget=budget,
                             heartbeat_interval=INTERVAL, liveness=LIVENESS, credits=credits,
                             lanes=lanes, stop_after=rules)  # fmt: skip
            record["examples"] = emqp.scenarios
            hits = [(f.rule, None) for f in emqp.findings]
            others = [f"{f.rule}: {f.explanation}" for f in emqp.findings if f.rule not in rules]
        elif dialect == "dcp":
            argv = [sys.executable, str(HERE / "planted_dcp_broker.py"), flaw if flaw != "domo"
                    else "none", str(INTERVAL), str(LIVENESS)]  # fmt: skip
            proc, endpoint = _start(argv)
            dcp = fuzz_dcp(endpoint, scenarios=1_000_000, seed=seed, time_budget=budget,
                           heartbeat_interval=INTERVAL, liveness=LIVENESS, lanes=lanes,
                           stop_after=rules)  # fmt: skip
            record["examples"] = dcp.scenarios
            hits = [(f.rule, None) for f in dcp.findings]
            others = [f"{f.rule}: {f.explanation}" for f in dcp.findings if f.rule not in rules]
        else:  # memo01
            from domo.fuzz.memo01 import fuzz_memo01

            argv = [sys.executable, str(HERE / "planted_memo01_broker.py"), flaw if flaw != "domo"
                    else "none", str(INTERVAL), str(LIVENESS), tmp]  # fmt: skip
            proc, endpoint = _start(argv)
            memo = fuzz_memo01(endpoint.removeprefix("nng+"), scenarios=1_000_000, seed=seed,
                               time_budget=budget, lanes=lanes, stop_after=rules)  # fmt: skip
            record["examples"] = memo.scenarios
            hits = [(f.rule, None) for f in memo.findings]
            others = [f"{f.rule}: {f.explanation}" for f in memo.findings if f.rule not in rules]
        hit = next((h for h in hits if h[0] in rules), None)
        record["found"] = hit is not None
        record["seconds"] = hit[1] if hit is not None else None
        record["others"] = [o[:300] for o in others]
    except Exception as error:  # a crash of the fuzzer is a result too, not the end of all
        record["others"] = [f"the fuzzer crashed: {error!r}"[:300]]
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        record["elapsed"] = time.monotonic() - started
    if record["found"] and record["seconds"] is None:
        record["seconds"] = record["elapsed"]  # the search stopped at the rule: about then
    return record


def _peer_command(role: str, flaw: str) -> list[str]:
    if flaw == "domo":
        if role == "worker":
            return _domo("worker", "--connect", "{endpoint}", "--heartbeat-interval",
                         str(INTERVAL), "--liveness", str(LIVENESS), "echo")  # fmt: skip
        return _domo("call", "--connect", "{endpoint}", "--repeat", "0", "--timeout", "0.5",
                     "--retries", "1", "echo", "hello")  # fmt: skip
    command = [sys.executable, str(HERE / "planted_peers.py"), role, flaw, "{endpoint}"]
    return command + ([str(INTERVAL), str(LIVENESS)] if role == "worker" else [])


def measure(
    targets: list[tuple[str, str, tuple[str, ...]]],
    *,
    seed: int,
    budget: float,
    jobs: int,
    lanes: int,
    controls: list[tuple[str, int, float]] = (),  # type: ignore[assignment]
    hog: int = 0,
) -> list[dict[str, Any]]:
    """Run every target (and control: dialect, seed, budget) on ``jobs`` processes."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hog)]
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            submitted = [pool.submit(one, d, f, r, seed, budget, lanes) for d, f, r in targets]
            submitted += [pool.submit(one, d, "domo", (), s, b, lanes) for d, s, b in controls]
            return [job.result() for job in submitted]
    finally:
        for process in hogs:
            process.kill()
            process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--budget", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--controls", type=int, default=3)
    parser.add_argument("--control-budget", type=float, default=20.0)
    parser.add_argument("--hog", type=int, nargs="?", const=1, default=0, metavar="N")
    parser.add_argument("--controls-only", action="store_true")
    parser.add_argument("--dialects", nargs="*", default=list(DIALECTS), choices=DIALECTS)
    parser.add_argument("--only", nargs="*", default=None, help="only these flaws (no controls)")
    parser.add_argument("--require", type=float, default=0.0, help="least share found per dialect")
    args = parser.parse_args()
    targets = [] if args.controls_only else plants(tuple(args.dialects))
    if args.only is not None:
        targets = [t for t in targets if t[1] in args.only]
    control_dialects = [d for d in args.dialects if d != "peers"]
    control_dialects += ["worker", "client"] if "peers" in args.dialects else []
    controls = [] if args.only is not None else [
        (d, args.seed + i, args.control_budget) for i in range(args.controls)
        for d in control_dialects
    ]  # fmt: skip
    started = time.monotonic()
    results = measure(targets, seed=args.seed, budget=args.budget, jobs=args.jobs,
                      lanes=args.lanes, controls=controls, hog=args.hog)  # fmt: skip
    planted = [r for r in results if r["flaw"] != "domo"]
    print(f"planted suite: seed {args.seed}, {args.budget:.0f} s budget each, jobs {args.jobs}, "
          f"lanes {args.lanes}, hog {args.hog}, "
          f"{time.monotonic() - started:.0f} s in all\n")  # fmt: skip
    short = False
    for dialect in DIALECTS:
        mine = [r for r in planted if r["dialect"] == dialect or
                (dialect == "peers" and r["dialect"] in ("worker", "client"))]  # fmt: skip
        if mine:
            found = sum(1 for r in mine if r["found"])
            share = found / len(mine)
            short = short or share < args.require
            print(f"- {dialect}: {found}/{len(mine)} found ({100 * share:.0f} %)")
    print("\n| dialect | flaw | rule | found after | scenarios | also found |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in planted:
        when = f"{r['seconds']:.1f} s" if r["found"] else "**missed**"
        others = "; ".join(cast(list[str], r["others"]))
        rules = " or ".join(cast(tuple[str, ...], r["rules"]))
        print(f"| {r['dialect']} | {r['flaw']} | {rules} | {when} | {r['examples']} | {others} |")
    dirty = [r for r in results if r["flaw"] == "domo" and r["others"]]
    clean = len([r for r in results if r["flaw"] == "domo"]) - len(dirty)
    print(f"\ncontrol (domo's own peers): {clean} clean of {clean + len(dirty)} runs")
    for r in dirty:
        print(f"- {r['dialect']} seed {r['seed']}: {r['others']}")
    for r in results:
        if r["flaw"] == "domo":
            shown = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in sorted(r["jitter"].items()))
            print(f"- {r['dialect']} seed {r['seed']}: {r['examples']} scenarios; {shown}")
    return 1 if dirty else 2 if short else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
