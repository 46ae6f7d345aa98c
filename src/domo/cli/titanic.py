"""``domo titanic``: the Titanic service (9/TSP, specs/tsp.md) on a broker, with its SQLite file.

It stores durable requests (``domo submit``), runs them through the broker when their service
has a worker, and keeps the replies for ``domo fetch``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial

import trio

from domo.protocol import WorkerConfig
from domo.titanic.protocol import TitanicConfig
from domo.titanic.server import serve_titanic
from domo.titanic.store import SYNCHRONOUS, SqliteStore, StoreError

from ._common import (
    EXIT_OK,
    EXIT_STORE,
    _add_connect_option,
    _add_heartbeat_options,
    _byte_size,
    _graceful_stop,
    _only_leaf,
    _positive_float,
    _positive_int,
    _subcommand,
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = TitanicConfig()
    worker = WorkerConfig()
    sub = _subcommand(
        commands,
        "titanic",
        "store requests on disk and run them later (9/TSP)",
        "Serve the Titanic services of 9/TSP (titanic.request, titanic.reply, titanic.close) "
        "at the broker: a request given to titanic.request (`domo submit`) is written to the "
        "SQLite file --db before its id is answered, sent to its service when a worker serves "
        "it, and its reply kept for titanic.reply (`domo fetch`) until titanic.close "
        "(`domo close`) or --reply-expiry. Requests survive a restart of anything: the "
        "broker, the workers, this process. Execution is at least once: a request in flight "
        "when something dies runs again. One Titanic per --db file. Prints 'domo titanic: "
        "serving ...' once ready; SIGINT or SIGTERM stops it (exit 0). specs/tsp.md has the "
        "rules.",
        _titanic,
        "info",
    )
    _add_connect_option(sub, several=True)
    sub.add_argument(
        "--db",
        required=True,
        metavar="FILE",
        help="the SQLite database file (made if missing; WAL mode, so FILE-wal sits beside it)",
    )
    sub.add_argument(
        "--synchronous",
        choices=SYNCHRONOUS,
        default="full",
        help="SQLite's synchronous setting: full (default): a stored request survives a power "
        "cut; normal: faster, a power cut may lose the last requests stored (a killed process "
        "loses nothing); off: for tests only",
    )
    sub.add_argument(
        "--max-db-bytes",
        type=_byte_size,
        metavar="BYTES",
        help="cap the database's size (e.g. 512M): past it, new requests are answered 500 "
        "until some are closed (default: no cap but the disk's)",
    )
    sub.add_argument(
        "--request-expiry",
        type=_positive_float,
        default=defaults.request_expiry,
        metavar="SECONDS",
        help="a request not answered this long after it was stored is given up (its service "
        "never came, or never answered); fetch then exits 16 (default: %(default)s)",
    )
    sub.add_argument(
        "--reply-expiry",
        type=_positive_float,
        default=defaults.reply_expiry,
        metavar="SECONDS",
        help="a reply nobody closed is deleted this long after it came (default: %(default)s)",
    )
    sub.add_argument(
        "--dispatch-timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="wait this long for a service's reply before trying the request again later "
        "(set it above your slowest request; default: %(default)s)",
    )
    sub.add_argument(
        "--retry-initial",
        type=_positive_float,
        default=defaults.retry_initial,
        metavar="SECONDS",
        help="after a dispatch that got no answer (or no worker), hold its service back this "
        "long, doubling at each failure in a row (default: %(default)s)",
    )
    sub.add_argument(
        "--retry-max",
        type=_positive_float,
        default=defaults.retry_max,
        metavar="SECONDS",
        help="the longest a service is held back (default: %(default)s)",
    )
    sub.add_argument(
        "--max-in-flight",
        type=_positive_int,
        default=defaults.max_in_flight,
        metavar="N",
        help="stored requests sent to services at once (default: %(default)s)",
    )
    sub.add_argument(
        "--concurrency",
        type=_positive_int,
        default=8,
        metavar="N",
        help="sessions per titanic.* service: requests to Titanic handled at once "
        "(default: %(default)s)",
    )
    _add_heartbeat_options(sub, worker.heartbeat_interval, worker.liveness)


async def _titanic(args: argparse.Namespace) -> int:
    try:
        config = TitanicConfig(
            request_expiry=args.request_expiry,
            reply_expiry=args.reply_expiry,
            max_in_flight=args.max_in_flight,
            retry_initial=args.retry_initial,
            retry_max=args.retry_max,
        )
    except ValueError as error:
        args.parser.error(str(error))
    try:
        store = SqliteStore(args.db, synchronous=args.synchronous, max_bytes=args.max_db_bytes)
    except StoreError as error:
        print(f"domo titanic: {error}", file=sys.stderr)
        return EXIT_STORE
    if args.log_level != "debug":  # 3 x --concurrency sessions: their connects are noise
        logging.getLogger("domo.worker").setLevel(logging.WARNING)
        logging.getLogger("domo.client").setLevel(logging.WARNING)
    endpoints = args.connects or [args.connect]
    worker_config = WorkerConfig(heartbeat_interval=args.heartbeat_interval, liveness=args.liveness)
    serve = partial(
        serve_titanic,
        endpoints,
        store,
        config=config,
        worker_config=worker_config,
        dispatch_timeout=args.dispatch_timeout,
        concurrency=args.concurrency,
    )
    try:
        counts = store.counts()
        async with _graceful_stop("titanic") as stop:
            with stop:
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve)
                    print(
                        f"domo titanic: serving titanic.request, titanic.reply, titanic.close at "
                        f"{', '.join(endpoints)}; {args.db}: {counts['pending']} pending, "
                        f"{counts['done']} done, {counts['failed']} given up",
                        flush=True,
                    )
                    await trio.sleep_forever()
    except BaseException as error:
        leaf = _only_leaf(error)
        if not isinstance(leaf, StoreError):
            raise
        print(f"domo titanic: {leaf}", file=sys.stderr)
        return EXIT_STORE
    finally:
        store.close()
    print("domo titanic: stopped", flush=True)
    return EXIT_OK
