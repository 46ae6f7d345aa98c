"""What ``domo submit``, ``domo fetch`` and ``domo close`` share: their options, their client,
and how a failure becomes a line on stderr and an exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from domo.runtime.errors import RemoteError, RequestError, RequestTimeout
from domo.titanic.client import TitanicError
from domo.titanic.trio import TitanicClient
from domo.trio import Client

from ._common import (
    EXIT_REMOTE_ERROR,
    EXIT_TIMEOUT,
    _add_connect_option,
    _add_curve_client_options,
    _count,
    _positive_float,
)

T = TypeVar("T")


def add_client_options(sub: argparse.ArgumentParser) -> None:
    _add_connect_option(sub, several=True)
    sub.add_argument(
        "--timeout",
        type=_positive_float,
        default=2.5,
        metavar="SECONDS",
        help="wait this long for Titanic's answer before asking again (default: %(default)s)",
    )
    sub.add_argument(
        "--retries",
        type=_count,
        default=3,
        metavar="N",
        help="times to ask again before giving up with exit code 3 (default: %(default)s)",
    )
    _add_curve_client_options(sub)


async def with_titanic(
    args: argparse.Namespace, use: Callable[[TitanicClient], Awaitable[int]]
) -> int:
    """Run ``use`` with a ``TitanicClient`` on the brokers of ``args``; failures as exit codes."""
    endpoints = args.connects or [args.connect]
    command = args.parser.prog.rsplit(" ", 1)[-1]
    try:
        async with Client(
            endpoints, timeout=args.timeout, retries=args.retries, curve=args.curve
        ) as client:
            return await use(TitanicClient(client))
    except RemoteError as error:  # the service's own answer was an error (MDP-D-23)
        print(
            f"domo {command}: the worker failed: {error.error_type}: {error.message}",
            file=sys.stderr,
        )
        return EXIT_REMOTE_ERROR
    except TitanicError as error:
        print(f"domo {command}: {error}", file=sys.stderr)
        return EXIT_REMOTE_ERROR
    except RequestTimeout:
        print(
            f"domo {command}: no answer from Titanic at {', '.join(endpoints)} within "
            f"{args.timeout:g} s, {args.retries + 1} attempt(s): is `domo titanic` running on "
            "this broker?",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    except RequestError as error:
        print(f"domo {command}: {error}", file=sys.stderr)
        return EXIT_TIMEOUT


def request_id(text: str) -> str:
    """An argparse type: a request id as ``domo submit`` printed it."""
    from domo.titanic.protocol import is_request_id

    if not is_request_id(text.encode("ascii", "replace")):
        raise argparse.ArgumentTypeError(
            f"not a request id (32 characters 0-9, a-z, as `domo submit` prints): {text!r}"
        )
    return text
