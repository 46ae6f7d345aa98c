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
import itertools
import logging
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

import trio
import zmq

from domo import __version__
from domo.protocol import BrokerConfig, WorkerConfig, mdp
from domo.protocol.events import BrokerEvent, RequestCompleted, WorkerRegistered
from domo.trio import (
    Client,
    Handler,
    RemoteError,
    RequestFailed,
    RequestTimeout,
    ZmqTransport,
    run_worker,
    serve_broker,
)
from domo.trio.errors import error_body

__all__ = [
    "EXIT_ENDPOINT",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REMOTE_ERROR",
    "EXIT_TIMEOUT",
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
EXIT_FINDINGS: Final = 1  # fuzz: the target broke at least one rule
EXIT_INTERRUPTED: Final = 130  # call: stopped by SIGINT (128 + 2, the shell's convention)

DEFAULT_ENDPOINT: Final = "tcp://127.0.0.1:5555"
EXIT_CODES_HELP: Final = f"""\
exit codes:
  {EXIT_OK}    success; a broker, worker or demo stopped by SIGINT/SIGTERM
  {EXIT_ERROR}    unexpected error (a bug; a traceback is printed); fuzz: violations found
  {EXIT_USAGE}    usage error: bad arguments or options
  {EXIT_TIMEOUT}    call: no reply in time after every retry (broker unreachable, no worker,
       or the worker is too slow); fuzz: the target is unreachable
  {EXIT_REMOTE_ERROR}    call: the worker's handler failed (its error type and message on stderr)
  {EXIT_ENDPOINT}    an endpoint could not be bound or connected (address in use, bad address);
       fuzz: also an --exec command that cannot be started
  {EXIT_INTERRUPTED}  call: stopped by SIGINT (Ctrl-C); 143 by SIGTERM
"""
BIND_SCHEMES: Final = ("tcp", "ipc", "inproc")
CONNECT_SCHEMES: Final = ("tcp", "ipc")  # inproc reaches only sockets of the same process
FUZZ_TARGETS: Final = ("broker", "worker", "client")  # domo.fuzz.TARGETS, without Hypothesis


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``domo`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.prepare is not None:
        args.prepare(args)  # checks that need more than one option; exits 2 on a bad one
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    command: Callable[[argparse.Namespace], Awaitable[int]] = args.run
    try:
        return trio.run(command, args)
    except BaseException as error:
        return _exit_code_for(args.command, _only_leaf(error))


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
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version_text())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_broker(commands)
    _add_worker(commands)
    _add_call(commands)
    _add_demo(commands)
    _add_bench(commands)
    _add_fuzz(commands)
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
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.set_defaults(run=run, prepare=prepare, parser=sub)
    sub.add_argument(
        "--log-level",
        default=log_level,
        choices=["debug", "info", "warning", "error"],
        help=f"what to log on stderr (default: {log_level}; debug shows every request)",
    )
    return sub


def _add_broker(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = BrokerConfig()
    sub = _subcommand(
        commands,
        "broker",
        "run an MDP/0.2 broker",
        "Run an MDP/0.2 broker: one ROUTER socket for clients and workers, bound to every "
        "--bind endpoint. Prints each bound endpoint on stdout ('domo broker: listening on "
        "ENDPOINT'), then logs workers coming and going on stderr. SIGINT or SIGTERM stops it: "
        "every worker is sent DISCONNECT, and it exits 0.",
        _broker,
        "info",
    )
    sub.add_argument(
        "--bind",
        action="append",
        metavar="ENDPOINT",
        type=partial(_endpoint, BIND_SCHEMES),
        help=f"endpoint to bind; repeat for several (tcp://, ipc://, inproc://); a tcp port of "
        f"0 picks a free one (default: {DEFAULT_ENDPOINT})",
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
    sub.add_argument(
        "--trace-dir",
        metavar="DIR",
        help="write one Parquet trace record per request and per worker change into DIR "
        "(needs pip install 'domo[trace]'; schema in docs/traces.md)",
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
    _add_connect_option(sub)
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
    _add_connect_option(sub)
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
    sub.add_argument(
        "--raw",
        action="store_true",
        help="write reply frames to stdout as raw bytes, nothing added",
    )


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


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = _subcommand(
        commands,
        "bench",
        "load a running broker and its workers, with numbers",
        "Send requests of --size bytes to SERVICE at a running broker from --clients clients "
        "(each one request at a time, so --clients requests are in flight), --requests of them "
        "or for --duration seconds, and print the throughput and the p50/p99 latency. With the "
        "built-in echo service (`domo worker echo`) every reply is checked against its request. "
        "Exit 0 if every request got its FINAL (and, for echo, the right one), 1 if some failed, "
        "3 if none was answered.",
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


def _add_connect_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--connect",
        type=partial(_endpoint, CONNECT_SCHEMES),
        default=DEFAULT_ENDPOINT,
        metavar="ENDPOINT",
        help="the broker's endpoint, tcp:// or ipc:// (default: %(default)s)",
    )


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
        "for ever (e.g. `domo call --repeat 0`). Use a short --heartbeat-interval and give the "
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
        type=partial(_endpoint, CONNECT_SCHEMES),
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
        default=0,
        metavar="N",
        help="seed of the search; the same seed repeats a run (default: %(default)s)",
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
    if args.replay is not None and not args.replay.is_file():
        args.parser.error(f"--replay: no such file: {args.replay}")
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
        print(f"domo fuzz needs hypothesis (pip install 'domo[fuzz]'): {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.heartbeat_interval > 0.5:
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
        return EXIT_TIMEOUT
    except ValueError as error:  # an endpoint that cannot be bound, a command that cannot start
        print(f"domo fuzz: {error}", file=sys.stderr)
        return EXIT_ENDPOINT
    for finding in result.findings:
        print(fuzz.format_finding(finding, options.target))
    if result.never_served:
        print(f"domo fuzz: no scenario could run: {result.never_served}")
    print(
        f"domo fuzz: {options.target}: {result.examples} scenarios in {result.seconds:.1f} s; "
        f"{len(result.findings)} rule(s) broken: {', '.join(result.rules) or 'none'}"
    )
    return EXIT_FINDINGS if result.findings else EXIT_OK


def _add_heartbeat_options(sub: argparse.ArgumentParser, interval: float, liveness: int) -> None:
    sub.add_argument(
        "--heartbeat-interval",
        type=_positive_float,
        default=interval,
        metavar="SECONDS",
        help="seconds between heartbeats; broker and workers must agree (default: %(default)s)",
    )
    sub.add_argument(
        "--liveness",
        type=_positive_int,
        default=liveness,
        metavar="N",
        help="the peer is lost after N heartbeat intervals of silence; broker and workers "
        "must agree (default: %(default)s)",
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


def _service(text: str) -> str:
    if not mdp.is_valid_service(text.encode("utf-8", "replace")):
        raise argparse.ArgumentTypeError(
            f"a service name is 1-255 printable ASCII characters, got {text!r}"
        )
    return text


def _endpoint(schemes: Sequence[str], text: str) -> str:
    scheme, separator, address = text.partition("://")
    if not separator or not address:
        raise argparse.ArgumentTypeError(f"not an endpoint (e.g. {DEFAULT_ENDPOINT}): {text!r}")
    if scheme not in schemes:
        hint = "; inproc:// works only inside one process" if scheme == "inproc" else ""
        listed = ", ".join(f"{s}://" for s in schemes)
        raise argparse.ArgumentTypeError(f"{text!r}: use {listed}{hint}")
    return text


# --- domo broker ------------------------------------------------------------------------------


async def _broker(args: argparse.Namespace) -> int:
    config = BrokerConfig(
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        request_expiry=args.request_expiry,
        max_redispatches=args.max_redispatches,
    )
    completed = 0

    def count_completed(event: BrokerEvent) -> None:
        nonlocal completed
        if isinstance(event, RequestCompleted):
            completed += 1

    if args.trace_dir is not None and (error := _check_trace_dir(args.trace_dir)) is not None:
        print(f"domo broker: {error}", file=sys.stderr)
        return EXIT_USAGE
    serve = partial(serve_broker, config=config, on_event=count_completed, trace_dir=args.trace_dir)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            bound: list[str] = await nursery.start(serve, *(args.bind or [DEFAULT_ENDPOINT]))
            for endpoint in bound:
                print(f"domo broker: listening on {endpoint}", flush=True)
            await _stop_on_signal(signals, nursery.cancel_scope, "broker")
    print(f"domo broker: stopped; {completed} requests completed", flush=True)
    return EXIT_OK


def _check_trace_dir(directory: str) -> str | None:
    """Why tracing to ``directory`` cannot work (no pyarrow, not writable), or None."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return "--trace-dir needs pyarrow: pip install 'domo[trace]'"
    from domo.trace import TraceDirError, check_trace_dir

    try:
        check_trace_dir(directory)
    except TraceDirError as exc:
        return str(exc)
    return None


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
    work = partial(run_worker, config=config, concurrency=args.concurrency)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(work, args.connect, args.service, handler)
            print(
                f"domo worker: serving {args.service!r} {serving} at {args.connect}, "
                f"{args.concurrency} at a time",
                flush=True,
            )
            await _stop_on_signal(signals, nursery.cancel_scope, "worker")
    print("domo worker: stopped", flush=True)
    return EXIT_OK


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
    client = Client(args.connect, timeout=args.timeout, retries=args.retries)
    async with client:
        for _ in itertools.count() if args.repeat == 0 else range(args.repeat):
            code = await _request_once(client, args) or code
    return code


async def _request_once(client: Client, args: argparse.Namespace) -> int:
    write = _write_raw if args.raw else _write_text
    try:
        async with client.stream(args.service, *args.frames) as replies:
            async for reply in replies:
                write(reply.body)
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
            f"{error.attempts} attempt(s); is the broker up and a worker serving it? "
            f"(`domo call mmi.service {shlex.quote(args.service)}` asks the broker)",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    return EXIT_OK


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
    print(
        f"domo bench: {args.clients} clients -> {args.service!r} at {args.connect}, "
        f"{args.size}-byte bodies, {amount}",
        flush=True,
    )
    load = DemoLoad()
    body = b"x" * args.size
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as load_scope:
                nursery.start_soon(_stop_on_signal, signals, load_scope, "bench")
                started = time.perf_counter()
                await _demo_load(
                    args.connect, None, args.clients, requests, args.duration, load,
                    service=args.service, body_for=lambda n: body, reply_timeout=args.timeout,
                    retries=args.retries,
                )  # fmt: skip
            elapsed = time.perf_counter() - started
            nursery.cancel_scope.cancel()
    done = len(load.latencies)
    print(
        f"requests done: {done} in {elapsed:.2f} s ({load.failed} failed"
        + (f", {load.wrong} wrong replies)" if args.service == "echo" else ")")
    )
    if not done:
        print(
            f"domo bench: no reply from {args.service!r} at {args.connect}; is the broker up and "
            "a worker serving it?",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    p50, p99 = _percentiles(load.latencies)
    print(f"throughput: {done / elapsed:.0f} requests/s")
    print(
        f"latency: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
        f"max {max(load.latencies) * 1000:.2f} ms",
        flush=True,
    )
    return EXIT_ERROR if load.failed or load.wrong else EXIT_OK


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
    print(
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
            print(f"workers registered: {len(registered)} of {args.workers} in {took:.1f} ms")
            with trio.CancelScope() as load_scope:
                nursery.start_soon(_stop_on_signal, signals, load_scope, "demo")
                started = time.perf_counter()
                await _demo_load(endpoint, context, args.clients, requests, args.duration, load)
            elapsed = time.perf_counter() - started
            nursery.cancel_scope.cancel()
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
                except RequestFailed:
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
    return EXIT_ERROR if load.failed or load.wrong else EXIT_OK


def _percentiles(samples: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile of ``samples`` (not empty)."""
    if len(samples) < 2:
        return samples[0], samples[0]
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return statistics.median(samples), cuts[98]
