"""``domo call SERVICE [BODY ...]``: one request, its reply on stdout (text, raw or JSON), and
why none came when it times out.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import signal
import sys
from typing import Final

import trio

from domo.protocol import BrokerConfig
from domo.trio import (
    Client,
    RemoteError,
    RequestError,
    RequestTimeout,
)

from ._common import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REMOTE_ERROR,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    LARGE_BODY,
    _add_connect_option,
    _add_curve_client_options,
    _count,
    _positive_float,
    _prepare_curve_client,
    _service,
    _stop_on_signal,
    _subcommand,
)
from ._probe import probe

# A resent request is a second run of the work: MDP/0.2 has no way to call the first one off.
# So the call waits longer than a worker's default command limit (domo worker --exec-timeout,
# 30 s) before it resends; no broker is said at once anyway (``probe``), and no worker is said
# as soon as the broker says so (mmi.service).
CALL_TIMEOUT: Final = 35.0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        default=CALL_TIMEOUT,
        metavar="SECONDS",
        help="wait this long for a reply (or the next PARTIAL) before resending the request on "
        "a new socket; longer than domo worker's --exec-timeout by default, so a slow command "
        "is not run again for each resend, and one that runs out of time is reported by its "
        "worker (default: %(default)s)",
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
        for number in itertools.count() if args.repeat == 0 else range(args.repeat):
            if number == 0 and len(endpoints) == 1 and args.repeat == 1:
                outcome = await _first_request(client, args)
                if isinstance(outcome, str):
                    print(
                        f"domo call: cannot reach a broker at {args.connect}: {outcome}",
                        file=sys.stderr,
                    )
                    return EXIT_UNREACHABLE
                code = outcome or code
            else:
                code = await _request_once(client, args) or code
    return code


# The look underneath a single request (domo.cli._probe; not with --repeat, a load or a
# fuzzer's client, nor with several brokers): set off when no reply came within PROBE_AFTER
# seconds (most replies come sooner, and a probe is a connection the broker sees come and go),
# for up to PROBE_WAIT seconds of watching.
PROBE_AFTER: Final = 0.3
PROBE_WAIT: Final = 1.0
NOTE_FROM: Final = 2.0  # seconds of --timeout from which "no worker ... yet" is worth a line


async def _first_request(client: Client, args: argparse.Namespace) -> int | str:
    """The first request, with ``probe`` beside it: its exit code, or what the probe saw (a
    phrase) if no ZeroMQ peer is at the endpoint. That way no broker is said within about a
    second and a half, not after every retry (11 s with the defaults)."""
    outcome: int | str = EXIT_ERROR

    async def look_underneath(scope: trio.CancelScope) -> None:
        nonlocal outcome
        await trio.sleep(PROBE_AFTER)
        unreachable = await probe(args.connect, PROBE_WAIT, args.curve)
        if unreachable is not None:
            outcome = unreachable
            scope.cancel()
        elif (
            args.timeout >= NOTE_FROM
            and not args.service.startswith("mmi.")
            and not await _has_worker(args)
        ):
            print(
                f"domo call: no worker serves {args.service!r} at {args.connect} yet; the "
                f"request waits for one in the broker's queue (resent after --timeout "
                f"{args.timeout:g} s; Ctrl-C stops)",
                file=sys.stderr,
                flush=True,
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(look_underneath, nursery.cancel_scope)
        outcome = await _request_once(client, args)
        nursery.cancel_scope.cancel()
    return outcome


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


def _write_json_reply(frames: list[bytes], final: bool) -> None:
    """One reply as one JSON line (``call --json``): every frame as text if all are UTF-8,
    else every frame in base64, so a reader decodes one message one way."""
    try:
        shown, encoding = [frame.decode("utf-8") for frame in frames], "utf-8"
    except UnicodeDecodeError:
        shown, encoding = [base64.b64encode(frame).decode("ascii") for frame in frames], "base64"
    line = {"reply": "final" if final else "partial", "frames": shown, "encoding": encoding}
    print(json.dumps(line), flush=True)


async def _has_worker(args: argparse.Namespace) -> bool:
    """Whether the broker says a worker serves the service (mmi.service; one short try, and
    True if the broker does not answer it: nothing is then known)."""
    async with Client(args.connect, timeout=1.0, retries=0, curve=args.curve) as client:
        try:
            answer = await client.request("mmi.service", args.service.encode())
        except RequestError:
            return True
    return answer[:1] == [b"200"]


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
        f"a worker serves {args.service!r}, yet no reply came: either the work takes longer "
        f"than --timeout {args.timeout:g} s (give it more time, e.g. --timeout "
        f"{args.timeout * 4:g}), or the broker gave the request up, which MDP cannot tell a "
        "client: its log says why (RequestDropped; 'redispatch-limit' when its workers keep "
        "being lost with it, as a worker whose --heartbeat-interval differs from the "
        f"broker's is){repeated}"
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
