"""``domo report`` end to end over synthetic traces, 1 M to 100 M requests (issues 15 and 29).

The traces come from ``_gen_traces.py`` (numpy, not a broker; not timed): the largest size is
generated once, as files of 1 M records, and each smaller size reads the first of those files
(a directory of symbolic links), so a series costs one generation. Then ``domo report DIR --out
OUT`` runs as a subprocess and is timed from its start to its exit: Python start, the footer
scan, the JVM and session start, the fold, the table and the Parquet output. Also reported: the
CPU seconds of the report, its JVM and Spark's Python workers (sampled from /proc), steadier
than wall time on a shared machine, and the load average. Goals: 1 M in at most 20 s, 20 M in
at most 60 s (issue 15), 100 M in at most 150 s (issue 29).

Usage: ``python benchmarks/report_bench.py [--sizes 1000000 10000000 100000000] [--reps 2]
[--data DIR] [--plot FILE] [--json FILE] [--quick]``. ``--data DIR`` keeps the generated traces
in ``DIR`` and reuses them; by default they go to a temporary directory, deleted after (100 M
records are about 4.3 GB). Sizes run smallest first, each ``--reps`` times in a row (the page
cache warm after the first). ``--plot FILE``: report time against records, log-log, as SVG
(needs matplotlib). ``--quick``: 100,000 records only. Without the spark extra it says so and
exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

GOALS = {1_000_000: 20.0, 20_000_000: 60.0, 100_000_000: 150.0}
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


def _prepare(root: Path, sizes: list[int]) -> dict[int, Path]:
    """A directory per size: the largest generated, the others links to its first files."""
    import _gen_traces
    import pyarrow.parquet as pq

    largest = max(sizes)
    source = root / str(largest)
    files = sorted(source.glob("requests-*.parquet"))
    have = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
    if have != largest:
        began = time.perf_counter()
        for path in source.glob("*.parquet"):
            path.unlink()
        _gen_traces.generate(source, largest)
        print(f"generated {largest:,} records in {time.perf_counter() - began:.1f} s", flush=True)
        files = sorted(source.glob("requests-*.parquet"))
    [workers] = source.glob("workers-*.parquet")
    directories = {largest: source}
    for rows in sizes:
        if rows == largest:
            continue
        directory = root / f"{rows}-of-{largest}"
        if rows % _gen_traces.PER_FILE:
            directory = root / str(rows)  # not a whole number of files: its own traces
            if sum(pq.ParquetFile(p).metadata.num_rows for p in directory.glob("req*")) != rows:
                _gen_traces.generate(directory, rows)
        else:
            directory.mkdir(parents=True, exist_ok=True)
            wanted = [*files[: rows // _gen_traces.PER_FILE], workers]
            for path in directory.iterdir():
                path.unlink()
            for path in wanted:
                (directory / path.name).symlink_to(path)
        directories[rows] = directory
    return directories


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Report time against records (log-log), each run a point, the median a line."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "path"
    matplotlib.rcParams["svg.hashsalt"] = "domo"  # the same figures give the same file
    import matplotlib.pyplot as plt

    sizes = sorted({row["rows"] for row in results})
    medians = []
    for rows in sizes:
        walls = sorted(row["wall"] for row in results if row["rows"] == rows)
        medians.append(walls[len(walls) // 2])
    figure, axes = plt.subplots(figsize=(7, 4.2))
    axes.plot(
        [row["rows"] for row in results],
        [row["wall"] for row in results],
        "o",
        alpha=0.5,
        label="each run (wall)",
    )
    axes.plot(sizes, medians, "-", label="median")
    axes.plot(
        [row["rows"] for row in results],
        [row["cpu"] for row in results],
        "x",
        alpha=0.5,
        label="CPU-s of the report, JVM and Python workers",
    )
    goal_sizes = [rows for rows in GOALS if sizes[0] <= rows <= sizes[-1]]
    axes.plot(goal_sizes, [GOALS[rows] for rows in goal_sizes], "r_", markersize=18, mew=2)
    axes.plot([], [], "r_", label="goals")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("request records")
    axes.set_ylabel("seconds, JVM start included")
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize="small")
    loads = ", ".join(f"{row['load']:.1f}" for row in results)
    axes.set_title(f"domo report on 2 shared cores (load averages {loads})", fontsize="small")
    figure.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 20_000_000])
    parser.add_argument("--data", type=Path, help="keep and reuse generated traces here")
    parser.add_argument("--quick", action="store_true", help="100,000 rows only")
    parser.add_argument("--reps", type=int, default=1, help="runs of each size")
    parser.add_argument("--plot", type=Path, help="write the time-against-records plot (SVG)")
    parser.add_argument("--json", type=Path, help="write every run's figures as JSON")
    args = parser.parse_args()
    try:
        import numpy  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        print("report_bench: skipped, needs the spark extra (pip install 'domo[spark]')")
        return
    sizes = sorted([100_000] if args.quick else args.sizes)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or Path(scratch)
        directories = _prepare(root, sizes)
        for rows in sizes:
            directory = directories[rows]
            size = sum(path.stat().st_size for path in directory.glob("*.parquet")) / 1e6
            for _ in range(max(1, args.reps)):
                wall, cpu = time_report(directory, Path(scratch) / f"out-{rows}")
                load = os.getloadavg()[0]
                goal = GOALS.get(rows)
                verdict = (
                    ""
                    if goal is None
                    else f"; goal <= {goal:.0f} s: " + ("met" if wall <= goal else "missed")
                )
                print(
                    f"domo report, {rows:>11,} rows ({size:.0f} MB Parquet): {wall:6.1f} s "
                    f"wall, {cpu:6.1f} CPU-s (sampled), load {load:.1f}{verdict}",
                    flush=True,
                )
                results.append({"rows": rows, "wall": wall, "cpu": cpu, "load": load})
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
