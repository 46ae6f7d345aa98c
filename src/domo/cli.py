"""The ``domo`` command: run a broker, serve a service, send one request, or run a demo.

``domo broker``, ``domo worker SERVICE``, ``domo call SERVICE [BODY ...]`` and ``domo demo``
are thin shells over ``domo.trio`` (``serve_broker``, ``run_worker``, ``Client``); every protocol
decision stays in the core. ``domo COMMAND --help`` documents each; ``docs/cli.md`` has the full
reference. Exit codes are the ``EXIT_*`` constants below (and the epilog of ``domo --help``).

SIGINT and SIGTERM stop a broker, worker or demo gracefully (the broker sends DISCONNECT to its
workers, a worker sends DISCONNECT to its broker) and exit 0: a requested stop is not a failure.
Expected failures (an address in use, no reply in time, a handler error) print one line to
stderr and exit with their code; only a bug prints a traceback.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import itertools
import json
import logging
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import trio
import zmq

from domo import __version__, eventlog
from domo import report as trace_report
from domo.curve import (
    AllowList,
    CurveClient,
    CurveError,
    CurveServer,
    KeyPair,
    load_keypair,
    load_public_key,
    write_keypair,
)
from domo.endpoints import EndpointError, check_endpoint
from domo.protocol import BrokerConfig, WorkerConfig, mdp
from domo.protocol.events import (
    BrokerEvent,
    ProtocolViolation,
    ReconnectRequired,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    WorkerConnected,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from domo.runtime import memory
from domo.trio import (
    Client,
    Handler,
    RemoteError,
    RequestError,
    RequestTimeout,
    ZmqTransport,
    run_worker,
    serve_broker,
)
from domo.trio.errors import error_body

__all__ = [
    "EXIT_ENDPOINT",
    "EXIT_ERROR",
    "EXIT_FAILED_REQUESTS",
    "EXIT_FINDINGS",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REMOTE_ERROR",
    "EXIT_TIMEOUT",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

logger = logging.getLogger("domo.cli")

EXIT_OK: Final = 0  # success, or a broker/worker/demo stopped by SIGINT or SIGTERM
EXIT_ERROR: Final = 1  # an unexpected error (a bug: a traceback is printed)
EXIT_USAGE: Final = 2  # bad command line (argparse's own code)
EXIT_TIMEOUT: Final = 3  # call: no FINAL in time after every retry
EXIT_REMOTE_ERROR: Final = 4  # call: the worker's handler failed (MDP-D-23 error reply)
EXIT_ENDPOINT: Final = 5  # an endpoint could not be bound or connected
EXIT_NOT_FOUND: Final = 6  # call mmi.*, bench: the broker says no worker serves it (404, 501)
EXIT_FINDINGS: Final = 7  # fuzz: the target broke at least one rule
EXIT_FAILED_REQUESTS: Final = 8  # demo, bench: some requests failed or got a wrong reply
EXIT_UNREACHABLE: Final = 9  # bench, fuzz: the peer to test never answered (not there?)
EXIT_INTERRUPTED: Final = 130  # call: stopped by SIGINT (128 + 2, the shell's convention)

DEFAULT_ENDPOINT: Final = "tcp://127.0.0.1:5555"
T = TypeVar("T")

# What each command's exit codes mean, for its --help: a command lists only its own.
_STOPPED = "stopped by SIGINT or SIGTERM (a requested stop is not a failure)"
_BUG = "unexpected error: a bug (a traceback is printed)"
_ENDPOINT_FAILED = "an endpoint could not be bound or connected (address in use, bad address)"
EXIT_CODES: Final[dict[str, list[tuple[int, str]]]] = {
    "domo": [
        (EXIT_OK, "success (each command's --help lists its own exit codes)"),
        (EXIT_USAGE, "usage error: bad arguments or options"),
    ],
    "broker": [
        (EXIT_OK, _STOPPED),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_ENDPOINT, _ENDPOINT_FAILED),
    ],
    "worker": [
        (EXIT_OK, _STOPPED),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_ENDPOINT, _ENDPOINT_FAILED),
    ],
    "call": [
        (EXIT_OK, "the FINAL arrived (and for mmi.*: the broker answered 200)"),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (
            EXIT_TIMEOUT,
            "no reply in time after every retry (broker down, no worker, or the "
            "work takes longer than --timeout)",
        ),
        (EXIT_REMOTE_ERROR, "the worker's handler failed (its error type and message on stderr)"),
        (EXIT_ENDPOINT, _ENDPOINT_FAILED),
        (EXIT_NOT_FOUND, "mmi.*: the broker answered 404 (no worker for the service) or 501"),
        (EXIT_INTERRUPTED, "stopped by SIGINT (Ctrl-C); 143 by SIGTERM"),
    ],
    "demo": [
        (EXIT_OK, "every request answered with its own body; or stopped by SIGINT/SIGTERM"),
        (EXIT_FAILED_REQUESTS, "some requests were not answered, or answered wrongly"),
        (EXIT_USAGE, "usage error: bad arguments or options"),
    ],
    "bench": [
        (EXIT_OK, "every request answered with its own body; or stopped by SIGINT/SIGTERM"),
        (EXIT_FAILED_REQUESTS, "some requests were not answered, or answered wrongly"),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_ENDPOINT, _ENDPOINT_FAILED),
        (EXIT_NOT_FOUND, "the service has no worker (the broker's mmi.service answer)"),
        (EXIT_UNREACHABLE, "no broker answered, or no request was answered at all"),
    ],
    "status": [
        (EXIT_OK, "the broker's state was printed"),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options; or prometheus-client missing"),
        (EXIT_UNREACHABLE, "the metrics could not be read (no broker with --metrics there?)"),
    ],
    "keygen": [
        (EXIT_OK, "the key pair was written"),
        (EXIT_ERROR, _BUG),
        (
            EXIT_USAGE,
            "usage error: bad arguments, or a key file exists already (never overwritten) or "
            "cannot be written",
        ),
    ],
    "fuzz": [
        (EXIT_OK, "no rule broken"),
        (EXIT_FINDINGS, "the target broke at least one rule"),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_ENDPOINT, _ENDPOINT_FAILED + "; or an --exec command that cannot be started"),
        (EXIT_UNREACHABLE, "the target is unreachable"),
    ],
    "report": list(trace_report.EXIT_CODES),
}


def _exit_codes_help(command: str) -> str:
    """The exit code table of ``command`` for its --help epilog."""
    lines = ["exit codes:"]
    for code, meaning in EXIT_CODES[command]:
        wrapped = textwrap.wrap(meaning, width=72)
        lines.append(f"  {code:<4} {wrapped[0]}")
        lines.extend(f"       {more}" for more in wrapped[1:])
    return "\n".join(lines) + "\n"


BIND_SCHEMES: Final = ("tcp", "ipc", "inproc")
CONNECT_SCHEMES: Final = ("tcp", "ipc")  # inproc reaches only sockets of the same process
FUZZ_TARGETS: Final = ("broker", "worker", "client")  # domo.fuzz.TARGETS, without Hypothesis
FUZZ_DIALECTS: Final = ("mdp02", "mdp01", "majortomo")  # domo.fuzz.dialect.DIALECTS


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


def _only_leaf(error: BaseException) -> BaseException:
    """The one exception inside (nested) groups of one, or ``error`` itself."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _exit_code_for(command: str, error: BaseException) -> int:
    """Report an expected failure in one line; re-raise anything else (a bug)."""
    if isinstance(error, KeyboardInterrupt):  # SIGINT before a signal receiver was set up
        return EXIT_INTERRUPTED if command == "call" else EXIT_OK
    if isinstance(error, zmq.ZMQError):
        print(f"domo {command}: endpoint error: {error}", file=sys.stderr)
        return EXIT_ENDPOINT
    raise error


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
    _add_broker(commands)
    _add_worker(commands)
    _add_call(commands)
    _add_demo(commands)
    _add_bench(commands)
    _add_fuzz(commands)
    _add_status(commands)
    _add_report(commands)
    _add_keygen(commands)
    return parser


def _paragraph(text: str) -> str:
    """``text`` wrapped for ``--help`` (the formatter keeps it as is, for the exit code table)."""
    return textwrap.fill(text, width=79)


def _version_text() -> str:
    return (
        f"domo {__version__} (MDP/0.2; Python {platform.python_version()}, trio "
        f"{trio.__version__}, pyzmq {zmq.pyzmq_version()}, libzmq {zmq.zmq_version()})"
    )


def _subcommand(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
    run: Callable[[argparse.Namespace], Awaitable[int]],
    log_level: str,
    prepare: Callable[[argparse.Namespace], None] | None = None,
) -> argparse.ArgumentParser:
    sub = commands.add_parser(
        name,
        help=summary,
        description=_paragraph(description),
        epilog=_exit_codes_help(name),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.set_defaults(run=run, prepare=prepare, parser=sub)
    sub.add_argument(
        "--log-level",
        default=log_level,
        choices=["debug", "info", "warning", "error"],
        help=f"what to log on stderr (default: {log_level}; debug shows every request)",
    )
    sub.add_argument(
        "--log-format",
        default="text",
        choices=list(eventlog.LOG_FORMATS),
        help="log lines for people (text: wall-clock time, level, one sentence per event) or "
        "one JSON object per line for machines (default: %(default)s)",
    )
    return sub


class _AppendDistinctEndpoint(argparse.Action):
    """``--bind``, repeatable: each endpoint once. The same endpoint twice would be an address
    in use for tcp:// and inproc://, but a second ipc:// bind silently takes the path over from
    the first socket. A port the system picks (``:0``, ``:*``) may be asked for again."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, str)
        given: list[str] = list(getattr(namespace, self.dest, None) or [])
        if values in given and not values.endswith((":0", ":*")):
            raise argparse.ArgumentError(self, f"{values} is given twice")
        setattr(namespace, self.dest, [*given, values])


def _add_broker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = BrokerConfig()
    sub = _subcommand(
        commands,
        "broker",
        "run an MDP/0.2 broker",
        "Run an MDP/0.2 broker: one ROUTER socket per --bind endpoint (give --bind several "
        "times for several), for clients and workers alike; a client on one endpoint is served "
        "by workers on any. Prints each bound endpoint on stdout ('domo broker: listening on "
        "ENDPOINT'), then logs workers coming and going on stderr. SIGINT or SIGTERM stops it: "
        "every worker is sent DISCONNECT, and it exits 0.",
        _broker,
        "info",
        _prepare_broker,
    )
    sub.add_argument(
        "--bind",
        action=_AppendDistinctEndpoint,
        metavar="ENDPOINT",
        type=partial(_endpoint, BIND_SCHEMES),
        help=f"endpoint to bind, one socket each; repeat for several (tcp://, ipc://, "
        f"inproc://); a tcp port of 0 picks a free one (default: {DEFAULT_ENDPOINT})",
    )
    _add_heartbeat_options(sub, defaults.heartbeat_interval, defaults.liveness)
    sub.add_argument(
        "--request-expiry",
        type=_positive_float,
        default=defaults.request_expiry,
        metavar="SECONDS",
        help="a request waiting this long for a worker is dropped (default: %(default)s)",
    )
    sub.add_argument(
        "--max-redispatches",
        type=_count,
        default=defaults.max_redispatches,
        metavar="N",
        help="times a request goes back to its queue after its worker was lost, before it is "
        "dropped (default: %(default)s)",
    )
    _add_memory_bounds(sub, defaults)
    sub.add_argument(
        "--trace-dir",
        metavar="DIR",
        help="write one Parquet trace record per request and per worker change into DIR "
        "(needs pip install '.[trace]' in domo's source directory; schema in docs/traces.md)",
    )
    sub.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        type=_metrics_address,
        help="serve Prometheus metrics over HTTP at http://HOST:PORT/metrics (port 0 picks a "
        "free one; needs pip install '.[metrics]'); `domo status` reads them",
    )
    sub.add_argument(
        "--curve-secret-file",
        metavar="FILE",
        help="require CURVE (encryption and authentication, docs/security.md) with the broker's "
        "key pair from FILE (a NAME.key_secret made by `domo keygen NAME`)",
    )
    sub.add_argument(
        "--curve-allow-file",
        metavar="FILE",
        help="with --curve-secret-file: admit only the client and worker public keys listed "
        "in FILE, one per line ('#' starts a comment); SIGHUP re-reads it. Without it, any "
        "peer that knows the broker's public key may connect (encrypted)",
    )


def _add_memory_bounds(sub: argparse.ArgumentParser, defaults: BrokerConfig) -> None:
    """The broker's byte bounds (specs/mdp-0.2.md, MDP-D-25 to MDP-D-27; docs/reliability.md)."""
    mib = 1024 * 1024
    sub.add_argument(
        "--max-message-bytes",
        type=_byte_size,
        default=defaults.max_message_bytes,
        metavar="SIZE",
        help="the largest request or reply body; a larger request is refused, a larger reply "
        f"ends its request (default: {defaults.max_message_bytes // mib}MiB)",
    )
    sub.add_argument(
        "--max-held-bytes",
        type=_byte_size,
        default=defaults.max_held_bytes,
        metavar="SIZE",
        help="the request bodies held at once, all clients together; a request that would go "
        f"over is refused (default: {defaults.max_held_bytes // mib}MiB)",
    )
    sub.add_argument(
        "--max-peer-bytes",
        type=_byte_size,
        default=defaults.max_peer_bytes,
        metavar="SIZE",
        help="what one peer's pipe may hold each way: its high-water mark is this over "
        "--max-message-bytes messages; a client that does not read its replies is dropped at "
        f"that mark (default: {defaults.max_peer_bytes // mib}MiB)",
    )


def _add_curve_client_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--curve-server-key",
        metavar="KEY",
        help="connect with CURVE (docs/security.md) to a broker with this public key: its 40 "
        "Z85 characters, or the path of its NAME.key file",
    )
    sub.add_argument(
        "--curve-secret-file",
        metavar="FILE",
        help="with --curve-server-key: this peer's own key pair (a NAME.key_secret made by "
        "`domo keygen NAME`), whose public key the broker's allow-list must hold; without it "
        "a new key pair is made for each run",
    )


def _add_keygen(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "keygen",
        "write a CURVE key pair for a broker, worker or client",
        "Write a new CURVE key pair as NAME.key (the public key, to hand out) and "
        "NAME.key_secret (both keys, mode 0600, to keep) in --dir, in ZeroMQ's certificate "
        "format, and print the public key. A broker takes its NAME.key_secret with "
        "--curve-secret-file and lists the public keys it admits in --curve-allow-file; "
        "workers and clients take the broker's public key with --curve-server-key and their "
        "own NAME.key_secret with --curve-secret-file. Existing files are never overwritten.",
        _keygen,
        "warning",
    )
    sub.add_argument("name", metavar="NAME", help="the base name of the two key files")
    sub.add_argument(
        "--dir", default=".", metavar="DIR", help="where to write them (default: %(default)s)"
    )


def _add_worker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = WorkerConfig()
    sub = _subcommand(
        commands,
        "worker",
        "serve a service: the built-in echo, or any command",
        "Serve SERVICE at a broker. Without --exec, only 'echo' is built in: it replies with "
        "the request body, frame for frame. With --exec CMD, each request runs CMD (split "
        "like a shell would, but run without one) with the request body on stdin: a one-frame "
        "body exactly as sent; several frames concatenated, their sizes in bytes in "
        "DOMO_FRAME_SIZES (comma-separated) so CMD can split them; DOMO_SERVICE names the "
        "service. CMD's stdout is the reply (one frame). If CMD exits non-zero or runs past "
        "--exec-timeout (then it is killed), the reply is domo's error reply (MDP-D-23) with "
        "the exit status and the tail of its stderr: `domo call` exits 4 on it. SIGINT or "
        "SIGTERM stops the worker: it sends DISCONNECT and exits 0.",
        _worker,
        "info",
        _prepare_worker,
    )
    sub.add_argument("service", metavar="SERVICE", type=_service, help="the service name")
    _add_connect_option(sub, several=True)
    sub.add_argument(
        "--concurrency",
        type=_positive_int,
        default=1,
        metavar="N",
        help="requests served at a time, each on its own connection (default: %(default)s)",
    )
    sub.add_argument(
        "--exec", dest="exec_command", metavar="CMD", help="serve SERVICE by running CMD"
    )
    sub.add_argument(
        "--exec-timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="kill CMD after this long and reply with an error (default: %(default)s)",
    )
    _add_heartbeat_options(sub, defaults.heartbeat_interval, defaults.liveness)
    _add_curve_client_options(sub)


def _add_call(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "call",
        "send one request and print the replies",
        "Send one request to SERVICE and print each PARTIAL reply as it arrives, then the "
        "FINAL. Each BODY argument is one frame; '-' is stdin, read whole, as one frame; no "
        "BODY sends one empty frame. Each reply frame is printed on its own line: as text if "
        "it is UTF-8 without control characters (a trailing newline is not doubled), else as a "
        "Python bytes literal; --raw writes the bytes as they are instead. Options go before "
        "SERVICE or after the last BODY; '--' ends the options, for a BODY starting with '-'. "
        "`domo call mmi.service NAME` asks the broker whether NAME has a worker (200 or 404).",
        _call,
        "warning",
        _prepare_call,
    )
    sub.add_argument("service", metavar="SERVICE", type=_service, help="the service name")
    sub.add_argument(
        "body", metavar="BODY", nargs="*", default=[], help="one request frame each ('-': stdin)"
    )
    _add_connect_option(sub, several=True)
    sub.add_argument(
        "--timeout",
        type=_positive_float,
        default=2.5,
        metavar="SECONDS",
        help="wait this long for a reply before resending on a new socket (default: %(default)s)",
    )
    sub.add_argument(
        "--retries",
        type=_count,
        default=3,
        metavar="N",
        help="resends before giving up with exit code 3 (default: %(default)s)",
    )
    sub.add_argument(
        "--repeat",
        type=_count,
        default=1,
        metavar="N",
        help="send the request N times, each after the FINAL (or failure) of the one before; "
        "0: until stopped. A failed request is reported and the next one sent; the exit code "
        "is that of the last failure (default: %(default)s)",
    )
    output = sub.add_mutually_exclusive_group()
    output.add_argument(
        "--raw",
        action="store_true",
        help="write reply frames to stdout as raw bytes, nothing added",
    )
    output.add_argument(
        "--json",
        action="store_true",
        help='write each reply as one JSON line: {"reply": "partial" or "final", "frames": '
        '[...], "encoding": "utf-8" or "base64"} (base64 when a frame is not UTF-8)',
    )
    _add_curve_client_options(sub)


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "demo",
        "a broker, echo workers and clients in one process, with numbers",
        "Run a broker, --workers echo workers and --clients clients in this process, over "
        "inproc:// (or --endpoint), send --requests requests (or for --duration seconds), "
        "check every reply, and print the throughput and the p50/p99 latency. SIGINT stops it "
        "early and prints what was done.",
        _demo,
        "warning",
    )
    sub.add_argument(
        "--workers",
        type=_positive_int,
        default=2,
        metavar="N",
        help="echo workers (default: %(default)s)",
    )
    sub.add_argument(
        "--clients",
        type=_positive_int,
        default=4,
        metavar="N",
        help="clients, each sending one request at a time (default: %(default)s)",
    )
    amount = sub.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests",
        type=_positive_int,
        default=5000,
        metavar="N",
        help="requests in all (default: %(default)s)",
    )
    amount.add_argument(
        "--duration",
        type=_positive_float,
        metavar="SECONDS",
        help="send requests for this long instead of a fixed number",
    )
    sub.add_argument(
        "--endpoint",
        type=partial(_endpoint, BIND_SCHEMES),
        default="inproc://domo-demo",
        help="where the broker binds (default: %(default)s)",
    )
    sub.add_argument(
        "--json",
        action="store_true",
        help="print the figures as one JSON object on stdout instead of lines for people",
    )


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "bench",
        "load a running broker and its workers, with numbers",
        "Send requests of --size bytes to SERVICE at a running broker from --clients clients "
        "(each one request at a time, so --clients requests are in flight), --requests of them "
        "or for --duration seconds, and print the throughput and the p50/p99 latency. With the "
        "built-in echo service (`domo worker echo`) every reply is checked against its request. "
        "It first asks the broker whether SERVICE has a worker (mmi.service) and stops at once "
        "if not; on a terminal it shows progress on stderr; a load that gets no reply for "
        "longer than every retry takes stops early and says so.",
        _bench,
        "warning",
    )
    sub.add_argument(
        "service",
        metavar="SERVICE",
        type=_service,
        nargs="?",
        default="echo",
        help="the service to load (default: %(default)s)",
    )
    _add_connect_option(sub)
    sub.add_argument(
        "--clients",
        type=_positive_int,
        default=8,
        metavar="N",
        help="clients, each sending one request at a time (default: %(default)s)",
    )
    amount = sub.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests",
        type=_positive_int,
        default=10000,
        metavar="N",
        help="requests in all (default: %(default)s)",
    )
    amount.add_argument(
        "--duration",
        type=_positive_float,
        metavar="SECONDS",
        help="send requests for this long instead of a fixed number",
    )
    sub.add_argument(
        "--size",
        type=_count,
        default=16,
        metavar="BYTES",
        help="request body size (default: %(default)s)",
    )
    sub.add_argument(
        "--timeout",
        type=_positive_float,
        default=2.5,
        metavar="SECONDS",
        help="wait this long for a reply before resending on a new socket (default: %(default)s)",
    )
    sub.add_argument(
        "--retries",
        type=_count,
        default=3,
        metavar="N",
        help="resends before a request counts as failed (default: %(default)s)",
    )
    sub.add_argument(
        "--json",
        action="store_true",
        help="print the figures as one JSON object on stdout instead of lines for people",
    )


class _FromEnvironment(str):
    """An option's default taken from an environment variable (``ENV_DEFAULTS``).

    argparse converts a string default with the option's type when the option is not given,
    so a bad value is a usage error; ``_or_env`` names the variable in it.
    """

    variable: str

    def __new__(cls, value: str, variable: str) -> _FromEnvironment:
        text = super().__new__(cls, value)
        text.variable = variable
        return text


# Environment variables that set an option's default, so every process of a deployment (broker,
# workers, callers) can share one setting; an option on the command line wins.
ENV_DEFAULTS: Final = {
    "--connect": "DOMO_ENDPOINT",
    "--heartbeat-interval": "DOMO_HEARTBEAT_INTERVAL",
    "--liveness": "DOMO_LIVENESS",
}


def _env_default(option: str, fallback: object) -> object:
    """The default of ``option``: its environment variable's value if set, else ``fallback``."""
    variable = ENV_DEFAULTS[option]
    value = os.environ.get(variable)
    return fallback if value is None else _FromEnvironment(value, variable)


def _env_help(option: str) -> str:
    return f"; or set {ENV_DEFAULTS[option]}"


def _or_env(convert: Callable[[str], T]) -> Callable[[str], T]:
    """``convert``, with the environment variable named when a default from it is bad."""

    def converted(text: str) -> T:
        try:
            return convert(text)
        except argparse.ArgumentTypeError as error:
            if isinstance(text, _FromEnvironment):
                raise argparse.ArgumentTypeError(f"{error} (from {text.variable})") from None
            raise

    return converted


def _add_connect_option(sub: argparse.ArgumentParser, *, several: bool = False) -> None:
    """``--connect``; with ``several``, it may be repeated: brokers in failover order, all of
    them in ``args.connects`` (None if not given), the first in ``args.connect``."""
    more = (
        "; repeat it for other brokers to fail over to, in order: a peer moves to the next "
        "when it loses the one it is on (specs/mdp-0.2.md, MDP-D-28)"
        if several
        else ""
    )
    sub.add_argument(
        "--connect",
        type=_or_env(partial(_endpoint, CONNECT_SCHEMES)),
        default=_env_default("--connect", DEFAULT_ENDPOINT),
        metavar="ENDPOINT",
        action=_FailoverEndpoints if several else "store",
        help="the broker's endpoint, tcp:// or ipc:// (default: %(default)s"
        + _env_help("--connect")
        + ")"
        + more,
    )
    if several:
        sub.set_defaults(connects=None)


class _FailoverEndpoints(argparse.Action):
    """``--connect`` given again: one more broker, in failover order (MDP-D-28)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, str)
        given: list[str] = list(getattr(namespace, "connects", None) or [])
        if values in given:
            raise argparse.ArgumentError(self, f"{values} is given twice")
        given.append(values)
        namespace.connects = given
        namespace.connect = given[0]


def _add_fuzz(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = BrokerConfig()
    sub = _subcommand(
        commands,
        "fuzz",
        "check an MDP/0.2 broker, worker or client against domo's model",
        "Check an MDP/0.2 peer against the rules of specs/mdp-0.2.md with scenarios that "
        "Hypothesis generates and shrinks. --target broker (the default): play clients and "
        "workers against the broker running at ENDPOINT. --target worker or client: bind ENDPOINT "
        "and play the broker against the worker or client that connects to it; --exec CMD starts "
        "it ('{endpoint}' in CMD becomes the endpoint bound, e.g. tcp://127.0.0.1:0 picks a free "
        "port), else start it yourself. A client under test must send requests one after another "
        "for ever (e.g. `domo call --repeat 0`). --dialect mdp01 or majortomo plays that dialect's "
        "clients and workers against a broker. Use a short --heartbeat-interval and give the "
        "peer the same --heartbeat-interval and --liveness. Each violation is printed with its "
        "rule id and a shrunk scenario, saved for --replay. Exit 0: nothing found; 1: violations "
        "found; 2: usage error; 3: the target is unreachable (no broker answered, or no worker or "
        "client connected).",
        _fuzz,
        "warning",
        prepare=_check_fuzz,
    )
    sub.add_argument(
        "endpoint",
        metavar="ENDPOINT",
        type=partial(_endpoint_to_bind_or_connect, CONNECT_SCHEMES),
        help="the broker to check, or the endpoint to bind for a worker or client "
        "(tcp:// or ipc://)",
    )
    sub.add_argument(
        "--target",
        choices=list(FUZZ_TARGETS),
        default=None,
        help="what is checked (default: broker; with --replay, the file's target)",
    )
    sub.add_argument(
        "--exec",
        dest="command",
        metavar="CMD",
        help="start the worker or client under test with CMD (split like a shell would, run "
        "without one; '{endpoint}' replaced); restarted if it exits between scenarios",
    )
    _add_heartbeat_options(sub, defaults.heartbeat_interval, defaults.liveness)
    sub.add_argument(
        "--examples",
        type=partial(_integer, least=1),
        default=100,
        metavar="N",
        help="scenarios to run at most (default: %(default)s)",
    )
    sub.add_argument(
        "--max-steps",
        type=partial(_integer, least=1),
        default=12,
        metavar="N",
        help="steps per scenario at most (default: %(default)s)",
    )
    sub.add_argument(
        "--time-budget",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="stop searching after this long (default: %(default)s)",
    )
    sub.add_argument(
        "--seed",
        type=_count,
        default=None,
        metavar="N",
        help="seed of the search; the same seed repeats a run (default: a fresh one, printed)",
    )
    sub.add_argument(
        "--dispatch",
        choices=["lru"],
        default=None,
        help="the broker's choice of worker where MDP-A-04 leaves it open, to be judged too "
        "(lru: the worker idle the longest gets the next request; default: not judged)",
    )
    sub.add_argument(
        "--dialect",
        choices=list(FUZZ_DIALECTS),
        default=None,
        help="the dialect of the clients and workers played against a broker: mdp02 (RFC 18, "
        "the default), mdp01 (RFC 7, specs/mdp-0.1.md) or majortomo (specs/majortomo.md); "
        "with --replay, the file's",
    )
    sub.add_argument(
        "--no-mmi",
        dest="mmi",
        action="store_false",
        help="the broker does not implement MMI (RFC 8): do not send or judge mmi.* requests",
    )
    sub.add_argument(
        "--first",
        action="store_true",
        help="stop at the first rule found broken (after shrinking its scenario)",
    )
    sub.add_argument(
        "--findings-dir",
        type=Path,
        default=Path("domo-fuzz-findings"),
        metavar="DIR",
        help="where replay files go (default: %(default)s)",
    )
    sub.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="run the scenario saved in FILE once instead of searching (its target, interval "
        "and liveness come from the file)",
    )


def _check_fuzz(args: argparse.Namespace) -> None:
    if args.target in (None, "broker") and args.replay is None:
        try:  # the broker target connects: no port 0 or '*' there
            check_endpoint(args.endpoint, bind=False, schemes=CONNECT_SCHEMES)
        except EndpointError as error:
            args.parser.error(f"argument ENDPOINT: {error}")
    if args.replay is not None and not args.replay.is_file():
        args.parser.error(f"--replay: no such file: {args.replay}")
    if args.dialect not in (None, "mdp02") and args.target not in (None, "broker"):
        args.parser.error("--dialect: only a broker is fuzzed in another dialect than mdp02")
    if args.command is not None:
        if args.target == "broker" or (args.target is None and args.replay is None):
            args.parser.error("--exec starts a worker or client: give --target worker or client")
        try:
            shlex.split(args.command)
        except ValueError as error:
            args.parser.error(f"--exec: {error}")


async def _fuzz(args: argparse.Namespace) -> int:
    try:
        from domo import fuzz
    except ImportError as error:
        print(
            "domo fuzz: needs hypothesis (pip install '.[fuzz]' in domo's source directory): "
            f"{error}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.heartbeat_interval > 0.5 and args.replay is None:  # a replay uses its file's
        print(
            f"domo fuzz: heartbeat interval {args.heartbeat_interval} s makes every scenario slow; "
            "give the peer e.g. --heartbeat-interval 0.1 and pass the same here",
            file=sys.stderr,
        )
    options = fuzz.FuzzOptions(
        args.endpoint,
        target=args.target or "broker",
        command=args.command,
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        examples=args.examples,
        max_steps=args.max_steps,
        time_budget=args.time_budget,
        seed=args.seed,
        findings_dir=args.findings_dir,
        first=args.first,
        dispatch=args.dispatch,
        mmi=args.mmi,
        dialect=args.dialect or "mdp02",
    )
    try:
        if args.replay is not None:
            try:
                replay = fuzz.load_replay(args.replay)
            except ValueError as error:
                print(f"domo fuzz: {error}", file=sys.stderr)
                return EXIT_USAGE
            if args.target is not None and args.target != replay.target:
                print(
                    f"domo fuzz: {args.replay} is a {replay.target} scenario, not {args.target}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            if args.dialect is not None and args.dialect != replay.dialect:
                print(
                    f"domo fuzz: {args.replay} is a {replay.dialect} scenario, not {args.dialect}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            if args.command is not None and replay.target == "broker":
                print(
                    f"domo fuzz: {args.replay} is a broker scenario; --exec starts a worker or "
                    "client",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            print(f"replaying {args.replay} ({replay.rule or 'no rule recorded'}):")
            violations = await trio.to_thread.run_sync(
                partial(fuzz.replay_file, options, replay, print)
            )
            for violation in violations:
                print(f"{violation.rule}: {violation.explanation}")
            print(f"{len(violations)} violation(s)")
            return EXIT_FINDINGS if violations else EXIT_OK
        result = await trio.to_thread.run_sync(fuzz.fuzz, options)
    except fuzz.Unreachable as error:
        print(f"domo fuzz: target unreachable: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ValueError as error:  # an endpoint that cannot be bound, a command that cannot start
        print(f"domo fuzz: {error}", file=sys.stderr)
        return EXIT_ENDPOINT
    for finding in result.findings:
        if finding.violation.explanation == result.never_served:
            continue  # said once, below (the intervals differ)
        print(fuzz.format_finding(finding, options.target, options.endpoint, options.command))
    if result.never_served:
        print(f"domo fuzz: no scenario could run: {result.never_served}")
    else:
        print(fuzz.format_coverage(result))
    if result.jitter:  # what the timing windows allowed for (docs/fuzz.md)
        seen = ", ".join(f"{kind} {s * 1000:.0f} ms" for kind, s in sorted(result.jitter.items()))
        print(f"domo fuzz: largest jitter samples: {seen}")
    print(
        f"domo fuzz: {options.target}"
        + ("" if options.dialect == "mdp02" else f" ({options.dialect})")
        + f": {result.examples} scenarios in {result.seconds:.1f} s "
        f"({result.scenarios_per_second:.1f}/s), seed {result.seed}; "
        f"{len(result.findings)} rule(s) broken: "
        + (
            ", ".join(f"{f.violation.rule} after {f.seconds or 0:.1f} s" for f in result.findings)
            or "none"
        )
    )
    return EXIT_FINDINGS if result.findings else EXIT_OK


def _add_heartbeat_options(sub: argparse.ArgumentParser, interval: float, liveness: int) -> None:
    sub.add_argument(
        "--heartbeat-interval",
        type=_or_env(_positive_float),
        default=_env_default("--heartbeat-interval", interval),
        metavar="SECONDS",
        help="seconds between heartbeats; broker and workers must agree (default: %(default)s"
        + _env_help("--heartbeat-interval")
        + ")",
    )
    sub.add_argument(
        "--liveness",
        type=_or_env(_positive_int),
        default=_env_default("--liveness", liveness),
        metavar="N",
        help="the peer is lost after N heartbeat intervals of silence; broker and workers "
        "must agree (default: %(default)s" + _env_help("--liveness") + ")",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _integer(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _integer(text, 1)


def _count(text: str) -> int:
    return _integer(text, 0)


_BYTE_SIZE: Final = re.compile(r"\s*(\d+)\s*(?:([KMG])(?:i?B)?|B)?\s*", re.IGNORECASE)
_BYTE_UNITS: Final = {None: 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def _byte_size(text: str) -> int:
    """A positive number of bytes, with an optional binary unit: 4194304, 4096K, 4M, 4MiB, 1G."""
    match = _BYTE_SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (bytes, or with a unit: 4096K, 4M, 4MiB, 1G)"
        )
    digits, unit = match.groups()
    value = int(digits) * _BYTE_UNITS[None if unit is None else unit.upper()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def _service(text: str) -> str:
    if not mdp.is_valid_service(text.encode("utf-8", "replace")):
        raise argparse.ArgumentTypeError(
            f"a service name is 1-255 printable ASCII characters, got {text!r}"
        )
    return text


def _endpoint(schemes: Sequence[str], text: str) -> str:
    """An argparse type: ``text`` if it is an endpoint of ``schemes`` (see ``domo.endpoints``).

    Binding is told from connecting by the schemes: only a bind may use inproc://.
    """
    try:
        return check_endpoint(text, bind="inproc" in schemes, schemes=schemes)
    except EndpointError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _endpoint_to_bind_or_connect(schemes: Sequence[str], text: str) -> str:
    """As ``_endpoint``, where whether it is bound is known only once every option is read."""
    try:
        return check_endpoint(text, bind=True, schemes=schemes)
    except EndpointError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# --- domo status ------------------------------------------------------------------------------

DEFAULT_METRICS: Final = "127.0.0.1:9100"


def _add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    return EXIT_OK


# --- domo broker ------------------------------------------------------------------------------

TRIM_INTERVAL: Final = 2.0  # seconds between two hand-backs of the heap's free pages


async def _trim_memory() -> None:
    """Give freed heap pages back to the system now and then (``domo.runtime.memory``): after a
    flood the broker's RSS comes back down instead of staying at its peak (issue 14)."""
    while True:
        memory.trim()  # a no-op off glibc
        await trio.sleep(TRIM_INTERVAL)


async def _broker(args: argparse.Namespace) -> int:
    try:
        config = BrokerConfig(
            heartbeat_interval=args.heartbeat_interval,
            liveness=args.liveness,
            request_expiry=args.request_expiry,
            max_redispatches=args.max_redispatches,
            max_message_bytes=args.max_message_bytes,
            max_held_bytes=args.max_held_bytes,
            max_peer_bytes=args.max_peer_bytes,
        )
    except ValueError as bad:  # byte bounds that cannot hold one message of the largest size
        print(f"domo broker: {bad}", file=sys.stderr)
        return EXIT_USAGE
    completed = 0
    late_workers = LateWorkerWatch(config)

    def on_event(event: BrokerEvent) -> None:
        nonlocal completed
        if isinstance(event, RequestCompleted):
            completed += 1
        late_workers.on_event(event)

    if args.trace_dir is not None and (error := _check_trace_dir(args.trace_dir)) is not None:
        print(f"domo broker: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.metrics is not None:
        try:
            from domo.metrics import BrokerMetrics, serve_metrics
        except ImportError:
            print(
                "domo broker: --metrics needs prometheus-client: pip install '.[metrics]' in "
                "domo's source directory",
                file=sys.stderr,
            )
            return EXIT_USAGE
        metrics = BrokerMetrics(config)
        try:
            host, port = serve_metrics(args.metrics, metrics)
        except OSError as error:
            print(f"domo broker: cannot serve metrics at {args.metrics}: {error}", file=sys.stderr)
            return EXIT_ENDPOINT
        print(f"domo broker: metrics on http://{host}:{port}/metrics", flush=True)
        counted = on_event

        def on_event(event: BrokerEvent) -> None:
            counted(event)
            metrics.on_event(event)

    serve = partial(
        serve_broker, config=config, on_event=on_event, trace_dir=args.trace_dir, curve=args.curve
    )
    memory.fix_mmap_threshold()  # this process is a broker: large bodies go back when freed
    async with _graceful_stop("broker") as stop:
        with stop:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_trim_memory)
                bound: list[str] = await nursery.start(serve, *(args.bind or [DEFAULT_ENDPOINT]))
                if args.curve is not None and args.curve.allow is not None:
                    nursery.start_soon(_reload_on_sighup, args.curve.allow)
                for endpoint in bound:
                    secured = "" if args.curve is None else " (CURVE)"
                    print(f"domo broker: listening on {endpoint}{secured}", flush=True)
                await trio.sleep_forever()
    print(f"domo broker: stopped; {completed} requests completed", flush=True)
    return EXIT_OK


def _metrics_address(text: str) -> str:
    """An argparse type: ``HOST:PORT`` for the metrics' HTTP server."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"not HOST:PORT (port 0 to 65535): {text!r}")
    return text


def _prepare_broker(args: argparse.Namespace) -> None:
    """Load the CURVE key pair and allow-list now: a bad file is a usage error (exit 2)."""
    args.curve = None
    if args.curve_secret_file is None:
        if args.curve_allow_file is not None:
            args.parser.error("--curve-allow-file needs --curve-secret-file")
        return
    try:
        keys = load_keypair(args.curve_secret_file)
        allow = None if args.curve_allow_file is None else AllowList(args.curve_allow_file)
    except CurveError as error:
        args.parser.error(str(error))
    if allow is not None and not len(allow):
        logger.warning("the allow-list %s is empty: no peer can connect", args.curve_allow_file)
    args.curve = CurveServer(keys, allow)


async def _reload_on_sighup(allow: AllowList) -> None:
    """Re-read the CURVE allow-list at each SIGHUP (a bad file keeps the current list)."""
    with trio.open_signal_receiver(signal.SIGHUP) as hangups:
        async for _ in hangups:
            logger.info("SIGHUP received: reloading the allow-list %s", allow.path)
            allow.reload()


def _prepare_curve_client(args: argparse.Namespace) -> None:
    """``args.curve``: the CurveClient that --curve-server-key / --curve-secret-file ask for."""
    args.curve = None
    if args.curve_server_key is None:
        if args.curve_secret_file is not None:
            args.parser.error("--curve-secret-file needs --curve-server-key (the broker's key)")
        return
    try:
        server_key = load_public_key(args.curve_server_key)
        if args.curve_secret_file is not None:
            keys = load_keypair(args.curve_secret_file)
        else:
            public, secret = zmq.curve_keypair()  # for a broker that admits any key
            keys = KeyPair(public, secret)
    except CurveError as error:
        args.parser.error(str(error))
    args.curve = CurveClient(server_key, keys)


async def _keygen(args: argparse.Namespace) -> int:
    try:
        public_file, secret_file = write_keypair(args.dir, args.name)
    except CurveError as error:
        print(f"domo keygen: {error}", file=sys.stderr)
        return EXIT_USAGE
    public = load_public_key(str(public_file)).decode()
    print(f"domo keygen: wrote {public_file} (public) and {secret_file} (secret, mode 0600)")
    print(f"public key: {public}")
    print(f"allow-list line: {public}  # {args.name}")
    return EXIT_OK


def _check_trace_dir(directory: str) -> str | None:
    """Why tracing to ``directory`` cannot work (no pyarrow, not writable), or None."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return "--trace-dir needs pyarrow: pip install '.[trace]' in domo's source directory"
    from domo.trace import TraceDirError, check_trace_dir

    try:
        check_trace_dir(directory)
    except TraceDirError as exc:
        return str(exc)
    return None


LARGE_BODY: Final = 16 * 1024 * 1024  # bytes: a body that takes a while to cross loopback


class LateWorkerWatch:
    """Names the likely cause when workers keep speaking after the broker gave them up.

    A worker whose heartbeat interval is longer than the broker's is expired (nothing heard for
    liveness x the broker's interval) and then heard again: its next HEARTBEAT breaks a rule
    (it is no longer registered). Each such violation alone reads like a faulty peer; the first
    one from a peer that expired is explained once, with what to check.
    """

    REMEMBERED: Final = 1000  # expired peers kept in mind, the oldest forgotten first

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        # Insertion-ordered, bounded: expired worker -> whether it held a request then.
        self._expired: dict[object, bool] = {}
        self._busy: dict[object, int] = {}  # worker -> the request it holds now
        self._sizes: dict[int, int] = {}  # request id -> body size, for requests not yet done
        self._holding: dict[object, int] = {}  # worker -> size of the request it was sent last
        self.hinted = False
        self.hinted_transfer = False

    def _explain_large_transfer(self, event: WorkerExpired | WorkerDisconnected) -> None:
        """A worker that expired holding a large body was most likely busy moving it: nothing
        else can cross its connection while a message does, heartbeats included."""
        size = self._holding.pop(event.worker, 0)
        span = self.config.liveness * self.config.heartbeat_interval
        if size < LARGE_BODY or self.hinted_transfer:
            return
        self.hinted_transfer = True
        logger.warning(
            "worker %s was lost (%s) while it held a request of %.0f MB: a message that large "
            "takes longer to cross than --liveness x --heartbeat-interval = %.3g s, and "
            "heartbeats wait behind it, so each side took the other for dead; raise "
            "--heartbeat-interval (on the broker and its workers) for bodies this large",
            eventlog.peer_text(event.worker),
            "expired" if isinstance(event, WorkerExpired) else event.reason,
            size / 1e6,
            span,
        )

    def on_event(self, event: BrokerEvent) -> None:
        if isinstance(event, RequestQueued):
            self._sizes[event.request_id] = event.size
            if len(self._sizes) > self.REMEMBERED:
                del self._sizes[next(iter(self._sizes))]
        elif isinstance(event, RequestDispatched):
            self._holding[event.worker] = self._sizes.get(event.request_id, 0)
            self._busy[event.worker] = event.request_id
        elif isinstance(event, RequestCompleted | RequestDropped | RequestExpired):
            self._sizes.pop(event.request_id, None)
            # Completed once its FINAL was sent, maybe after the worker's next dispatch.
            if isinstance(event, RequestCompleted) and self._busy.get(event.worker) == (
                event.request_id
            ):
                del self._busy[event.worker]
        elif isinstance(event, WorkerDisconnected) and event.reason == "unreachable":
            self._explain_large_transfer(event)  # it gave the broker up while the body crossed
        if isinstance(event, WorkerDisconnected):
            self._busy.pop(event.worker, None)
        if isinstance(event, WorkerExpired):
            self._explain_large_transfer(event)
            self._expired[event.worker] = event.worker in self._busy
            self._busy.pop(event.worker, None)
            if len(self._expired) > self.REMEMBERED:
                del self._expired[next(iter(self._expired))]
        elif (
            isinstance(event, ProtocolViolation) and event.peer in self._expired and not self.hinted
        ):
            self.hinted = True
            if self._expired[event.peer]:  # it held a request: busy, or its interval differs
                logger.warning(
                    "worker %s spoke again after it expired while it held a request (nothing "
                    "heard from it for %.3g s): a worker must keep sending HEARTBEAT while it "
                    "works (MDP-H-04; majortomo's worker, for one, does not), or its heartbeat "
                    "interval is longer than this broker's %.3g s (broker and workers must use "
                    "the same --heartbeat-interval and --liveness)",
                    eventlog.peer_text(event.peer),
                    self.config.liveness * self.config.heartbeat_interval,
                    self.config.heartbeat_interval,
                )
                return
            logger.warning(
                "worker %s spoke again after it expired (nothing heard from it for %.3g s): its "
                "heartbeat interval is probably longer than this broker's %.3g s (broker and "
                "workers must use the same --heartbeat-interval and --liveness)",
                eventlog.peer_text(event.peer),
                self.config.liveness * self.config.heartbeat_interval,
                self.config.heartbeat_interval,
            )


@asynccontextmanager
async def _graceful_stop(what: str) -> AsyncIterator[trio.CancelScope]:
    """A scope that SIGINT or SIGTERM cancels (a graceful stop), for a long-running command.

    Signals are read by a task outside that scope, for as long as the block runs, so one that
    comes while the stop is under way (a second Ctrl-C, a SIGTERM after a SIGINT) is logged and
    does not cut the graceful stop short; trio would redeliver a signal still pending when the
    receiver closes, and the default action would end the process without its last words.
    """
    stop = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as watcher:

            async def watch() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if stop.cancel_called:
                        logger.info("%s: %s received while stopping; still stopping", what, name)
                    else:
                        logger.info("%s: %s received, stopping", what, name)
                        stop.cancel()

            watcher.start_soon(watch)
            try:
                yield stop
            finally:
                watcher.cancel_scope.cancel()


async def _stop_on_signal(
    signals: AsyncIterator[int], scope: trio.CancelScope, what: str
) -> int | None:
    """Wait for SIGINT or SIGTERM, then cancel ``scope`` (a graceful stop); the signal."""
    async for signum in signals:
        logger.info("%s: %s received, stopping", what, signal.Signals(signum).name)
        scope.cancel()
        return signum
    return None


# --- domo worker ------------------------------------------------------------------------------


def _prepare_worker(args: argparse.Namespace) -> None:
    """Check that SERVICE has a handler, and that an --exec command can be found."""
    _prepare_curve_client(args)
    args.exec_argv = None
    if args.service.startswith("mmi."):
        args.parser.error("service names starting with 'mmi.' belong to the broker (MDP-D-14)")
    if args.exec_command is None:
        if args.service != "echo":
            args.parser.error(
                f"no handler for {args.service!r}: give --exec CMD "
                "('echo' is the only built-in service)"
            )
        return
    try:
        argv = shlex.split(args.exec_command)
    except ValueError as error:
        args.parser.error(f"--exec: {error}")
    if not argv:
        args.parser.error("--exec: empty command")
    if shutil.which(argv[0]) is None:
        args.parser.error(f"--exec: command not found: {argv[0]!r}")
    args.exec_argv = argv


async def _worker(args: argparse.Namespace) -> int:
    handler: Handler = _echo
    serving = "(built-in echo)"
    if args.exec_argv is not None:
        handler = _command_handler(args.service, args.exec_argv, args.exec_timeout)
        serving = f"by running {args.exec_command!r}"
    config = WorkerConfig(heartbeat_interval=args.heartbeat_interval, liveness=args.liveness)
    watch = BrokerWatch(args.connect, config)

    def say_serving() -> None:
        print(
            f"domo worker: serving {args.service!r} {serving} at {args.connect}, "
            f"{args.concurrency} at a time",
            flush=True,
        )

    watch.on_first_answer = say_serving
    work = partial(
        run_worker,
        config=config,
        concurrency=args.concurrency,
        on_event=watch.on_event,
        on_broker_heard=watch.heard,
        curve=args.curve,
    )
    async with _graceful_stop("worker") as stop:
        with stop:
            async with trio.open_nursery() as nursery:
                endpoints = args.connects or [args.connect]  # failover order (MDP-D-28)
                await nursery.start(work, endpoints, args.service, handler)
                if not watch.answered:
                    where = " or ".join(endpoints)
                    print(f"domo worker: waiting for the broker at {where}", flush=True)
                await trio.sleep_forever()
    print("domo worker: stopped", flush=True)
    return EXIT_OK


class BrokerWatch:
    """What a worker can tell of its broker from the outside: whether it ever answered, and
    whether it keeps going silent right after each connect.

    A broker says nothing to READY; it is first heard with its first HEARTBEAT (one interval
    later) or a request. A session that reconnects for "broker-lost" before hearing anything,
    again and again, points at no broker there, or at one whose heartbeat interval is longer than
    the worker's: the worker gives it up after liveness x its own interval, before the broker's
    first HEARTBEAT is due. That is said once, with what to check.
    """

    STRIKES: Final = 2  # silent connects in a row before the hint

    def __init__(self, endpoint: str, config: WorkerConfig) -> None:
        self.endpoint = endpoint
        self.config = config
        self.answered = False  # the broker was heard at least once
        self.heard_since_connect = False
        self.silent_connects = 0
        self.hinted = False
        self.on_first_answer: Callable[[], None] = lambda: None

    def heard(self) -> None:
        self.heard_since_connect = True
        self.silent_connects = 0
        if not self.answered:
            self.answered = True
            self.on_first_answer()

    def on_event(self, event: object) -> None:
        if isinstance(event, WorkerConnected):
            self.heard_since_connect = False
        elif isinstance(event, ReconnectRequired) and event.reason == "broker-lost":
            if self.heard_since_connect:
                self.silent_connects = 0
                return
            self.silent_connects += 1
            # A broker heard before has an interval that fits (its HEARTBEAT came in time):
            # losing it later has other causes (it stopped, or a large body held the line).
            if self.silent_connects >= self.STRIKES and not self.hinted and not self.answered:
                self.hinted = True
                span = self.config.liveness * self.config.heartbeat_interval
                logger.warning(
                    "nothing heard from the broker at %s within %.3g s of connecting, %d times "
                    "in a row: no broker is running there, or its heartbeat interval is longer "
                    "than this worker's %.3g s (broker and worker must use the same "
                    "--heartbeat-interval and --liveness)",
                    self.endpoint,
                    span,
                    self.silent_connects,
                    self.config.heartbeat_interval,
                )


async def _echo(body: list[bytes]) -> list[bytes]:
    return body


@dataclass
class CommandOutcome:
    """How one run of an --exec command ended."""

    returncode: int | None  # None: killed at the timeout
    stdout: bytes
    stderr: bytes = field(repr=False)


class CommandFailed(Exception):
    """The --exec command exited non-zero, was killed, or ran out of time (MDP-D-23 reply)."""


STDERR_TAIL: Final = 2000  # bytes of a failed command's stderr that go into the error reply


def _command_handler(service: str, argv: Sequence[str], timeout: float) -> Handler:
    """The handler that serves ``service`` by running ``argv`` once per request."""
    command = shlex.join(argv)

    async def run_command_for(body: list[bytes]) -> list[bytes] | bytes:
        env = os.environ | {
            "DOMO_SERVICE": service,
            "DOMO_FRAME_SIZES": ",".join(str(len(frame)) for frame in body),
        }
        outcome = await _run_command(argv, b"".join(body), env, timeout)
        if outcome.returncode == 0:
            return outcome.stdout
        failure = CommandFailed(_describe_failure(outcome, timeout))
        logger.warning("%s: %s", command, failure)
        return error_body(failure)  # an expected failure: no traceback in the worker's log

    return run_command_for


def _describe_failure(outcome: CommandOutcome, timeout: float) -> str:
    code = outcome.returncode
    if code is None:
        what = f"timed out after {timeout:g} s and was killed"
    elif code < 0:
        what = f"was killed by {signal.Signals(-code).name}"
    else:
        what = f"exited with status {code}"
    tail = outcome.stderr[-STDERR_TAIL:].decode("utf-8", "replace").strip()
    return f"command {what}" + (f"; stderr: {tail}" if tail else "")


async def _run_command(
    argv: Sequence[str], stdin: bytes, env: dict[str, str], time_limit: float
) -> CommandOutcome:
    """Run ``argv`` with ``stdin``; its output, and its exit status unless it timed out.

    It is killed (SIGKILL) after ``time_limit`` seconds, or if we are cancelled; either way it
    is waited for.
    """
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    to_command, from_stdout, from_stderr = process.stdin, process.stdout, process.stderr
    assert to_command is not None
    assert from_stdout is not None
    assert from_stderr is not None
    stdout, stderr = bytearray(), bytearray()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_feed, to_command, stdin)
            nursery.start_soon(_read_all, from_stdout, stdout)
            nursery.start_soon(_read_all, from_stderr, stderr)
            with trio.move_on_after(time_limit) as deadline:
                await process.wait()
            if deadline.cancelled_caught:
                process.kill()
            # A grandchild may hold the pipes open after the command exits: don't wait for it.
            nursery.cancel_scope.deadline = trio.current_time() + 1.0
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            await to_command.aclose()
            await from_stdout.aclose()
            await from_stderr.aclose()
    returncode = None if deadline.cancelled_caught else process.returncode
    return CommandOutcome(returncode, bytes(stdout), bytes(stderr))


async def _feed(pipe: trio.abc.SendStream, data: bytes) -> None:
    try:
        await pipe.send_all(data)
        await pipe.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the command does not read all its input; that is its business


async def _read_all(pipe: trio.abc.ReceiveStream, into: bytearray) -> None:
    while chunk := await pipe.receive_some():
        into += chunk


# --- domo call --------------------------------------------------------------------------------


def _prepare_call(args: argparse.Namespace) -> None:
    """The request frames: one per BODY argument, '-' read from stdin; one empty frame if none."""
    _prepare_curve_client(args)
    if args.body.count("-") > 1:
        args.parser.error("'-' (stdin) may be given only once")
    args.frames = [
        sys.stdin.buffer.read() if text == "-" else os.fsencode(text) for text in args.body
    ] or [b""]


async def _call(args: argparse.Namespace) -> int:
    """The request, stopped by SIGINT or SIGTERM with exit code 128 + the signal's number."""
    code, received = EXIT_ERROR, None

    async def stop_on_signal() -> None:
        nonlocal received
        received = await _stop_on_signal(signals, nursery.cancel_scope, "call")

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_on_signal)
            code = await _request(args)
            nursery.cancel_scope.cancel()
    return code if received is None else 128 + received


async def _request(args: argparse.Namespace) -> int:
    """Send the request ``--repeat`` times on one client; the exit code of the last failure."""
    code = EXIT_OK
    endpoints = args.connects or [args.connect]  # failover order (MDP-D-28)
    client = Client(endpoints, timeout=args.timeout, retries=args.retries, curve=args.curve)
    async with client:
        for _ in itertools.count() if args.repeat == 0 else range(args.repeat):
            code = await _request_once(client, args) or code
    return code


async def _request_once(client: Client, args: argparse.Namespace) -> int:
    final: list[bytes] = []
    try:
        async with client.stream(args.service, *args.frames) as replies:
            async for reply in replies:
                if args.json:
                    _write_json_reply(reply.body, reply.final)
                elif args.raw:
                    _write_raw(reply.body)
                else:
                    _write_text(reply.body)
                final = reply.body
    except RemoteError as error:
        print(
            f"domo call: the worker for {args.service!r} failed: "
            f"{error.error_type}: {error.message}",
            file=sys.stderr,
        )
        return EXIT_REMOTE_ERROR
    except RequestTimeout as error:
        why = "the replies stopped" if error.reason == "timeout-after-partial" else "no reply"
        print(
            f"domo call: {why} from {args.service!r} at {args.connect} within {args.timeout:g} s, "
            f"{error.attempts} attempt(s); {await _why_no_reply(args, error.attempts)}",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    if args.service.startswith("mmi.") and final[:1] != [b"200"]:
        # The call worked, but a script asking "is there a worker?" wants the answer in $?.
        status = final[0].decode("ascii", "replace") if final else "nothing"
        print(f"domo call: the broker answered {status} to {args.service}", file=sys.stderr)
        return EXIT_NOT_FOUND
    return EXIT_OK


def _quiet(*_: object, **__: object) -> None:
    """``print``'s stand-in for the lines for people under ``--json``."""


def _write_json_reply(frames: list[bytes], final: bool) -> None:
    """One reply as one JSON line (``call --json``): every frame as text if all are UTF-8,
    else every frame in base64, so a reader decodes one message one way."""
    try:
        shown, encoding = [frame.decode("utf-8") for frame in frames], "utf-8"
    except UnicodeDecodeError:
        shown, encoding = [base64.b64encode(frame).decode("ascii") for frame in frames], "base64"
    line = {"reply": "final" if final else "partial", "frames": shown, "encoding": encoding}
    print(json.dumps(line), flush=True)


def _json_load_report(
    command: str, load: DemoLoad, elapsed: float, code: int, **fields: object
) -> None:
    """What ``bench --json`` and ``demo --json`` print: one JSON object on stdout."""
    done = len(load.latencies)
    latency: dict[str, float] | None = None
    if done:
        p50, p99 = _percentiles(load.latencies)
        latency = {
            "p50": round(p50 * 1000, 3),
            "p99": round(p99 * 1000, 3),
            "max": round(max(load.latencies) * 1000, 3),
        }
    record = {
        "command": command,
        **fields,
        "requests_done": done,
        "failed": load.failed,
        "wrong": load.wrong,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(done / elapsed, 1) if done and elapsed > 0 else 0.0,
        "latency_ms": latency,
        "exit_code": code,
    }
    print(json.dumps(record), flush=True)


async def _why_no_reply(args: argparse.Namespace, attempts: int) -> str:
    """After a timeout, ask the broker (mmi.service, one short try) what the likely cause is."""
    if args.service.startswith("mmi."):
        return "is the broker up?"
    probe = Client(args.connect, timeout=min(args.timeout, 1.0), retries=0, curve=args.curve)
    async with probe as client:
        try:
            answer = await client.request("mmi.service", args.service.encode())
        except RequestError:
            if args.curve is not None:
                return (
                    f"no broker answered at {args.connect} either: is `domo broker` running, "
                    "with this public key (--curve-server-key), and does its allow-list hold "
                    "this peer's key (--curve-secret-file)?"
                )
            return f"no broker answered at {args.connect} either (is `domo broker` running?)"
    if answer[:1] != [b"200"]:
        return f"the broker says no worker serves {args.service!r} (mmi.service: 404)"
    repeated = (
        f"; each of the {attempts} attempts was sent again, so the work may have run "
        f"{attempts} times (--retries 0 sends it once)"
        if attempts > 1
        else ""
    )
    size = sum(len(frame) for frame in args.frames)
    default_bound = BrokerConfig().max_message_bytes
    over = (  # MDP-D-25: the broker refuses it without a reply, or ZeroMQ cuts it off
        f"; and a broker refuses a body over {default_bound // 2**20} MiB unless started with a "
        "larger --max-message-bytes"
        if size > default_bound
        else ""
    )
    if size >= LARGE_BODY:
        return (
            f"a worker serves {args.service!r}, but a body of {size / 1e6:.0f} MB may take "
            "longer to cross than the broker's liveness x heartbeat interval, so the broker "
            "can take its worker for dead and drop the request (its log says so); raise "
            f"--heartbeat-interval on the broker and workers, or --timeout{over}{repeated}"
        )
    if over:
        return (
            f"a worker serves {args.service!r}, but a body of {size / 1e6:.1f} MB is over the "
            f"{default_bound // 2**20} MiB a broker takes by default: it refuses the request "
            "without a reply unless started with a larger --max-message-bytes"
            f"{repeated}"
        )
    return (
        f"a worker serves {args.service!r}, so the work takes longer than --timeout "
        f"{args.timeout:g} s: give it more time (e.g. --timeout {args.timeout * 4:g}){repeated}"
    )


def _write_raw(body: list[bytes]) -> None:
    out = sys.stdout.buffer
    for frame in body:
        out.write(frame)
    out.flush()


def _write_text(body: list[bytes]) -> None:
    out = sys.stdout.buffer
    for frame in body:
        out.write(_frame_as_line(frame))
    out.flush()


def _frame_as_line(frame: bytes) -> bytes:
    """One reply frame as ``domo call`` prints it: text with one newline, else a bytes literal."""
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        return repr(frame).encode() + b"\n"
    if not all(char.isprintable() or char in "\t\n" for char in text):
        return repr(frame).encode() + b"\n"
    return frame if frame.endswith(b"\n") else frame + b"\n"


# --- domo demo --------------------------------------------------------------------------------


@dataclass
class DemoLoad:
    """What the demo's clients did."""

    issued: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, one per checked reply
    failed: int = 0  # no FINAL after every retry
    wrong: int = 0  # a FINAL that was not the request's body
    sample: tuple[bytes, list[bytes]] | None = None


async def _bench(args: argparse.Namespace) -> int:
    requests = None if args.duration is not None else args.requests
    amount = f"{requests} requests" if requests else f"requests for {args.duration:g} s"
    say = _quiet if args.json else print  # --json: one JSON object on stdout, nothing else
    say(
        f"domo bench: {args.clients} clients -> {args.service!r} at {args.connect}, "
        f"{args.size}-byte bodies, {amount}",
        flush=True,
    )
    problem = await _bench_precheck(args)
    if problem is not None:
        code, why = problem
        print(f"domo bench: {why}", file=sys.stderr)
        return code
    load = DemoLoad()
    body = b"x" * args.size
    # A load that gets no reply for this long stops: every client has used all its retries.
    stall_limit = max(5.0, args.timeout * (args.retries + 1) + 1.0)
    watch = BenchWatch(load, requests, sys.stderr.isatty())
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as load_scope:
                nursery.start_soon(_stop_on_signal, signals, load_scope, "bench")
                nursery.start_soon(watch.run, load_scope, stall_limit)
                started = time.perf_counter()
                await _demo_load(
                    args.connect, None, args.clients, requests, args.duration, load,
                    service=args.service, body_for=lambda n: body, reply_timeout=args.timeout,
                    retries=args.retries,
                )  # fmt: skip
            elapsed = time.perf_counter() - started
            nursery.cancel_scope.cancel()
    watch.clear()
    if watch.stalled:
        print(
            f"domo bench: no reply for {stall_limit:g} s ({load.failed} requests failed after "
            f"{args.retries} retries each); stopped early. Is a worker for {args.service!r} "
            "still up, and does each request finish within --timeout?",
            file=sys.stderr,
        )
    done = len(load.latencies)
    code = EXIT_FAILED_REQUESTS if load.failed or load.wrong else EXIT_OK
    if not done:
        code = EXIT_UNREACHABLE
        if not watch.stalled:
            print(
                f"domo bench: no reply from {args.service!r} at {args.connect}; is the broker "
                "up and a worker serving it?",
                file=sys.stderr,
            )
    if args.json:
        _json_load_report(
            "bench", load, elapsed, code, service=args.service, endpoint=args.connect,
            clients=args.clients, size=args.size,
        )  # fmt: skip
        return code
    print(
        f"requests done: {done} in {elapsed:.2f} s ({load.failed} failed"
        + (f", {load.wrong} wrong replies)" if args.service == "echo" else ")")
    )
    if not done:
        return code
    p50, p99 = _percentiles(load.latencies)
    print(f"throughput: {done / elapsed:.0f} requests/s")
    print(
        f"latency: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
        f"max {max(load.latencies) * 1000:.2f} ms",
        flush=True,
    )
    return code


async def _bench_precheck(args: argparse.Namespace) -> tuple[int, str] | None:
    """Ask the broker whether the service has a worker (mmi.service); what is wrong, if any
    (the exit code and why)."""
    if args.service.startswith("mmi."):
        return None  # the broker answers these itself
    client = Client(args.connect, timeout=args.timeout, retries=0)
    async with client:
        try:
            answer = await client.request("mmi.service", args.service.encode())
        except RequestError:
            return (
                EXIT_UNREACHABLE,
                f"no broker answered at {args.connect} within {args.timeout:g} s "
                "(is `domo broker` running there?)",
            )
    if answer[:1] != [b"200"]:
        return (
            EXIT_NOT_FOUND,
            f"no worker serves {args.service!r} at {args.connect} (mmi.service answered "
            f"{b''.join(answer[:1]).decode('ascii', 'replace')}); start one first, e.g. "
            f"`domo worker {shlex.quote(args.service)} --exec CMD --connect {args.connect}`",
        )
    return None


class BenchWatch:
    """Progress of a ``domo bench`` load, shown on a terminal, and the stall that stops it."""

    def __init__(self, load: DemoLoad, requests: int | None, show: bool) -> None:
        self.load = load
        self.requests = requests
        self.show = show  # only on a terminal: a '\r' line in a log file or a pipe is noise
        self.stalled = False
        self._shown = False

    async def run(self, load_scope: trio.CancelScope, stall_limit: float) -> None:
        started = last_change = trio.current_time()
        answered = 0
        while True:
            await trio.sleep(0.5)
            now = trio.current_time()
            done = len(self.load.latencies)
            if done != answered:
                answered, last_change = done, now
            elif now - last_change >= stall_limit and self.load.failed:
                self.stalled = True
                load_scope.cancel()
                return
            if self.show:
                total = f"/{self.requests}" if self.requests else ""
                rate = done / (now - started)
                sys.stderr.write(
                    f"\r  {done}{total} answered, {self.load.failed} failed, {rate:.0f} requests/s "
                )
                sys.stderr.flush()
                self._shown = True

    def clear(self) -> None:
        """End the progress line, if one was shown, so what follows starts on its own line."""
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


async def _demo(args: argparse.Namespace) -> int:
    # One context for the broker, workers and clients (inproc:// needs that). Every socket is
    # closed when their tasks end, so terminating it is quick; ZmqTransport.aclose still bounds
    # the wait, as libzmq 4.3.5 was seen to block term() rarely with every socket closed.
    transport = ZmqTransport()
    try:
        return await _run_demo(args, transport.context)
    finally:
        await transport.aclose()


async def _run_demo(args: argparse.Namespace, context: zmq.Context[zmq.Socket[bytes]]) -> int:
    requests = None if args.duration is not None else args.requests
    registered: list[bytes] = []
    all_registered = trio.Event()
    finals: dict[bytes, int] = {}  # worker -> FINALs the broker forwarded from it

    def watch(event: BrokerEvent) -> None:
        if isinstance(event, WorkerRegistered):
            registered.append(event.worker)
            if len(registered) == args.workers:
                all_registered.set()
        elif isinstance(event, RequestCompleted):
            finals[event.worker] = finals.get(event.worker, 0) + 1

    amount = f"{requests} requests" if requests else f"requests for {args.duration:g} s"
    say = _quiet if args.json else print  # --json: one JSON object on stdout, nothing else
    say(
        f"domo demo: a broker on {args.endpoint}, {args.workers} echo workers, "
        f"{args.clients} clients, {amount}",
        flush=True,
    )
    load = DemoLoad()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, context=context, on_event=watch)
            endpoint = (await nursery.start(serve, args.endpoint))[0]
            started = time.perf_counter()
            for _ in range(args.workers):
                await nursery.start(partial(run_worker, context=context), endpoint, "echo", _echo)
            with trio.fail_after(30):
                await all_registered.wait()
            took = (time.perf_counter() - started) * 1000
            say(f"workers registered: {len(registered)} of {args.workers} in {took:.1f} ms")
            with trio.CancelScope() as load_scope:
                nursery.start_soon(_stop_on_signal, signals, load_scope, "demo")
                started = time.perf_counter()
                await _demo_load(endpoint, context, args.clients, requests, args.duration, load)
            elapsed = time.perf_counter() - started
            nursery.cancel_scope.cancel()
    if args.json:
        code = EXIT_FAILED_REQUESTS if load.failed or load.wrong else EXIT_OK
        _json_load_report(
            "demo", load, elapsed, code, endpoint=args.endpoint, workers=args.workers,
            clients=args.clients, finals_per_worker=list(finals.values()),
        )  # fmt: skip
        return code
    return _demo_report(load, requests, elapsed, finals)


async def _demo_load(
    endpoint: str,
    context: zmq.Context[zmq.Socket[bytes]] | None,
    clients: int,
    requests: int | None,
    duration: float | None,
    load: DemoLoad,
    *,
    service: str = "echo",
    body_for: Callable[[int], bytes] = lambda n: b"demo request %d" % n,
    reply_timeout: float = 2.5,
    retries: int = 3,
) -> None:
    """``clients`` clients, one request at a time each; replies to ``echo`` are checked."""
    stop_at = math.inf if duration is None else trio.current_time() + duration

    async def one_client() -> None:
        client = Client(endpoint, context=context, timeout=reply_timeout, retries=retries)
        async with client:
            while trio.current_time() < stop_at and (requests is None or load.issued < requests):
                load.issued += 1
                body = body_for(load.issued)
                start = time.perf_counter()
                try:
                    reply = await client.request(service, body)
                except RequestError:
                    load.failed += 1
                    continue
                load.latencies.append(time.perf_counter() - start)
                if service == "echo" and reply != [body]:
                    load.wrong += 1
                load.sample = (body, reply)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one_client)


def _demo_report(
    load: DemoLoad, requests: int | None, elapsed: float, finals: dict[bytes, int]
) -> int:
    done = len(load.latencies)
    of = f" of {requests}" if requests else ""
    per_worker = ", ".join(str(count) for count in finals.values()) or "none"
    print(
        f"requests done: {done}{of} in {elapsed:.2f} s ({load.failed} failed, {load.wrong} "
        f"wrong replies); FINALs per worker: {per_worker}"
    )
    if load.sample is not None:
        body, reply = load.sample
        shown = b" ".join(_frame_as_line(frame).rstrip(b"\n") for frame in reply).decode()
        print(f"sample reply: {body.decode()!r} -> {shown!r}")
    if done:
        print(f"throughput: {done / elapsed:.0f} requests/s")
        p50, p99 = _percentiles(load.latencies)
        print(f"latency: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms", flush=True)
    return EXIT_FAILED_REQUESTS if load.failed or load.wrong else EXIT_OK


def _percentiles(samples: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile of ``samples`` (not empty)."""
    if len(samples) < 2:
        return samples[0], samples[0]
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return statistics.median(samples), cuts[98]


# --- report ----------------------------------------------------------------------------------


def _add_report(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
