"""The ``domo`` command: run a broker, serve a service, send one request, or run a demo.

``domo broker``, ``domo worker SERVICE``, ``domo call SERVICE [BODY ...]`` and ``domo demo``
are thin shells over ``domo.trio`` (``serve_broker``, ``run_worker``, ``Client``); every protocol
decision stays in the core. ``domo COMMAND --help`` documents each; ``docs/cli.md`` has the full
reference. Exit codes are the ``EXIT_*`` constants (``_common.py``, and the epilog of each
``--help``).

SIGINT and SIGTERM stop a broker, worker or demo gracefully (the broker sends DISCONNECT to its
workers, a worker sends DISCONNECT to its broker) and exit 0: a requested stop is not a failure.
Expected failures (an address in use, no reply in time, a handler error) print one line to
stderr and exit with their code; only a bug prints a traceback.

One module per command (``broker``, ``worker``, ``call``, ``demo``, ``bench``, ``fuzz``,
``status``, ``report``, ``keygen``; Titanic's ``titanic``, ``submit``, ``fetch``, ``close``, the
last three sharing ``_durable``): each adds its subparser (``add_parser``-style ``_add_*``) and
runs it. What several commands share (exit codes, option types, environment defaults, endpoint
checks, signal handling) is in ``_common.py``; the load that ``demo`` and ``bench`` drive is in
``_load.py``. The ``--exec`` handler is a library module, ``domo.trio.command``.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Sequence

import trio

from domo import eventlog

from . import (
    bench,
    broker,
    call,
    close,
    demo,
    fetch,
    fuzz,
    keygen,
    report,
    status,
    submit,
    titanic,
    worker,
)
from ._common import (
    EXIT_CODES as EXIT_CODES,  # each command's exit code table, for tests and docs
)
from ._common import (
    EXIT_ENDPOINT,
    EXIT_ERROR,
    EXIT_FAILED_REQUESTS,
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_REMOTE_ERROR,
    EXIT_STORE,
    EXIT_TIMEOUT,
    EXIT_UNKNOWN,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    _exit_code_for,
    _exit_codes_help,
    _only_leaf,
    _paragraph,
    _version_text,
)

__all__ = [
    "EXIT_ENDPOINT",
    "EXIT_ERROR",
    "EXIT_FAILED_REQUESTS",
    "EXIT_FINDINGS",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PENDING",
    "EXIT_REMOTE_ERROR",
    "EXIT_STORE",
    "EXIT_TIMEOUT",
    "EXIT_UNKNOWN",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "build_parser",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``domo`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:  # no COMMAND (fuzz's --exec is `args.command`)
        parser.print_help()
        return EXIT_OK
    if args.prepare is not None:
        args.prepare(args)  # checks that need more than one option; exits 2 on a bad one
    eventlog.configure(args.log_level, args.log_format)
    command: Callable[[argparse.Namespace], Awaitable[int]] = args.run
    try:
        return trio.run(command, args)
    except BaseException as error:
        # The subcommand's name from its parser: fuzz's --exec is stored as ``args.command``.
        return _exit_code_for(args.parser.prog.rsplit(" ", 1)[-1], _only_leaf(error))


# --- the parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``domo`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="domo",
        description=_paragraph(
            "domo: the Majordomo Protocol MDP/0.2 (ZeroMQ RFC 18) broker, worker and client. "
            "Try `domo demo`, then `domo COMMAND --help`."
        ),
        epilog=_exit_codes_help("domo"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version_text())
    # Not required: bare `domo` prints this help and exits 0 (main), a newcomer's first try.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands_in_order = (broker, worker, call, demo, bench, fuzz, status, report, keygen)
    durable = (titanic, submit, fetch, close)  # 9/TSP: specs/tsp.md
    for command in (*commands_in_order, *durable):
        command.add_parser(commands)
    return parser
