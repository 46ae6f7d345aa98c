"""``domo close ID``: Titanic forgets a durable request and its reply."""

from __future__ import annotations

import argparse

from domo.titanic.trio import TitanicClient

from ._common import EXIT_OK, _prepare_curve_client, _subcommand
from ._durable import add_client_options, request_id, with_titanic


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "close",
        "forget a durable request and its reply",
        "Tell Titanic (`domo titanic`, 9/TSP) that the reply to ID is no longer wanted: the "
        "request and its reply are deleted from its disk. Closing an unknown ID succeeds too "
        "(it is idempotent). A request still running is not recalled; its reply is dropped.",
        _close,
        "warning",
        _prepare_curve_client,
    )
    sub.add_argument(
        "request_id", metavar="ID", type=request_id, help="the id `domo submit` printed"
    )
    add_client_options(sub)


async def _close(args: argparse.Namespace) -> int:
    async def close(titanic: TitanicClient) -> int:
        await titanic.close(args.request_id)
        return EXIT_OK

    return await with_titanic(args, close)
