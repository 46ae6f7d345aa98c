"""``domo bench``: drive load at a running broker's service and report throughput and latency."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time

import trio

from domo.trio import (
    Client,
    RequestError,
)

from ._common import (
    EXIT_FAILED_REQUESTS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    _add_connect_option,
    _count,
    _positive_float,
    _positive_int,
    _service,
    _stop_on_signal,
    _subcommand,
)
from ._load import DemoLoad, _demo_load, _json_load_report, _percentiles, _quiet


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
