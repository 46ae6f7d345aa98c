"""Shared by the scripts in benchmarks/: repeated timing, a plain-text table and a JSON record.

Each benchmark is a *case*: a setup, not timed, that builds fresh state and returns the timed
body; the body does ``ops`` operations of the kind named by the case and returns. Every
repetition runs a new setup, so no repetition inherits the previous one's state. CPU time
(``time.process_time``) is what we report, because the machines this runs on are shared and
wall time there says more about the neighbours than about the code; wall time
(``time.perf_counter``) is recorded beside it. The garbage collector stays on (it is part of the
real cost) but is emptied before each repetition.

A script using this module accepts ``--quick`` (a few seconds in all, for the smoke test),
``--reps N`` and ``--json FILE``, via ``parser()`` and ``report()``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Case", "Result", "measure", "parser", "report"]


@dataclass(frozen=True)
class Case:
    """One thing to measure: ``setup()`` returns the body; the body does ``ops`` operations."""

    name: str
    unit: str  # what one operation is, e.g. "cycle", "message", "worker"
    ops: int
    setup: Callable[[], Callable[[], None]]


@dataclass(frozen=True)
class Result:
    """Seconds per operation, one sample per repetition, CPU and wall."""

    name: str
    unit: str
    ops: int
    cpu: tuple[float, ...]
    wall: tuple[float, ...]

    def summary(self, samples: Sequence[float]) -> dict[str, float]:
        """Median, min and max of ``samples``, in microseconds per operation."""
        return {
            "median_us": statistics.median(samples) * 1e6,
            "min_us": min(samples) * 1e6,
            "max_us": max(samples) * 1e6,
        }

    def as_dict(self) -> dict[str, object]:
        """The result as JSON-ready data."""
        return {
            "name": self.name,
            "unit": self.unit,
            "ops_per_rep": self.ops,
            "reps": len(self.cpu),
            "cpu": self.summary(self.cpu),
            "wall": self.summary(self.wall),
        }


def measure(case: Case, reps: int) -> Result:
    """Run ``case`` ``reps`` times, each on fresh state; per-operation CPU and wall seconds."""
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(reps):
        body = case.setup()
        gc.collect()
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        body()
        wall_end, cpu_end = time.perf_counter(), time.process_time()
        cpu.append((cpu_end - cpu_start) / case.ops)
        wall.append((wall_end - wall_start) / case.ops)
    return Result(case.name, case.unit, case.ops, tuple(cpu), tuple(wall))


def parser(description: str) -> argparse.ArgumentParser:
    """The command-line options every benchmark script shares."""
    result = argparse.ArgumentParser(description=description)
    result.add_argument("--quick", action="store_true", help="small sizes, a few seconds in all")
    result.add_argument("--reps", type=int, default=None, help="repetitions per case")
    result.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    return result


def table(results: Sequence[Result]) -> str:
    """The results as a fixed-width text table (microseconds per operation)."""
    head = ("benchmark", "per", "cpu median", "cpu min-max", "wall median", "reps")
    rows = [head]
    for r in results:
        cpu, wall = r.summary(r.cpu), r.summary(r.wall)
        rows.append(
            (
                r.name,
                r.unit,
                f"{cpu['median_us']:.3f} us",
                f"{cpu['min_us']:.3f}-{cpu['max_us']:.3f}",
                f"{wall['median_us']:.3f} us",
                str(len(r.cpu)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def report(script: str, results: Sequence[Result], args: argparse.Namespace) -> None:
    """Print the table; write the JSON record if asked."""
    print(table(results))
    if args.json is not None:
        record = {
            "script": script,
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "quick": args.quick,
            "results": [r.as_dict() for r in results],
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
