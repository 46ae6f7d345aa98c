"""``domo report TRACE_DIR``: the Spark report over a broker's traces (``domo.report``)."""

from __future__ import annotations

import argparse
import math

from domo import report as trace_report

from ._common import _count, _subcommand

# --- report ----------------------------------------------------------------------------------


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "report",
        "summarise a broker's request traces with Spark",
        "Read the Parquet traces that `domo broker --trace-dir` wrote into TRACE_DIR and print, "
        "per service and per worker: requests, throughput, queue wait, service time and latency "
        "percentiles, re-dispatches, expiries, drops by reason and rule, worker utilisation, "
        "and the slowest requests, split by dialect when the traces hold several "
        "(docs/report.md). Runs on an embedded local Spark unless --master names a cluster or "
        "--remote a Spark Connect server; needs pip install 'domo[spark]' and Java 17 or newer "
        "(--remote: 'domo[connect]' and no Java). Unreadable files are skipped and named on "
        "stderr. With --follow it keeps reading TRACE_DIR as the broker writes it and rewrites "
        "the --html page every few seconds, until Ctrl-C.",
        _report,
        "warning",
    )
    sub.add_argument("trace_dir", metavar="TRACE_DIR", help="the directory of trace files")
    sub.add_argument(
        "--master",
        metavar="URL",
        help="Spark master, e.g. spark://host:7077 or local[4] (default: a local session "
        "in this process using every core); the executors must be able to read TRACE_DIR",
    )
    sub.add_argument(
        "--remote",
        metavar="URL",
        help="run on a Spark Connect server instead, e.g. sc://host:15002 (no JVM here; the "
        "server reads TRACE_DIR: give a path it can see)",
    )
    sub.add_argument(
        "--follow",
        action="store_true",
        help="keep reading TRACE_DIR as it grows (each file once complete) and rewrite the "
        "--html page every --interval seconds, until Ctrl-C",
    )
    sub.add_argument(
        "--interval",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="with --follow: how often to look for new files and rewrite the page "
        "(default: %(default)s)",
    )
    sub.add_argument(
        "--html", metavar="FILE", help="also write the report as one HTML page with plots"
    )
    sub.add_argument(
        "--out",
        metavar="DIR",
        help="also write the aggregates as Parquet files into DIR (services, workers, "
        "throughput, drops, slowest)",
    )
    sub.add_argument(
        "--since",
        metavar="TIME",
        type=_report_time,
        help="only requests received at or after TIME (ISO 8601, UTC unless it has an offset; "
        "or Unix seconds)",
    )
    sub.add_argument(
        "--until", metavar="TIME", type=_report_time, help="only requests received before TIME"
    )
    sub.add_argument(
        "--service",
        action="append",
        metavar="NAME",
        default=[],
        help="only this service; repeat for several (default: every service)",
    )
    sub.add_argument(
        "--slowest",
        type=_count,
        default=10,
        metavar="N",
        help="how many of the slowest requests to list (default: %(default)s)",
    )
    sub.add_argument(
        "--driver-memory",
        default="2g",
        metavar="SIZE",
        help="the Spark driver's heap, e.g. 4g for hundreds of millions of records "
        "(default: %(default)s)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"not a number of seconds in [0.1, 3600]: {text!r}")
    return value


def _report_time(text: str) -> float:
    try:
        return trace_report.parse_time(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601 such as 2026-11-24T10:00:00, or Unix seconds)"
        ) from None


async def _report(args: argparse.Namespace) -> int:
    # Spark blocks; nothing else runs in this trio.run, so it may block the loop.
    filters = trace_report.Filters(since=args.since, until=args.until, services=args.service)
    return trace_report.run(
        args.trace_dir,
        master=args.master,
        remote=args.remote,
        follow=args.follow,
        interval=args.interval,
        html=args.html,
        out=args.out,
        filters=filters,
        slowest=args.slowest,
        driver_memory=args.driver_memory,
    )
