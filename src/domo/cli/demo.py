"""``domo demo``: a broker, workers and clients in one process, to see domo work in a second."""

from __future__ import annotations

import argparse
import signal
import time
from functools import partial

import trio
import zmq

from domo.protocol.events import (
    BrokerEvent,
    RequestCompleted,
    WorkerRegistered,
)
from domo.trio import (
    ZmqTransport,
    run_worker,
    serve_broker,
)

from ._common import (
    BIND_SCHEMES,
    EXIT_FAILED_REQUESTS,
    EXIT_OK,
    _endpoint,
    _positive_float,
    _positive_int,
    _stop_on_signal,
    _subcommand,
)
from ._load import DemoLoad, _demo_load, _demo_report, _json_load_report, _quiet
from .worker import _echo


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
