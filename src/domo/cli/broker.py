"""``domo broker``: serve MDP/0.2 (and the family's other dialects) on one or more endpoints,
with optional CURVE, metrics and traces; the late-worker hint in its log.
"""

from __future__ import annotations

import argparse
import signal
import sys
from functools import partial
from typing import Final

import trio

from domo import eventlog
from domo.curve import (
    AllowList,
    CurveError,
    CurveServer,
    load_keypair,
)
from domo.endpoints import EndpointError, check_endpoint
from domo.protocol import BrokerConfig
from domo.protocol.events import (
    BrokerEvent,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    WorkerDisconnected,
    WorkerExpired,
)
from domo.runtime import memory
from domo.trio import (
    serve_broker,
)
from domo.trio.broker import NNG_EXTRA_HINT, NNG_SCHEME

from . import _common
from ._common import (
    BIND_SCHEMES,
    DEFAULT_ENDPOINT,
    EXIT_ENDPOINT,
    EXIT_OK,
    EXIT_USAGE,
    LARGE_BODY,
    _add_heartbeat_options,
    _add_memory_bounds,
    _AppendDistinctEndpoint,
    _count,
    _endpoint,
    _graceful_stop,
    _metrics_missing,
    _positive_float,
    _subcommand,
    logger,
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    nng_state = "" if _common._nng_installed() else " (not installed here)"
    sub.add_argument(
        "--bind",
        action=_AppendDistinctEndpoint,
        metavar="ENDPOINT",
        type=_broker_endpoint,
        help=f"endpoint to bind, one socket each; repeat for several (tcp://, ipc://, "
        f"inproc://); a tcp port of 0 picks a free one (default: {DEFAULT_ENDPOINT}). "
        f"nng+tcp://HOST:PORT or nng+ipc:///PATH binds an NNG rep0 socket serving MemoDB's "
        f"memo01 protocol (specs/memo01.md) on the same broker; it needs the nng extra, "
        f"pip install 'domo[nng]'{nng_state}",
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


# --- domo broker ------------------------------------------------------------------------------


TRIM_INTERVAL: Final = 2.0  # seconds between two hand-backs of the heap's free pages


async def _trim_memory() -> None:
    """Give freed heap pages back to the system now and then (``domo.runtime.memory``): after a
    flood the broker's RSS comes back down instead of staying at its peak (issue 14)."""
    while True:
        memory.trim()  # a no-op off glibc
        await trio.sleep(TRIM_INTERVAL)


_BOUNDS: Final = ("max_message_bytes", "max_held_bytes", "max_peer_bytes", "max_pending_bytes")


def _as_options(text: str) -> str:
    """A ``BrokerConfig`` error in the words of the command line: field names as options."""
    for name in _BOUNDS:
        text = text.replace(name, "--" + name.replace("_", "-"))
    return text


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
            max_pending_bytes=args.max_pending_bytes,
        )
    except ValueError as bad:  # byte bounds that cannot hold the messages they must
        print(f"domo broker: {_as_options(str(bad))}", file=sys.stderr)
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
        if _metrics_missing("domo broker: --metrics"):
            return EXIT_USAGE
        from domo.metrics import BrokerMetrics, serve_metrics

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


def _broker_endpoint(text: str) -> str:
    """An argparse type: a ZeroMQ endpoint to bind, or an ``nng+`` one if the extra is here."""
    if not text.startswith(NNG_SCHEME):
        return _endpoint(BIND_SCHEMES, text)
    try:
        check_endpoint(text[len(NNG_SCHEME) :], bind=True, schemes=("tcp", "ipc"))
    except EndpointError as error:
        raise argparse.ArgumentTypeError(f"{text}: {error}") from None
    if not _common._nng_installed():  # looked up at each call: tests replace it
        raise argparse.ArgumentTypeError(f"{text}: {NNG_EXTRA_HINT}")
    return text
