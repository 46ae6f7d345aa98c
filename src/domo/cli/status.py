"""``domo status``: a running broker's services, workers and queues, read from its metrics."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Final

import trio

from ._common import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, _subcommand

# --- domo status ------------------------------------------------------------------------------

DEFAULT_METRICS: Final = "127.0.0.1:9100"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "status",
        "show a running broker's services, workers and queues",
        "Read the metrics of a broker started with --metrics HOST:PORT and print, per service, "
        "its idle and busy workers, the requests waiting in its queue, and the requests "
        "completed, expired and dropped so far; then the workers lost by reason and the "
        "protocol violations by rule. Requests for services no worker ever served count "
        "under '(none)'. Needs pip install '.[metrics]'.",
        _status,
        "warning",
    )
    sub.add_argument(
        "metrics",
        metavar="HOST:PORT|URL",
        nargs="?",
        default=DEFAULT_METRICS,
        help="the broker's --metrics address, or the full URL (default: %(default)s)",
    )
    sub.add_argument(
        "--json", action="store_true", help="print the status as one JSON object instead"
    )


async def _status(args: argparse.Namespace) -> int:
    try:
        from domo.metrics import read_status
    except ImportError:
        print(
            "domo status: needs prometheus-client: pip install '.[metrics]' in domo's source "
            "directory",
            file=sys.stderr,
        )
        return EXIT_USAGE
    target = args.metrics
    url = target if "://" in target else f"http://{target}/metrics"
    try:
        status = await trio.to_thread.run_sync(read_status, url)
    except (OSError, ValueError) as error:
        print(f"domo status: cannot read {url}: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(dataclasses.asdict(status)), flush=True)
        return EXIT_OK
    header = ("service", "idle", "busy", "queued", "completed", "expired", "dropped")
    rows = [
        (s.name, s.idle, s.busy, s.queued, s.completed, s.expired, s.dropped)
        for s in sorted(status.services.values(), key=lambda s: s.name)
        if (s.idle, s.busy, s.queued, s.completed, s.expired, s.dropped) != (0,) * 6
    ]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [str(cell).ljust(w) if i == 0 else str(cell).rjust(w) for i, (cell, w) in
                 enumerate(zip(row, widths, strict=True))]  # fmt: skip
        print("  ".join(cells).rstrip())
    if not rows:
        print("(no service has workers or requests)")
    losses = ", ".join(f"{reason} {n}" for reason, n in sorted(status.worker_losses.items()))
    violations = ", ".join(f"{rule} {n}" for rule, n in sorted(status.violations.items()))
    print(f"workers lost: {losses or 'none'}")
    if status.limits:  # a broker with the byte bounds (MDP-D-26)
        refused = ", ".join(f"{rule} {n}" for rule, n in sorted(status.refused.items()))
        held, limit = status.held_bytes, status.limits.get("held", 0)
        print(f"request bytes held: {held} of {limit}; refused: {refused or 'none'}")
    print(f"violations: {violations or 'none'}", flush=True)
    if status.pair:  # a broker of a Binary Star pair (specs/binary-star.md)
        pair = status.pair
        print(f"pair: {pair.get('role')}, {pair.get('state')} ({pair.get('serving')})", flush=True)
    return EXIT_OK
