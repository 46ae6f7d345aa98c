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

# (key, title, kind, group): a group names the columns it spans (a header row above theirs).
Column = tuple[str, str, str, str | None]
DIALECT: Final[Column] = ("dialect", "dialect", "s", None)
WAIT: Final = "queue wait (ms)"
SERVICE: Final = "service time (ms)"
LATENCY: Final = "latency (ms)"
SERVICE_COLUMNS: Final[tuple[Column, ...]] = (
    ("service", "service", "s", None),
    ("requests", "requests", "d", None),
    ("completed", "done", "d", None),
    ("expired", "expired", "d", None),
    ("dropped", "dropped", "d", None),
    ("redispatches", "redisp", "d", None),
    ("throughput_mean", "req/s", "f1", None),
    ("throughput_peak", "peak/s", "f1", None),
    ("queue_wait_p50", "p50", "ms", WAIT),
    ("queue_wait_p95", "p95", "ms", WAIT),
    ("queue_wait_p99", "p99", "ms", WAIT),
    ("service_time_p50", "p50", "ms", SERVICE),
    ("service_time_p95", "p95", "ms", SERVICE),
    ("service_time_p99", "p99", "ms", SERVICE),
    ("latency_p50", "p50", "ms", LATENCY),
    ("latency_p95", "p95", "ms", LATENCY),
    ("latency_p99", "p99", "ms", LATENCY),
)
WORKER_COLUMNS: Final[tuple[Column, ...]] = (
    ("service", "service", "s", None),
    ("worker", "worker", "s", None),
    ("attempts", "attempts", "d", None),
    ("completed", "done", "d", None),
    ("lost", "lost", "d", None),
    ("failed", "failed", "d", None),
    ("expiries", "expired", "d", None),
    ("utilisation", "util", "pct", None),
    ("service_time_p50", "p50", "ms", SERVICE),
    ("service_time_p95", "p95", "ms", SERVICE),
    ("service_time_p99", "p99", "ms", SERVICE),
)
DROP_COLUMNS: Final[tuple[Column, ...]] = (
    ("service", "service", "s", None),
    ("drop_reason", "reason", "s", None),
    ("rule", "rule", "s", None),
    ("count", "dropped", "d", None),
)
SLOW_COLUMNS: Final[tuple[Column, ...]] = (
    ("service", "service", "s", None),
    ("request_id", "request", "d", None),
    ("outcome", "outcome", "s", None),
    ("worker", "last worker", "s", None),
    ("t_received", "received (UTC)", "time", None),
    ("latency", "latency", "ms", "exact times (ms)"),
    ("queue_wait", "queue wait", "ms", "exact times (ms)"),
    ("service_time", "service", "ms", "exact times (ms)"),
    ("redispatches", "redisp", "d", None),
)
PERCENTILE_NOTE: Final = (
    "p50/p95/p99 are nearest-rank percentiles counted in histograms of 1 %-wide log buckets: "
    "each is within 0.5 % of the exact one"
)
SLOWEST_NOTE: Final = "times exact, from each request's own record"


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


def _columns(report: Report, columns: Sequence[Column]) -> tuple[Column, ...]:
    """``columns``, led by the dialect when the report holds more than one."""
    return (DIALECT, *columns) if len(report.dialects) > 1 else tuple(columns)


def _rows(table: Sequence[dict[str, Any]], columns: Sequence[Column]) -> list[list[str]]:
    """Cells as text. In the services table a row without a service is a total: its service,
    and its dialect if it has none (the grand total of several dialects), read ``(all)``."""
    rows = []
    for row in table:
        total = "requests" in row and row.get("service") is None
        rows.append(
            [
                _cell(ALL if total and row.get(key) is None else row.get(key), kind)
                if key in ("service", "dialect")
                else _cell(row.get(key), kind)
                for key, _, kind, _ in columns
            ]
        )
    return rows


def _spans(columns: Sequence[Column]) -> list[tuple[str | None, int, int]]:
    """(group, first column, columns spanned), in order, for the group header row."""
    spans: list[tuple[str | None, int, int]] = []
    for index, (_, _, _, group) in enumerate(columns):
        if spans and spans[-1][0] == group and group is not None:
            name, first, count = spans[-1]
            spans[-1] = (name, first, count + 1)
        else:
            spans.append((group, index, 1))
    return spans


def _text_table(table: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    header = [title for _, title, _, _ in columns]
    body = _rows(table, columns)
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(columns))]
    spans = _spans(columns)
    for group, first, count in spans:  # a group's label fits above its columns
        if group is not None:
            spanned = sum(widths[first : first + count]) + 2 * (count - 1)
            widths[first + count - 1] += max(0, len(group) - spanned)
    left = [kind == "s" for _, _, kind, _ in columns]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if is_left else cell.rjust(width)
            for cell, width, is_left in zip(cells, widths, left, strict=True)
        ).rstrip()

    lines = [line(header), line(["-" * width for width in widths]), *map(line, body)]
    if any(group is not None for group, _, _ in spans):
        above = []
        for group, first, count in spans:
            spanned = sum(widths[first : first + count]) + 2 * (count - 1)
            above.append((group or "").center(spanned) if group else " " * spanned)
        lines.insert(0, "  ".join(above).rstrip())
    return "\n".join(lines)


def _dialects(report: Report) -> str:
    names = [str(name) if name is not None else "unknown" for name in report.dialects]
    return f"dialect{'s' if len(names) > 1 else ''} {', '.join(names)}"


def text(report: Report) -> str:
    """The report for a terminal (times in milliseconds)."""
    start, end = report.window
    split = len(report.dialects) > 1
    parts = [
        f"domo report: {when(start)} to {when(end)} ({end - start:.1f} s), "
        f"{report.services[-1]['requests']} requests from {report.files} files "
        f"({_dialects(report)})",
        "",
        "Services"
        + (" by dialect (each dialect's (all) row is its subtotal)" if split else "")
        + f" (req/s = completed per second over the window, peak over {report.bucket:g} s "
        "buckets)",
        _text_table(report.services, _columns(report, SERVICE_COLUMNS)),
        f"({PERCENTILE_NOTE})",
        "",
        "Workers (util = busy time / time registered within the window)",
        _text_table(report.workers, WORKER_COLUMNS) if report.workers else "(no dispatches)",
        "",
        "Drops by reason and the rule that decided them",
        _text_table(report.drops, _columns(report, DROP_COLUMNS)) if report.drops else "(none)",
        "",
        f"Slowest {len(report.slowest)} requests (by latency; {SLOWEST_NOTE})",
        _text_table(report.slowest, _columns(report, SLOW_COLUMNS)),
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


def _label(row: dict[str, Any], split: bool) -> str:
    return f"{row['service']} ({row['dialect']})" if split else str(row["service"])


def _plots(report: Report) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "path"  # text as outlines: no font needed to view it
    import matplotlib.pyplot as plt

    plots: list[tuple[str, str]] = []
    split = len(report.dialects) > 1
    services = [row for row in report.services if row["service"] is not None]
    start = report.window[0]
    buckets = max(1, math.ceil((report.window[1] - start) / report.bucket))
    offsets = [index * report.bucket for index in range(buckets)]

    # Throughput: one panel per dialect when there are several, each with its busiest services.
    panels: Any
    figure, panels = plt.subplots(
        len(report.dialects),
        1,
        figsize=(10, 3.6 * len(report.dialects)),
        squeeze=False,
        sharex=True,
    )
    for axes, dialect in zip(panels[:, 0], report.dialects, strict=True):
        mine = [row for row in services if row["dialect"] == dialect]
        busiest = [row["service"] for row in sorted(mine, key=lambda r: -r["requests"])[:10]]
        for name in busiest:
            rates = {
                round((row["start"] - start) / report.bucket): row["per_second"]
                for row in report.throughput
                if row["service"] == name and row["dialect"] == dialect
            }
            # A bucket with nothing completed is a 0 on the line, not a gap bridged over.
            axes.plot(offsets, [rates.get(index, 0.0) for index in range(buckets)], label=name)
        axes.set_ylabel("completed per second")
        if split:
            axes.set_title(f"dialect {dialect}", fontsize="medium", loc="left")
        if busiest:
            axes.legend(loc="best", fontsize="small")
        axes.grid(alpha=0.3)
    panels[-1, 0].set_xlabel(f"seconds since {when(start)} ({report.bucket:g} s buckets)")
    title = "Throughput over time (the 10 busiest services"
    plots.append((title + (" of each dialect)" if split else ")"), _svg(figure)))

    # Latency percentiles: the 10 busiest services of each dialect, grouped by dialect.
    shown = []
    for dialect in report.dialects:
        mine = [row for row in services if row["dialect"] == dialect]
        shown += sorted(mine, key=lambda r: -r["requests"])[:10]
    figure, axes = plt.subplots(figsize=(10, 0.5 + 0.45 * max(1, len(shown))))
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
    axes.set_yticks(range(len(shown)), [_label(row, split) for row in shown])
    axes.invert_yaxis()
    axes.set_xscale("log")  # p99 is often orders of magnitude above p50
    axes.set_xlabel("latency, ms (received to finished; log scale; from 1 % histograms)")
    axes.legend(loc="best", fontsize="small")
    axes.grid(alpha=0.3, axis="x")
    plots.append(
        (
            "Latency percentiles per service" + (", by dialect" if split else ""),
            _svg(figure),
        )
    )

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


def _html_table(
    table: Sequence[dict[str, Any]], columns: Sequence[Column], note: str | None = None
) -> str:
    if not table:
        return "<p>(none)</p>"
    spans = _spans(columns)
    groups = ""
    if any(group is not None for group, _, _ in spans):
        groups = (
            "<tr>"
            + "".join(
                f"<th colspan='{count}' class='group'>{html.escape(group)}</th>"
                if group is not None
                else f"<th colspan='{count}' class='blank'></th>"
                for group, _, count in spans
            )
            + "</tr>"
        )
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _, _ in columns)
    body = "".join(
        ("<tr class='total'>" if row.get("service") is None and "requests" in row else "<tr>")
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
        + "</tr>"
        for row, cells in zip(table, _rows(table, columns), strict=True)
    )
    caption = f"<caption>{html.escape(note)}</caption>" if note else ""
    return f"<table>{caption}<thead>{groups}<tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 1.5em; }
caption { caption-side: bottom; text-align: left; font-size: 0.9em; color: #555; padding: 0.3em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f0f0f0; } th.group { background: #e2e8f0; text-align: center; }
th.blank { background: none; border-top: none; border-left: none; }
tr.total td { font-weight: bold; background: #fafafa; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 0 0 2em 0; } svg { max-width: 100%; height: auto; }
.updated { color: #555; }
"""


def _head(title: str, refresh: float | None) -> str:
    reload = f"<meta http-equiv='refresh' content='{max(1, round(refresh))}'>" if refresh else ""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"{reload}<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
    )


def _updated(moment: float | None, refresh: float | None) -> str:
    if moment is None:
        return ""
    live = f"; rewritten every {refresh:g} s while domo report --follow runs" if refresh else ""
    return f"<p class='updated'>Last updated {html.escape(when(moment))}{live}.</p>"


def page(report: Report) -> str:
    """The report as one HTML page with its plots inline (SVG)."""
    start, end = report.window
    split = len(report.dialects) > 1
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
    services_title = "Services by dialect" if split else "Services"
    return (
        _head(f"domo report {when(start)}", report.refresh)
        + f"<body><h1>domo report</h1>{_updated(report.updated, report.refresh)}"
        f"<p>{html.escape(when(start))} to {html.escape(when(end))} "
        f"({end - start:.1f} s), {report.services[-1]['requests']} requests from "
        f"{report.files} files ({html.escape(_dialects(report))}). Times in milliseconds.</p>"
        f"<h2>{services_title}</h2>"
        + _html_table(report.services, _columns(report, SERVICE_COLUMNS), PERCENTILE_NOTE + ".")
        + figures
        + "<h2>Workers</h2>"
        + _html_table(report.workers, WORKER_COLUMNS)
        + "<h2>Drops by reason and the rule that decided them</h2>"
        + _html_table(report.drops, _columns(report, DROP_COLUMNS))
        + "<h2>Slowest requests</h2>"
        + _html_table(report.slowest, _columns(report, SLOW_COLUMNS), SLOWEST_NOTE.capitalize())
        + f"{skipped}</body></html>\n"
    )


def waiting_page(directory: Path, moment: float, refresh: float) -> str:
    """The live page before the first request record is there to report."""
    return (
        _head("domo report: waiting for traces", refresh)
        + f"<body><h1>domo report</h1>{_updated(moment, refresh)}"
        f"<p>No complete request trace file in {html.escape(str(directory))} yet: a broker "
        "closes a file at rotation or when it stops.</p></body></html>\n"
    )


# --- Parquet -------------------------------------------------------------------------------


def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    f64, i64, text_ = pa.float64(), pa.int64(), pa.string()
    dialect = ("dialect", text_)
    percentiles = [
        (f"{name}_p{p}", f64)
        for name in ("queue_wait", "service_time", "latency")
        for p in (50, 95, 99)
    ]
    return {
        "services": pa.schema(
            [
                dialect,
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
            [dialect, ("service", text_), ("start", f64), ("completed", i64), ("per_second", f64)]
        ),
        "drops": pa.schema(
            [dialect, ("service", text_), ("drop_reason", text_), ("rule", text_), ("count", i64)]
        ),
        "slowest": pa.schema(
            [
                dialect,
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

    In ``services``, a row whose service is null is a total: over every service of its dialect,
    or over everything where the dialect is null too (there is a row per dialect only when the
    traces hold several).
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
