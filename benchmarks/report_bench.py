"""``domo report`` end to end over synthetic traces of 1 M and 20 M requests (issue 15).

Each size's traces are generated first by ``_gen_traces.py`` (numpy, not a broker; not timed),
then ``domo report DIR --out OUT`` runs as a subprocess and is timed from its start to its exit:
Python start, the file scan, the JVM and Spark session start, every job, the table and the
Parquet output. Also reported: the CPU seconds of the report and its JVM (children's rusage),
steadier than wall time on a shared machine, and the load average. Goals: 1 M rows in at most
20 s, 20 M in at most 60 s.

Usage: ``python benchmarks/report_bench.py [--sizes 1000000 20000000] [--data DIR] [--quick]``.
``--data DIR`` keeps the generated traces there (``DIR/<rows>``) and reuses them on the next run;
by default they go to a temporary directory, deleted after (20 M rows are about 800 MB).
``--quick`` runs 100,000 rows only. ``--reps``/``--json`` are accepted for ``nox -s bench`` and
ignored. Without the spark extra it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

GOALS = {1_000_000: 20.0, 20_000_000: 60.0}


TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(root: int, seen: dict[int, float]) -> None:
    """Record the CPU seconds so far of ``root`` and every process below it, by PID.

    The JVM is not this process's child (pyspark's launcher starts it), so rusage misses it;
    /proc is read instead, every half second while the report runs.
    """
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(value) for value in fields[11:15]) / TICK
    for pid, cpu in times.items():
        ancestor = pid
        while ancestor not in (0, 1, root):
            ancestor = parents.get(ancestor, 0)
        if ancestor == root:
            seen[pid] = max(seen.get(pid, 0.0), cpu)


def time_report(directory: Path, out: Path) -> tuple[float, float]:
    """Wall and CPU seconds (sampled) of one ``domo report`` run (it must succeed)."""
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "domo", "report", str(directory), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[int, float] = {}
    while process.poll() is None:
        _tree_cpu(process.pid, seen)
        time.sleep(0.5)
    wall = time.perf_counter() - began
    assert process.stderr is not None
    errors = process.stderr.read()
    process.stderr.close()
    if process.returncode != 0:
        raise SystemExit(f"domo report failed ({process.returncode}):\n{errors}")
    return wall, sum(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 20_000_000])
    parser.add_argument("--data", type=Path, help="keep and reuse generated traces here")
    parser.add_argument("--quick", action="store_true", help="100,000 rows only")
    parser.add_argument("--reps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        import numpy  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        print("report_bench: skipped, needs the spark extra (pip install 'domo[spark]')")
        return
    import _gen_traces
    import pyarrow.parquet as pq

    sizes = [100_000] if args.quick else args.sizes
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or Path(scratch)
        for rows in sizes:
            directory = root / str(rows)
            files = sorted(directory.glob("requests-*.parquet"))
            have = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
            if have != rows:
                began = time.perf_counter()
                for path in directory.glob("*.parquet"):
                    path.unlink()
                _gen_traces.generate(directory, rows)
                print(f"generated {rows:,} rows in {time.perf_counter() - began:.1f} s")
            size = sum(path.stat().st_size for path in directory.glob("*.parquet")) / 1e6
            wall, cpu = time_report(directory, Path(scratch) / f"out-{rows}")
            load = os.getloadavg()[0]
            goal = GOALS.get(rows)
            verdict = (
                ""
                if goal is None
                else f"; goal <= {goal:.0f} s: " + ("met" if wall <= goal else "missed")
            )
            print(
                f"domo report, {rows:>11,} rows ({size:.0f} MB Parquet): {wall:6.1f} s wall, "
                f"{cpu:6.1f} CPU-s (sampled), load {load:.1f}{verdict}",
                flush=True,
            )


if __name__ == "__main__":
    main()
