"""``domo.spark.call_service`` rows per second against a plain ``domo.sync`` client loop (issue 15).

A ``domo broker`` and two ``domo worker echo`` processes on loopback. The baseline: one
``domo.sync.Client`` in this process sending the rows' bodies one after another (a plain loop,
one request in flight). Then the same rows as a DataFrame (2 partitions) through
``call_service(..., window=W)`` on a local Spark session (local[2]); the first Spark run starts
the Python workers and is reported apart; the timed runs force every row through with an
aggregate that also counts wrong replies (there must be none). Goal: call_service moves at
least 0.5x the rows per second of the plain loop. Session start is not timed.

Usage: ``python benchmarks/call_service_bench.py [--rows 20000] [--window 16] [--quick]``
(``--reps``/``--json`` are accepted for ``nox -s bench`` and ignored). Without the spark extra
it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from domo.sync import Client

ENDPOINT = "tcp://127.0.0.1:5598"


def _start(*args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "domo", *args, "--log-level", "warning"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL)


def _wait_for_echo() -> None:
    with Client(ENDPOINT, timeout=5.0) as client:
        deadline = time.monotonic() + 60
        while client.request("mmi.service", b"echo") != [b"200"]:
            if time.monotonic() > deadline:
                raise SystemExit("no echo worker registered in 60 s")
            time.sleep(0.1)


def plain_loop(bodies: list[bytes]) -> float:
    """Rows per second of one client sending the bodies one after another."""
    with Client(ENDPOINT, timeout=10.0) as client:
        began = time.perf_counter()
        for body in bodies:
            if client.request("echo", body) != [body]:
                raise SystemExit("plain loop: wrong reply")
        return len(bodies) / (time.perf_counter() - began)


def spark_run(spark: object, df: object, window: int) -> float:
    """Rows per second of one call_service action over ``df``; every reply is checked."""
    from pyspark.sql import functions as F

    from domo.spark import call_service

    began = time.perf_counter()
    result = call_service(df, "echo", ENDPOINT, window=window)
    row = result.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum((F.col("reply") != F.col("body")).cast("int")).alias("wrong"),
        F.sum(F.col("error").isNotNull().cast("int")).alias("errors"),
    ).collect()[0]
    elapsed = time.perf_counter() - began
    if (row["wrong"], row["errors"]) != (0, 0):
        raise SystemExit(f"call_service: {row['wrong']} wrong replies, {row['errors']} errors")
    return int(row["rows"]) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each (median)")
    parser.add_argument("--quick", action="store_true", help="2,000 rows, one timed run")
    parser.add_argument("--reps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        import pandas  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        print("call_service_bench: skipped, needs the spark extra (pip install 'domo[spark]')")
        return
    from domo.spark import local_session

    rows, runs = (2_000, 1) if args.quick else (args.rows, args.runs)
    bodies = [b"row-%08d-payload-xxxxxxxxxxxx" % index for index in range(rows)]
    peers = [_start("broker", "--bind", ENDPOINT)]
    try:
        peers += [_start("worker", "echo", "--connect", ENDPOINT) for _ in range(2)]
        _wait_for_echo()
        spark = local_session("local[2]", app_name="call_service bench", driver_memory="1g")
        df = spark.createDataFrame([(body,) for body in bodies], "body binary").repartition(2)
        df = df.cache()
        df.count()  # the input is in memory before anything is timed
        first = spark_run(spark, df, args.window)
        loop: list[float] = []
        spark_rates: list[float] = []
        for _ in range(runs):  # interleaved, so that drift on a shared machine hits both
            loop.append(plain_loop(bodies))
            spark_rates.append(spark_run(spark, df, args.window))
        spark.stop()
    finally:
        for peer in peers:
            peer.kill()  # by PID: the processes this script started
            peer.wait()
    loop_rate = sorted(loop)[len(loop) // 2]
    spark_rate = sorted(spark_rates)[len(spark_rates) // 2]
    ratio = spark_rate / loop_rate
    print(f"plain domo.sync loop:       {loop_rate:8.0f} rows/s (median of {runs})")
    print(f"call_service, first run:    {first:8.0f} rows/s (Spark's Python workers starting)")
    print(
        f"call_service, window {args.window:<3d}:   {spark_rate:8.0f} rows/s (median of {runs}, "
        f"2 partitions)"
    )
    verdict = "meets" if ratio >= 0.5 else "misses"
    print(
        f"call_service / plain loop: {ratio:.2f}x ({verdict} the goal >= 0.5x); "
        f"{rows} rows, load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
