"""``domo broker``: serve MDP/0.2 (and the family's other dialects) on one or more endpoints,
with optional CURVE, metrics and traces; the late-worker hint in its log.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Final

import trio

from domo import eventlog
from domo.curve import (
    AllowList,
    CurveError,
    CurveServer,
    NngTls,
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
from domo.runtime import fdlimit, memory
from domo.trio import (
    Drain,
    serve_broker,
)
from domo.trio.broker import NNG_EXTRA_HINT, NNG_SCHEME, NNG_TLS_SCHEME

from . import _common, _pair
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
        "every worker is sent DISCONNECT, and it exits 0 (with --drain, SIGTERM lets the requests "
        "in flight finish first). SIGHUP re-reads the allow-lists (or, "
        "without any, is logged) and never stops it.",
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
        f"memo01 protocol (specs/memo01.md) on the same broker, and nng+tls+tcp://HOST:PORT "
        f"the same over TLS with client certificates (--nng-tls-cert); it needs the nng extra, "
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
        "--drain",
        type=_positive_float,
        metavar="SECONDS",
        help="on SIGTERM, drain before stopping: take no new request (each is refused, "
        "logged and counted), let the ones in flight finish, then stop; at most SECONDS, after "
        "which what is left is given up (its clients resend). A second SIGTERM, or SIGINT, "
        "stops at once (specs/mdp-0.2.md, MDP-D-34; default: stop at once)",
    )
    sub.add_argument(
        "--busy-worker-timeout",
        type=_positive_float,
        default=defaults.busy_worker_timeout,
        metavar="SECONDS",
        help="how long a busy worker of a dialect whose workers do not heartbeat while they "
        "work (majortomo's, RFC 7's) may stay silent before it is taken for dead and its "
        "request re-dispatched (specs/family.md, FAM-09; default: %(default)s, majortomo's)",
    )
    sub.add_argument(
        "--max-client-requests",
        type=_count,
        default=defaults.max_client_requests,
        metavar="N",
        help="requests one client may have outstanding at once in a dialect that allows "
        "several (MDP/0.1 on a DEALER, DCP, eMQP; memo01: one NNG connection, its workers "
        "included); one more is refused, logged and counted in domo_requests_refused "
        "(specs/family.md, FAM-07; default: %(default)s)",
    )
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
    _pair.add_pair_options(sub)  # --primary/--backup: a Binary Star pair (specs/binary-star.md)
    sub.add_argument(
        "--nng-tls-cert",
        metavar="FILE",
        help="the broker's TLS certificate and private key (PEM, one file) for its "
        "nng+tls+tcp://HOST:PORT endpoints, memo01 on NNG's TLS transport; CURVE does not "
        "reach NNG, so under --curve-secret-file every NNG endpoint must be one of these",
    )
    sub.add_argument(
        "--nng-tls-allow-file",
        metavar="FILE",
        help="with --nng-tls-cert: the client and worker certificates (PEM) an nng+tls+tcp:// "
        "endpoint admits; a peer without a certificate it vouches for fails the handshake. "
        "SIGHUP re-reads it (and re-opens those endpoints)",
    )


# --- domo broker ------------------------------------------------------------------------------


TRIM_INTERVAL: Final = 2.0  # seconds between two hand-backs of the heap's free pages


async def _watch_open_files(watch: fdlimit.OpenFileWatch) -> None:
    """Say when the broker runs short of open files (``domo.runtime.fdlimit``): past its limit
    ZeroMQ refuses new peers without a word."""
    while True:
        await trio.sleep(watch.every)
        watch.check(trio.current_time())


async def _trim_memory() -> None:
    """Give freed heap pages back to the system now and then (``domo.runtime.memory``): after a
    flood the broker's RSS comes back down instead of staying at its peak (issue 14)."""
    while True:
        memory.trim()  # a no-op off glibc
        await trio.sleep(TRIM_INTERVAL)


_BOUNDS: Final = (
    "max_message_bytes",
    "max_held_bytes",
    "max_peer_bytes",
    "max_pending_bytes",
    "max_client_requests",
)


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
            max_client_requests=args.max_client_requests,
            busy_worker_timeout=args.busy_worker_timeout,
        )
    except ValueError as bad:  # byte bounds that cannot hold the messages they must
        print(f"domo broker: {_as_options(str(bad))}", file=sys.stderr)
        return EXIT_USAGE
    completed = 0
    late_workers = LateWorkerWatch(config)
    pair = _pair.make_pair(args)  # None unless --primary or --backup

    def on_event(event: BrokerEvent) -> None:
        nonlocal completed
        if isinstance(event, RequestCompleted):
            completed += 1
        late_workers.on_event(event)

    if args.trace_dir is not None and (error := _check_trace_dir(args.trace_dir)) is not None:
        print(f"domo broker: {error}", file=sys.stderr)
        return EXIT_USAGE
    # Each peer takes one of the broker's open files: as many as the system lets it have.
    open_files = fdlimit.OpenFileWatch(
        fdlimit.raise_open_file_limit(), logging.getLogger("domo.broker")
    )
    if args.metrics is not None:
        if _metrics_missing("domo broker: --metrics"):
            return EXIT_USAGE
        from domo.metrics import BrokerMetrics, serve_metrics

        metrics = BrokerMetrics(config)
        if pair is not None:
            _pair.pair_metrics(metrics.registry, pair)
        try:
            host, port = serve_metrics(args.metrics, metrics)
        except OSError as error:
            print(f"domo broker: cannot serve metrics at {args.metrics}: {error}", file=sys.stderr)
            return EXIT_ENDPOINT
        print(f"domo broker: metrics on http://{host}:{port}/metrics", flush=True)
        open_files.register_metrics(metrics.registry)
        counted = on_event

        def on_event(event: BrokerEvent) -> None:
            counted(event)
            metrics.on_event(event)

    drain = Drain(args.drain) if args.drain is not None else None
    serve = partial(
        serve_broker,
        config=config,
        on_event=on_event,
        trace_dir=args.trace_dir,
        curve=args.curve,
        nng_tls=args.nng_tls,
        drain=drain,
        admit=None if pair is None else pair.admit,
    )
    memory.fix_mmap_threshold()  # this process is a broker: large bodies go back when freed
    stopping = _graceful_stop("broker") if drain is None else _stop_after_drain(drain)
    async with _on_sighup(args.curve, args.nng_tls), stopping as stop:
        with stop:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_trim_memory)
                nursery.start_soon(_watch_open_files, open_files)
                bound: list[str] = await nursery.start(serve, *(args.bind or [DEFAULT_ENDPOINT]))
                if pair is not None:  # after the bind: the first state goes out when it serves
                    await nursery.start(pair.run)
                for endpoint in bound:
                    secured = _protection(endpoint, args.curve, args.nng_tls)
                    print(f"domo broker: listening on {endpoint}{secured}", flush=True)
                # After the endpoints: scripts read "listening on" first, and a failed bind
                # (exit 5) says only why it failed.
                print(f"domo broker: {open_files.budget.describe()}", flush=True)
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
    """Load the CURVE key pair and allow-list and the NNG TLS files now: a bad file, or an
    endpoint they would not cover, is a usage error (exit 2)."""
    _pair.check_pair_options(args)
    args.curve = None
    args.nng_tls = _prepare_nng_tls(args)
    if args.curve_secret_file is None:
        if args.curve_allow_file is not None:
            args.parser.error("--curve-allow-file needs --curve-secret-file")
        return
    for endpoint in args.bind or ():
        if endpoint.startswith(NNG_SCHEME) and not endpoint.startswith(NNG_TLS_SCHEME):
            args.parser.error(
                f"--bind {endpoint}: CURVE does not cover NNG endpoints, and a memo01 peer "
                "there would be served without a key; with --curve-secret-file bind "
                f"{NNG_TLS_SCHEME}HOST:PORT with --nng-tls-cert and --nng-tls-allow-file "
                "instead (docs/security.md)"
            )
    try:
        keys = load_keypair(args.curve_secret_file)
        allow = None if args.curve_allow_file is None else AllowList(args.curve_allow_file)
    except CurveError as error:
        args.parser.error(str(error))
    if allow is not None and not len(allow):
        logger.warning("the allow-list %s is empty: no peer can connect", args.curve_allow_file)
    args.curve = CurveServer(keys, allow)


def _prepare_nng_tls(args: argparse.Namespace) -> NngTls | None:
    """The NNG TLS settings, checked now: both files, and an nng+tls+tcp:// endpoint to use them."""
    tls_endpoints = [e for e in args.bind or () if e.startswith(NNG_TLS_SCHEME)]
    given = args.nng_tls_cert is not None, args.nng_tls_allow_file is not None
    if not tls_endpoints:
        if any(given):
            args.parser.error(
                "--nng-tls-cert and --nng-tls-allow-file are for nng+tls+tcp:// endpoints; "
                "none is bound"
            )
        return None
    if not all(given):
        args.parser.error(
            f"--bind {tls_endpoints[0]} needs --nng-tls-cert (the broker's certificate and "
            "key) and --nng-tls-allow-file (the peers' certificates)"
        )
    try:
        tls = NngTls(args.nng_tls_cert, args.nng_tls_allow_file)
        from domo.trio._nng import tls_server_config

        tls_server_config(tls)  # NNG reads the files as it will at the bind
    except CurveError as error:
        args.parser.error(str(error))
    return tls


def _protection(endpoint: str, curve: CurveServer | None, nng_tls: NngTls | None) -> str:
    """What the startup line says protects ``endpoint``: only what really covers it (CURVE
    does not reach NNG nor inproc://, where libzmq runs no handshake)."""
    if endpoint.startswith(NNG_TLS_SCHEME) and nng_tls is not None:
        return " (TLS)"
    if endpoint.startswith(NNG_SCHEME) or curve is None:
        return ""
    return " (in-process, no CURVE)" if endpoint.startswith("inproc://") else " (CURVE)"


@asynccontextmanager
async def _stop_after_drain(drain: Drain) -> AsyncIterator[trio.CancelScope]:
    """As ``_graceful_stop``, but a first SIGTERM drains before it stops (MDP-D-34): no new
    request is taken, the ones in flight finish (at most ``drain.seconds``), then the scope is
    cancelled. SIGINT, or SIGTERM while draining, stops at once."""
    stop = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as watcher:

            async def stop_when_drained() -> None:
                if not await drain.wait():
                    logger.warning(
                        "broker: the drain's %g s are up; stopping with %d request(s) "
                        "outstanding, given up (their clients resend)",
                        drain.seconds,
                        drain.left,
                    )
                stop.cancel()

            async def watch() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if stop.cancel_called:
                        logger.info("broker: %s received while stopping; still stopping", name)
                    elif signum == signal.SIGTERM and not drain.requested.is_set():
                        logger.info(
                            "broker: SIGTERM received, draining for at most %g s (SIGTERM "
                            "again or SIGINT stops at once)",
                            drain.seconds,
                        )
                        drain.begin()
                        watcher.start_soon(stop_when_drained)
                    else:
                        logger.info("broker: %s received, stopping", name)
                        stop.cancel()

            watcher.start_soon(watch)
            try:
                yield stop
            finally:
                watcher.cancel_scope.cancel()


@asynccontextmanager
async def _on_sighup(curve: CurveServer | None, nng_tls: NngTls | None) -> AsyncIterator[None]:
    """For the broker's whole life, SIGHUP re-reads what can be re-read (the CURVE allow-list,
    the NNG TLS files) and is logged; it never stops the broker (issue 27: its default action
    killed a broker started without --curve-allow-file).

    SIGHUP is ignored before and after: a SIGHUP that comes while the receiver closes is
    delivered again by trio, and must not end the process then either.
    """
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with trio.open_signal_receiver(signal.SIGHUP) as hangups:
        async with trio.open_nursery() as nursery:

            async def reload() -> None:
                async for _ in hangups:
                    _reload(curve, nng_tls)

            nursery.start_soon(reload)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()


def _reload(curve: CurveServer | None, nng_tls: NngTls | None) -> None:
    """One SIGHUP: re-read the allow-lists (a bad file keeps the one in force)."""
    reloading = []
    if curve is not None and curve.allow is not None:
        reloading.append(f"the CURVE allow-list {curve.allow.path}")
    if nng_tls is not None:
        reloading.append(f"the NNG TLS files {nng_tls.cert_file} and {nng_tls.allow_file}")
    if not reloading:
        logger.info(
            "SIGHUP received: nothing to reload (no --curve-allow-file, no --nng-tls-cert); "
            "still serving"
        )
        return
    logger.info("SIGHUP received: reloading %s", " and ".join(reloading))
    if curve is not None and curve.allow is not None:
        curve.allow.reload()
    if nng_tls is not None:
        nng_tls.reload()


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
                    "works (MDP-H-04; majortomo's and RFC 7's workers do not, and get "
                    "--busy-worker-timeout, %.3g s, instead), or its heartbeat interval is "
                    "longer than this broker's %.3g s (broker and workers must use the same "
                    "--heartbeat-interval and --liveness)",
                    eventlog.peer_text(event.peer),
                    self.config.liveness * self.config.heartbeat_interval,
                    self.config.busy_span,
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
    url = text[len(NNG_SCHEME) :]
    try:
        if url.startswith("tls+tcp://"):  # NNG's TLS transport: checked as the tcp:// under it
            check_endpoint(url.removeprefix("tls+"), bind=True, schemes=("tcp",))
        else:
            check_endpoint(url, bind=True, schemes=("tcp", "ipc"))
    except EndpointError as error:
        raise argparse.ArgumentTypeError(f"{text}: {error}") from None
    if not _common._nng_installed():  # looked up at each call: tests replace it
        raise argparse.ArgumentTypeError(f"{text}: {NNG_EXTRA_HINT}")
    return text
