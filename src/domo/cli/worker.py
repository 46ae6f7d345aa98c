"""``domo worker SERVICE``: serve a service with the echo handler or a command (``--exec``),
and tell the user when the broker seems gone or deaf.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
from collections.abc import Callable
from functools import partial
from typing import Final

import trio

from domo.protocol import WorkerConfig
from domo.protocol.events import (
    ReconnectRequired,
    WorkerConnected,
)
from domo.trio import (
    Handler,
    run_worker,
)
from domo.trio.command import command_handler

from ._common import (
    EXIT_OK,
    _add_connect_option,
    _add_curve_client_options,
    _add_heartbeat_options,
    _graceful_stop,
    _positive_float,
    _positive_int,
    _prepare_curve_client,
    _service,
    _subcommand,
    logger,
)
from ._probe import probe


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        "--shell",
        action="store_true",
        help="run CMD with /bin/sh -c, for pipes, redirections and $VARIABLES (without it, a "
        "CMD that needs a shell is refused at start)",
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
    if args.shell:
        if not args.exec_command.strip():
            args.parser.error("--exec: empty command")
        args.exec_argv = ["/bin/sh", "-c", args.exec_command]
        return
    try:
        argv = shlex.split(args.exec_command)
    except ValueError as error:
        args.parser.error(f"--exec: {error}")
    if not argv:
        args.parser.error("--exec: empty command")
    syntax = shell_syntax(args.exec_command)
    if syntax is not None:
        args.parser.error(
            f"--exec runs CMD without a shell, and {args.exec_command!r} has shell syntax "
            f"({syntax}): give --shell to run it with /bin/sh -c"
        )
    if shutil.which(argv[0]) is None:
        args.parser.error(f"--exec: command not found: {argv[0]!r}")
    args.exec_argv = argv


_SHELL_CHARACTERS: Final = {
    "|": "a pipe '|'",
    "&": "'&'",
    ";": "';'",
    "<": "a redirection '<'",
    ">": "a redirection '>'",
    "(": "'('",
    ")": "')'",
    "$": "a '$' expansion",
    "`": "a '`' substitution",
}


def shell_syntax(command: str) -> str | None:
    """The first character of ``command`` that a shell would take as syntax (a pipe, a
    redirection, an expansion...) outside quotes, or in double quotes for '$' and '`'; None if
    splitting it like a shell (``shlex``) and running it without one does the same."""
    quote = ""
    escaped = False
    for char in command:
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
            elif quote == '"' and char in "$`":
                return _SHELL_CHARACTERS[char]
        elif char in "'\"":
            quote = char
        elif char in _SHELL_CHARACTERS:
            return _SHELL_CHARACTERS[char]
    return None


async def _worker(args: argparse.Namespace) -> int:
    handler: Handler = _echo
    serving = "(built-in echo)"
    if args.exec_argv is not None:
        handler = command_handler(args.service, args.exec_argv, args.exec_timeout)
        serving = f"by running {args.exec_command!r}"
    config = WorkerConfig(heartbeat_interval=args.heartbeat_interval, liveness=args.liveness)
    watch = BrokerWatch(args.connect, config)
    endpoints = args.connects or [args.connect]  # failover order (MDP-D-28)
    watch.peer_there = len(endpoints) > 1  # one endpoint: look_underneath says

    def say_serving() -> None:
        print(
            f"domo worker: serving {args.service!r} {serving} at {args.connect}, "
            f"{args.concurrency} at a time",
            flush=True,
        )

    watch.on_first_answer = say_serving

    async def look_underneath() -> None:
        """The first connection given up before the broker ever answered: say what is (not) at
        the endpoint (domo.cli._probe)."""
        await watch.silent.wait()
        if watch.answered:
            return
        found = await probe(args.connect, PROBE_WAIT, args.curve)
        watch.peer_there = found is None  # only then can silent connects mean more
        if found is not None and not watch.answered:
            logger.warning(
                "cannot reach a broker at %s (still trying: it serves once one answers there): %s",
                args.connect,
                found,
            )

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
                await nursery.start(work, endpoints, args.service, handler)
                if not watch.answered:
                    where = " or ".join(endpoints)
                    print(f"domo worker: waiting for the broker at {where}", flush=True)
                    if len(endpoints) == 1:
                        nursery.start_soon(look_underneath)
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
    first HEARTBEAT is due. That is said once, with what to check. The mirror case: a broker that
    sends DISCONNECT and answers the next READY at once had given the worker up, which is what
    happens to a worker whose interval is longer than the broker's; said once too.
    """

    STRIKES: Final = 2  # silent connects in a row before the hint

    def __init__(self, endpoint: str, config: WorkerConfig) -> None:
        self.endpoint = endpoint
        self.config = config
        self.answered = False  # the broker was heard at least once
        self.heard_since_connect = False
        self.silent_connects = 0
        self.hinted = False
        # Whether a ZeroMQ peer completed a handshake at the endpoint (``_probe``): until then,
        # silent connects may just mean nothing is there, which the probe says better. True
        # where no probe runs (several endpoints).
        self.peer_there = True
        self.silent = trio.Event()  # a connection given up, never answered: time to look
        self.disconnected = False  # the broker sent DISCONNECT on a connection it had answered
        self.expiry_hinted = False
        self.on_first_answer: Callable[[], None] = lambda: None

    def heard(self) -> None:
        """The broker's first message on a new connection: only now is the worker connected."""
        self.heard_since_connect = True
        self.silent_connects = 0
        logger.info("connected: the broker at %s answered", self.endpoint)
        if self.disconnected and not self.expiry_hinted:
            # A broker that sent DISCONNECT and answers the next READY at once is running: it
            # had given this worker up. A worker heartbeating less often than the broker
            # expects is expired between its heartbeats, every time.
            self.expiry_hinted = True
            logger.warning(
                "the broker at %s sent DISCONNECT and took this worker back at once: unless it "
                "was restarted just now, it had given the worker up, as a broker does one whose "
                "--heartbeat-interval (here %.3g s) is longer than its own (they must match)",
                self.endpoint,
                self.config.heartbeat_interval,
            )
        self.disconnected = False
        if not self.answered:
            self.answered = True
            self.on_first_answer()

    def on_event(self, event: object) -> None:
        if isinstance(event, WorkerConnected):
            self.heard_since_connect = False
        elif isinstance(event, ReconnectRequired) and event.reason == "broker-disconnect":
            self.disconnected = self.heard_since_connect
        elif isinstance(event, ReconnectRequired) and event.reason == "broker-lost":
            if self.heard_since_connect:
                self.silent_connects = 0
                return
            self.silent_connects += 1
            self.silent.set()  # look_underneath, once
            # A broker heard before has an interval that fits (its HEARTBEAT came in time):
            # losing it later has other causes (it stopped, or a large body held the line).
            if (
                self.silent_connects >= self.STRIKES
                and self.peer_there
                and not self.hinted
                and not self.answered
            ):
                self.hinted = True
                span = self.config.liveness * self.config.heartbeat_interval
                logger.warning(
                    "nothing heard from the broker at %s within %.3g s of connecting, %d times "
                    "in a row: a ZeroMQ peer is there, but it is not an MDP broker, or its "
                    "heartbeat interval is longer than this worker's %.3g s (broker and worker "
                    "must use the same --heartbeat-interval and --liveness)",
                    self.endpoint,
                    span,
                    self.silent_connects,
                    self.config.heartbeat_interval,
                )


# The look underneath when the broker never answered (domo.cli._probe): once the first
# connection is given up for silence (liveness x interval after READY: a broker would have sent
# its first HEARTBEAT by then; not sooner, so that a peer playing the broker, as domo fuzz
# does, sees no extra connection while it takes its time), watching for up to PROBE_WAIT s.
PROBE_WAIT: Final = 2.0


async def _echo(body: list[bytes]) -> list[bytes]:
    return body
