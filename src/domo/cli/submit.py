"""``domo submit SERVICE [BODY ...]``: store a durable request with Titanic; print its id."""

from __future__ import annotations

import argparse
import sys

from domo.titanic.client import TitanicError
from domo.titanic.protocol import UNKNOWN
from domo.titanic.trio import TitanicClient

from ._common import EXIT_OK, EXIT_UNKNOWN, _service, _subcommand
from ._durable import add_client_options, with_titanic
from .call import _prepare_call


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "submit",
        "store a durable request with Titanic; print its id",
        "Give a request for SERVICE to the Titanic service (`domo titanic`, 9/TSP): it is "
        "written to Titanic's disk before the id is printed, then sent to SERVICE when a "
        "worker serves it, even if the broker, the worker or Titanic restart meanwhile. "
        "Fetch the reply later with `domo fetch ID`, and forget it with `domo close ID`. "
        "Each BODY argument is one frame; '-' is stdin, read whole, as one frame; no BODY "
        "sends one empty frame.",
        _submit,
        "warning",
        _prepare_call,  # the same BODY frames as `domo call` ('-': stdin), the same CURVE
    )
    sub.add_argument("service", metavar="SERVICE", type=_service, help="the target service")
    sub.add_argument(
        "body", metavar="BODY", nargs="*", default=[], help="one request frame each ('-': stdin)"
    )
    add_client_options(sub)


async def _submit(args: argparse.Namespace) -> int:
    async def submit(titanic: TitanicClient) -> int:
        try:
            request_id = await titanic.submit(args.service, *args.frames)
        except TitanicError as error:
            if error.status == UNKNOWN:  # refused as malformed: sending it again won't help
                print(f"domo submit: {error}", file=sys.stderr)
                return EXIT_UNKNOWN
            raise
        print(request_id, flush=True)
        return EXIT_OK

    return await with_titanic(args, submit)
