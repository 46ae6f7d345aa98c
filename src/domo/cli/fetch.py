"""``domo fetch ID``: the reply to a durable request, if it has come; the exit code says."""

from __future__ import annotations

import argparse
import sys

import trio

from domo.titanic.trio import TitanicClient

from ._common import (
    EXIT_OK,
    EXIT_PENDING,
    EXIT_UNKNOWN,
    _positive_float,
    _prepare_curve_client,
    _subcommand,
)
from ._durable import add_client_options, request_id, with_titanic
from .call import _write_raw, _write_text


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "fetch",
        "print the reply to a durable request, if it has come",
        "Ask Titanic (`domo titanic`, 9/TSP) for the reply to the request `domo submit` "
        "stored as ID. If it has come, print its frames (one per line, as `domo call` does; "
        "--raw for the bytes) and exit 0; if not yet, exit 15 (fetch again later); if ID is "
        "unknown (never stored, closed, expired, or given up because its service never "
        "answered), exit 16. --wait SECONDS fetches again while it is pending. Fetching does "
        "not delete the reply: `domo close ID` does, or --close here once it is printed.",
        _fetch,
        "warning",
        _prepare_curve_client,
    )
    sub.add_argument(
        "request_id", metavar="ID", type=request_id, help="the id `domo submit` printed"
    )
    add_client_options(sub)
    sub.add_argument("--raw", action="store_true", help="write the reply's frames as raw bytes")
    sub.add_argument(
        "--wait",
        type=_positive_float,
        metavar="SECONDS",
        help="while the request is pending, fetch again (after 5 ms, doubling to 1 s) for up "
        "to SECONDS; exit 15 if it is still pending then (default: ask once)",
    )
    sub.add_argument(
        "--close", action="store_true", help="once the reply is printed, close the request"
    )


async def _fetch(args: argparse.Namespace) -> int:
    async def fetch(titanic: TitanicClient) -> int:
        fetched = await titanic.fetch(args.request_id)
        if fetched.pending and args.wait is not None:
            with trio.move_on_after(args.wait):
                fetched = await titanic.wait(args.request_id)
        if fetched.pending:
            print(f"domo fetch: {args.request_id} is pending: no reply yet", file=sys.stderr)
            return EXIT_PENDING
        if fetched.unknown:
            print(f"domo fetch: {args.request_id}: {fetched.text or 'unknown'}", file=sys.stderr)
            return EXIT_UNKNOWN
        body = fetched.reply()  # a handler's error reply raises RemoteError (exit 4)
        (_write_raw if args.raw else _write_text)(body)
        if args.close:
            await titanic.close(args.request_id)
        return EXIT_OK

    return await with_titanic(args, fetch)
