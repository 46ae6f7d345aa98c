"""``domo report TRACE_DIR``: the Spark report over a broker's traces (``domo.report``)."""

from __future__ import annotations

import argparse

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
        "and the slowest requests (docs/report.md). Runs on an embedded local Spark unless "
        "--master names a cluster; needs pip install 'domo[spark]' and Java 17 or newer. "
        "Unreadable files are skipped and named on stderr.",
        _report,
        "warning",
    )
    sub.add_argument("trace_dir", metavar="TRACE_DIR", help="the directory of trace files")
    sub.add_argument(
        "--master",
        metavar="URL",
        help="Spark master, e.g. spark://host:7077 or local[4] (default: a local session "
        "in this process using every core)",
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
        html=args.html,
        out=args.out,
        filters=filters,
        slowest=args.slowest,
        driver_memory=args.driver_memory,
    )
