"""What the ``domo`` commands share: exit codes and their tables, option types and checks,
environment defaults (``DOMO_*``), the subcommand skeleton, and graceful stops on signals.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import platform
import re
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final, TypeVar

import trio
import zmq

from domo import __version__, eventlog
from domo import report as trace_report
from domo.curve import (
    CurveClient,
    CurveError,
    KeyPair,
    load_keypair,
    load_public_key,
)
from domo.endpoints import EndpointError, check_endpoint
from domo.protocol import BrokerConfig, mdp
from domo.protocol.broker import REQUEST_OVERHEAD

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
EXIT_PENDING: Final = 15  # fetch: stored, no reply yet (9/TSP 300): fetch again later
EXIT_UNKNOWN: Final = 16  # fetch: unknown id, closed, expired or given up (9/TSP 400)
EXIT_STORE: Final = 17  # titanic: the database cannot be used (locked, read-only, corrupt)

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
        (
            EXIT_USAGE,
            "usage error: bad arguments or options; or --metrics without prometheus-client",
        ),
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
            "no reply in time after every retry (no worker, the work takes longer than "
            "--timeout, or a broker that stopped answering)",
        ),
        (EXIT_REMOTE_ERROR, "the worker's handler failed (its error type and message on stderr)"),
        (EXIT_ENDPOINT, _ENDPOINT_FAILED),
        (EXIT_NOT_FOUND, "mmi.*: the broker answered 404 (no worker for the service) or 501"),
        (
            EXIT_UNREACHABLE,
            "cannot reach a broker at the endpoint (nothing listens there, it does not speak "
            "ZeroMQ, or it refused this peer's CURVE key); said within about 1.5 s",
        ),
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
    "titanic": [
        (EXIT_OK, _STOPPED),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_ENDPOINT, _ENDPOINT_FAILED),
        (
            EXIT_STORE,
            "the database cannot be used: another Titanic has it, or it is read-only, full, "
            "or not a domo Titanic database (nothing in it is changed)",
        ),
    ],
    "submit": [
        (EXIT_OK, "the request is stored; its id is on stdout"),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_TIMEOUT, "no answer from titanic.request in time (no broker or no Titanic?)"),
        (EXIT_REMOTE_ERROR, "Titanic could not store it (500: database full or read-only)"),
        (EXIT_UNKNOWN, "Titanic refused the request as malformed (400)"),
    ],
    "fetch": [
        (EXIT_OK, "the reply is there: its frames are on stdout"),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_TIMEOUT, "no answer from titanic.reply in time (no broker or no Titanic?)"),
        (
            EXIT_REMOTE_ERROR,
            "the reply is the worker's error (its handler failed), or Titanic failed (500)",
        ),
        (EXIT_PENDING, "stored, not answered yet: fetch again later"),
        (EXIT_UNKNOWN, "unknown id: never stored, closed, expired or given up; do not retry"),
    ],
    "close": [
        (EXIT_OK, "closed: Titanic has forgotten the request and its reply (or never knew it)"),
        (EXIT_ERROR, _BUG),
        (EXIT_USAGE, "usage error: bad arguments or options"),
        (EXIT_TIMEOUT, "no answer from titanic.close in time (no broker or no Titanic?)"),
        (EXIT_REMOTE_ERROR, "Titanic could not delete it (500)"),
    ],
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
FUZZ_DIALECTS: Final = ("mdp02", "mdp01", "majortomo", "memo01", "dcp", "emqp")  # dialect.DIALECTS+


def _only_leaf(error: BaseException) -> BaseException:
    """The one exception inside (nested) groups of one, or ``error`` itself."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _exit_code_for(command: str, error: BaseException) -> int:
    """Report an expected failure in one line; re-raise anything else (a bug)."""
    if isinstance(error, KeyboardInterrupt):  # SIGINT before a signal receiver was set up
        return EXIT_INTERRUPTED if command in ("call", "report") else EXIT_OK
    if isinstance(error, zmq.ZMQError):
        print(f"domo {command}: endpoint error: {error}", file=sys.stderr)
        return EXIT_ENDPOINT
    raise error


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


def _add_memory_bounds(sub: argparse.ArgumentParser, defaults: BrokerConfig) -> None:
    """The broker's byte bounds (specs/mdp-0.2.md, MDP-D-25 to MDP-D-27, MDP-D-30, MDP-D-32;
    docs/reliability.md)."""
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
        help="the requests held at once, all clients together, each counted as its body plus "
        f"{REQUEST_OVERHEAD} bytes; a request that would go over is refused "
        f"(default: {defaults.max_held_bytes // mib}MiB)",
    )
    sub.add_argument(
        "--max-peer-bytes",
        type=_byte_size,
        default=defaults.max_peer_bytes,
        metavar="SIZE",
        help="what one peer's pipe may hold each way: its high-water mark is this over "
        "--max-message-bytes messages; a client that does not read its replies is dropped at "
        f"that mark; at least 4 x --max-message-bytes (default: "
        f"{defaults.max_peer_bytes // mib}MiB)",
    )
    sub.add_argument(
        "--max-pending-bytes",
        type=_byte_size,
        default=defaults.max_pending_bytes,
        metavar="SIZE",
        help="what all peers' outbound pipes may hold together, in messages of 64KiB or more "
        "not yet written to the network; a message that would go over is not sent and its "
        "peer is treated as one whose pipe is full (default: "
        f"{defaults.max_pending_bytes // mib}MiB)",
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


METRICS_HINT: Final = (
    "needs prometheus-client, the metrics extra: pip install 'domo[metrics]' (from a checkout: "
    "pip install '.[metrics]')"
)


def _metrics_missing(what: str) -> bool:
    """Whether the metrics extra is missing; if so, says on stderr what needs it (``what``:
    "domo status", "domo broker: --metrics") and how to install it. Checked before the first
    use, because ``domo.metrics`` imports prometheus-client only where it is used."""
    if importlib.util.find_spec("prometheus_client") is not None:
        return False
    print(f"{what} {METRICS_HINT}", file=sys.stderr)
    return True


def _nng_installed() -> bool:
    """Whether the nng extra (pynng, cbor2) is importable, without importing it."""
    return all(importlib.util.find_spec(name) is not None for name in ("pynng", "cbor2"))


def _endpoint_to_bind_or_connect(schemes: Sequence[str], text: str) -> str:
    """As ``_endpoint``, where whether it is bound is known only once every option is read."""
    try:
        return check_endpoint(text, bind=True, schemes=schemes)
    except EndpointError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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


LARGE_BODY: Final = 16 * 1024 * 1024  # bytes: a body that takes a while to cross loopback


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
