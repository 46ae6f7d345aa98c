"""What a report looks like: a terminal table, an HTML page with inline SVG plots, Parquet files.

The page is one self-contained file: matplotlib draws each plot to SVG with its text as paths,
no script, no stylesheet or font from the network, so it opens the same offline.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ._analyse import Report

ALL: Final = "(all)"

SERVICE_COLUMNS: Final = (
    ("service", "service", "s"),
    ("requests", "requests", "d"),
    ("completed", "done", "d"),
    ("expired", "expired", "d"),
    ("dropped", "dropped", "d"),
    ("redispatches", "redisp", "d"),
    ("throughput_mean", "req/s", "f1"),
    ("throughput_peak", "peak/s", "f1"),
    ("queue_wait_p50", "wait p50", "ms"),
    ("queue_wait_p95", "p95", "ms"),
    ("queue_wait_p99", "p99", "ms"),
    ("service_time_p50", "service p50", "ms"),
    ("service_time_p95", "p95", "ms"),
    ("service_time_p99", "p99", "ms"),
    ("latency_p50", "latency p50", "ms"),
    ("latency_p95", "p95", "ms"),
    ("latency_p99", "p99", "ms"),
)
WORKER_COLUMNS: Final = (
    ("service", "service", "s"),
    ("worker", "worker", "s"),
    ("attempts", "attempts", "d"),
    ("completed", "done", "d"),
    ("lost", "lost", "d"),
    ("failed", "failed", "d"),
    ("expiries", "expired", "d"),
    ("utilisation", "util", "pct"),
    ("service_time_p50", "service p50", "ms"),
    ("service_time_p95", "p95", "ms"),
    ("service_time_p99", "p99", "ms"),
)
DROP_COLUMNS: Final = (
    ("service", "service", "s"),
    ("drop_reason", "reason", "s"),
    ("rule", "rule", "s"),
    ("count", "dropped", "d"),
)
SLOW_COLUMNS: Final = (
    ("service", "service", "s"),
    ("request_id", "request", "d"),
    ("outcome", "outcome", "s"),
    ("worker", "last worker", "s"),
    ("t_received", "received (UTC)", "time"),
    ("latency", "latency", "ms"),
    ("queue_wait", "queue wait", "ms"),
    ("service_time", "service", "ms"),
    ("redispatches", "redisp", "d"),
)


def when(seconds: float) -> str:
    """Wall-clock seconds as an ISO 8601 UTC time, to the millisecond."""
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "ms":
        return f"{value * 1000:.2f}"
    if kind == "f1":
        return f"{value:.1f}"
    if kind == "pct":
        return f"{value * 100:.1f}%"
    if kind == "time":
        return when(value)[11:]
    if kind == "d":
        return str(int(value))
    return str(value)


def _rows(
    table: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]
) -> list[list[str]]:
    return [
        [
            _cell(ALL if key == "service" and row[key] is None else row[key], kind)
            for key, _, kind in columns
        ]
        for row in table
    ]


def _text_table(table: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    header = [title for _, title, _ in columns]
    body = _rows(table, columns)
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(columns))]
    left = [kind == "s" for _, _, kind in columns]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if is_left else cell.rjust(width)
            for cell, width, is_left in zip(cells, widths, left, strict=True)
        ).rstrip()

    return "\n".join([line(header), line(["-" * width for width in widths]), *map(line, body)])


def text(report: Report) -> str:
    """The report for a terminal (times in milliseconds)."""
    start, end = report.window
    parts = [
        f"domo report: {when(start)} to {when(end)} ({end - start:.1f} s), "
        f"{report.services[-1]['requests']} requests from {report.files} files",
        "",
        "Services (times in ms; req/s = completed per second over the window, peak over "
        f"{report.bucket:g} s buckets)",
        _text_table(report.services, SERVICE_COLUMNS),
        "",
        "Workers (util = busy time / time registered within the window)",
        _text_table(report.workers, WORKER_COLUMNS) if report.workers else "(no dispatches)",
        "",
        "Drops by reason and rule",
        _text_table(report.drops, DROP_COLUMNS) if report.drops else "(none)",
        "",
        f"Slowest {len(report.slowest)} requests (by latency)",
        _text_table(report.slowest, SLOW_COLUMNS),
    ]
    if report.corrupt:
        parts += ["", f"Skipped {len(report.corrupt)} unreadable files:"]
        parts += [f"  {name}: {why}" for name, why in report.corrupt]
    return "\n".join(parts) + "\n"


# --- HTML ----------------------------------------------------------------------------------


def _svg(figure: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # the XML prologue and DOCTYPE do not belong inside HTML


def _plots(report: Report) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "path"  # text as outlines: no font needed to view it
    import matplotlib.pyplot as plt

    plots: list[tuple[str, str]] = []
    services = [row for row in report.services if row["service"] is not None]
    busiest = [row["service"] for row in sorted(services, key=lambda r: -r["requests"])[:10]]

    figure, axes = plt.subplots(figsize=(10, 3.6))
    start = report.window[0]
    buckets = max(1, math.ceil((report.window[1] - start) / report.bucket))
    offsets = [index * report.bucket for index in range(buckets)]
    for name in busiest:
        rates = {
            round((row["start"] - start) / report.bucket): row["per_second"]
            for row in report.throughput
            if row["service"] == name
        }
        # A bucket with nothing completed is a 0 on the line, not a gap bridged over.
        axes.plot(offsets, [rates.get(index, 0.0) for index in range(buckets)], label=name)
    axes.set_xlabel(f"seconds since {when(start)} ({report.bucket:g} s buckets)")
    axes.set_ylabel("completed per second")
    if busiest:
        axes.legend(loc="best", fontsize="small")
    axes.grid(alpha=0.3)
    plots.append(("Throughput over time (the 10 busiest services)", _svg(figure)))

    figure, axes = plt.subplots(figsize=(10, 0.5 + 0.45 * max(1, len(busiest))))
    shown = [row for row in services if row["service"] in busiest]
    height = 0.27
    for offset, (key, label) in enumerate(
        (("latency_p50", "p50"), ("latency_p95", "p95"), ("latency_p99", "p99"))
    ):
        axes.barh(
            [index + (offset - 1) * height for index in range(len(shown))],
            [(row[key] or math.nan) * 1000 for row in shown],
            height=height,
            label=label,
        )
    axes.set_yticks(range(len(shown)), [str(row["service"]) for row in shown])
    axes.set_xscale("log")  # p99 is often orders of magnitude above p50
    axes.set_xlabel("latency, ms (received to finished; log scale)")
    axes.legend(loc="best", fontsize="small")
    axes.grid(alpha=0.3, axis="x")
    plots.append(("Latency percentiles per service", _svg(figure)))

    workers = sorted(report.workers, key=lambda r: -(r["utilisation"] or 0.0))[:30]
    if workers:
        figure, axes = plt.subplots(figsize=(10, 0.5 + 0.3 * len(workers)))
        axes.barh(
            range(len(workers)),
            [(row["utilisation"] or 0.0) * 100 for row in workers],
            color="tab:green",
        )
        axes.set_yticks(
            range(len(workers)), [f"{row['service']} {row['worker']}" for row in workers]
        )
        axes.invert_yaxis()
        axes.set_xlabel("utilisation, % of the time registered")
        axes.grid(alpha=0.3, axis="x")
        plots.append(("Worker utilisation (the 30 busiest workers)", _svg(figure)))
    return plots


def _html_table(table: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    if not table:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in _rows(table, columns)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f0f0f0; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 0 0 2em 0; } svg { max-width: 100%; height: auto; }
"""


def page(report: Report) -> str:
    """The report as one HTML page with its plots inline (SVG)."""
    start, end = report.window
    figures = "".join(
        f"<figure><figcaption><h3>{html.escape(title)}</h3></figcaption>{svg}</figure>"
        for title, svg in _plots(report)
    )
    skipped = ""
    if report.corrupt:
        items = "".join(
            f"<li>{html.escape(name)}: {html.escape(why)}</li>" for name, why in report.corrupt
        )
        skipped = f"<h2>Skipped {len(report.corrupt)} unreadable files</h2><ul>{items}</ul>"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>domo report {html.escape(when(start))}</title><style>{STYLE}</style></head>"
        f"<body><h1>domo report</h1><p>{html.escape(when(start))} to {html.escape(when(end))} "
        f"({end - start:.1f} s), {report.services[-1]['requests']} requests from "
        f"{report.files} files. Times in milliseconds.</p>"
        f"<h2>Services</h2>{_html_table(report.services, SERVICE_COLUMNS)}{figures}"
        f"<h2>Workers</h2>{_html_table(report.workers, WORKER_COLUMNS)}"
        f"<h2>Drops by reason and rule</h2>{_html_table(report.drops, DROP_COLUMNS)}"
        f"<h2>Slowest requests</h2>{_html_table(report.slowest, SLOW_COLUMNS)}"
        f"{skipped}</body></html>\n"
    )


# --- Parquet -------------------------------------------------------------------------------


def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    f64, i64, text_ = pa.float64(), pa.int64(), pa.string()
    percentiles = [
        (f"{name}_p{p}", f64)
        for name in ("queue_wait", "service_time", "latency")
        for p in (50, 95, 99)
    ]
    return {
        "services": pa.schema(
            [
                ("service", text_),
                ("requests", i64),
                ("completed", i64),
                ("expired", i64),
                ("dropped", i64),
                ("redispatches", i64),
                ("request_bytes", i64),
                ("reply_bytes", i64),
                ("first_received", f64),
                ("last_finished", f64),
                *percentiles,
                ("throughput_mean", f64),
                ("throughput_peak", f64),
            ]
        ),
        "workers": pa.schema(
            [
                ("service", text_),
                ("worker", text_),
                ("attempts", i64),
                ("completed", i64),
                ("lost", i64),
                ("failed", i64),
                ("busy", f64),
                ("first_dispatch", f64),
                ("last_end", f64),
                ("service_time_p50", f64),
                ("service_time_p95", f64),
                ("service_time_p99", f64),
                ("expiries", i64),
                ("disconnects", i64),
                ("utilisation", f64),
            ]
        ),
        "throughput": pa.schema(
            [("service", text_), ("start", f64), ("completed", i64), ("per_second", f64)]
        ),
        "drops": pa.schema(
            [("service", text_), ("drop_reason", text_), ("rule", text_), ("count", i64)]
        ),
        "slowest": pa.schema(
            [
                ("service", text_),
                ("request_id", i64),
                ("outcome", text_),
                ("worker", text_),
                ("t_received", f64),
                ("latency", f64),
                ("queue_wait", f64),
                ("service_time", f64),
                ("redispatches", i64),
            ]
        ),
    }


def write_parquet(report: Report, directory: Path) -> list[Path]:
    """One Parquet file per table (``services.parquet``, ...) in ``directory``; their paths.

    In ``services``, the row whose service is null is the total over all services.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in _schemas().items():
        rows = getattr(report, name)
        table = pa.Table.from_pylist(
            [{key: row.get(key) for key in schema.names} for row in rows], schema=schema
        )
        path = directory / f"{name}.parquet"
        pq.write_table(table, path)
        written.append(path)
    return written
