"""memo01 round trips through domo, beside a plain pynng req/rep echo and MDP/0.2 through domo.

Three systems, measured in one run, interleaved over repetitions so that a noisy neighbour hits
them alike, each a sequential round trip of a 32-byte body on tcp loopback:

- ``pynng echo``: a req0 context to a rep0 echo server, no broker (the floor NNG sets);
- ``memo01 via domo``: a memo01 client (req0 context, CBOR header) to a memo01 worker, both
  written with pynng and cbor2 alone, through ``domo broker`` on an ``nng+tcp://`` endpoint;
- ``MDP/0.2 via domo``: a hand-framed pyzmq DEALER client to a hand-framed DEALER worker,
  through the same broker process on its ``tcp://`` endpoint.

The peers are minimal loops, not domo's client and worker runtimes, so that the ratios compare
the broker and the transport, not the peers' libraries. The broker is one process serving both
endpoints (``serve_broker``, one core). Each repetition reports the median round trip (wall
clock: the three processes' CPU is what a round trip costs) per system; the table gives the
median over repetitions and the ratios memo01/pynng and memo01/MDP. Every reply is checked.

Usage: ``python benchmarks/memo01_bench.py [--quick] [--reps N] [--requests N] [--json FILE]``.
Needs the nng extra (``pip install '.[nng]'``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import cbor2
import pynng
import zmq

BODY = b"x" * 32
SYSTEMS = ("pynng echo", "memo01 via domo", "MDP/0.2 via domo")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _header(*items: object) -> bytes:
    return cbor2.dumps(["memo01", *items], canonical=True)


def _split(message: bytes) -> tuple[list[object], bytes]:
    stream = io.BytesIO(message)
    return cbor2.CBORDecoder(stream).decode(), message[stream.tell() :]


# -- the processes -----------------------------------------------------------------------------


def run_pynng_echo(url: str) -> None:
    with pynng.Rep0(listen=url) as rep:
        print("ready", flush=True)
        while True:
            rep.send(rep.recv())


def run_broker(zmq_endpoint: str, nng_endpoint: str) -> None:
    import trio

    from domo.trio import serve_broker

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_broker, zmq_endpoint, nng_endpoint)
            print("ready", flush=True)

    trio.run(serve)


def run_memo01_worker(url: str) -> None:
    with pynng.Req0(dial=url) as req:
        context = req.new_context()
        context.send(_header(1, b"", ["echo"]))
        print("ready", flush=True)
        while True:
            (_, kind, worker_id, *_), payload = _split(context.recv())
            if kind == 2:
                context.send(_header(3, worker_id) + payload)
            elif kind == 4:
                context.send(_header(4, worker_id))
            else:
                context.send(_header(1, b"", ["echo"]))


def run_mdp_worker(endpoint: str) -> None:
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as dealer:
        dealer.connect(endpoint)
        dealer.send_multipart([b"MDPW02", b"\x01", b"echo"])
        print("ready", flush=True)
        while True:
            frames = dealer.recv_multipart()
            if frames[1] == b"\x02":  # REQUEST: client address, "", body
                dealer.send_multipart([b"MDPW02", b"\x04", frames[2], b"", *frames[4:]])
            elif frames[1] == b"\x05":
                dealer.send_multipart([b"MDPW02", b"\x05"])


# -- the client side (this process) --------------------------------------------------------------


def pynng_round_trips(url: str) -> Callable[[int], list[float]]:
    req = pynng.Req0(dial=url)
    context = req.new_context()

    def run(count: int) -> list[float]:
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            context.send(BODY)
            reply = context.recv()
            samples.append(time.perf_counter() - start)
            assert reply == BODY, reply
        return samples

    run.close = lambda: (context.close(), req.close())  # type: ignore[attr-defined]
    return run


def memo01_round_trips(url: str) -> Callable[[int], list[float]]:
    req = pynng.Req0(dial=url)
    context = req.new_context()
    job = _header(2, b"", "echo", 5000) + BODY
    result = _header(3, b"") + BODY

    def run(count: int) -> list[float]:
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            context.send(job)
            reply = context.recv()
            samples.append(time.perf_counter() - start)
            assert reply == result, reply
        return samples

    run.close = lambda: (context.close(), req.close())  # type: ignore[attr-defined]
    return run


def mdp_round_trips(
    endpoint: str, ctx: zmq.Context[zmq.Socket[bytes]]
) -> Callable[[int], list[float]]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    request = [b"MDPC02", b"\x01", b"echo", BODY]
    final = [b"MDPC02", b"\x03", b"echo", BODY]

    def run(count: int) -> list[float]:
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            dealer.send_multipart(request)
            reply = dealer.recv_multipart()
            samples.append(time.perf_counter() - start)
            assert reply == final, reply
        return samples

    run.close = dealer.close  # type: ignore[attr-defined]
    return run


@contextmanager
def _process(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == b"ready", f"{args[0]} did not start: {line!r}"
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)  # only processes this script started
        process.wait(timeout=10)


def bench(args: argparse.Namespace) -> dict[str, object]:
    requests = 200 if args.quick else args.requests
    reps = args.reps or (3 if args.quick else 7)
    echo_url = f"tcp://127.0.0.1:{_free_port()}"
    zmq_endpoint = f"tcp://127.0.0.1:{_free_port()}"
    nng_url = f"tcp://127.0.0.1:{_free_port()}"
    medians: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    with ExitStack() as stack, zmq.Context() as ctx:
        stack.enter_context(_process("pynng-echo", echo_url))
        stack.enter_context(_process("broker", zmq_endpoint, f"nng+{nng_url}"))
        stack.enter_context(_process("memo01-worker", nng_url))
        stack.enter_context(_process("mdp-worker", zmq_endpoint))
        runs = {
            "pynng echo": pynng_round_trips(echo_url),
            "memo01 via domo": memo01_round_trips(nng_url),
            "MDP/0.2 via domo": mdp_round_trips(zmq_endpoint, ctx),
        }
        try:
            for run in runs.values():
                run(max(50, requests // 10))  # warm up (and the workers are registered)
            for _ in range(reps):
                for name, run in runs.items():
                    medians[name].append(statistics.median(run(requests)))
        finally:
            for run in runs.values():
                run.close()  # type: ignore[attr-defined]
    result = {name: statistics.median(values) for name, values in medians.items()}
    return {
        "script": "memo01_bench.py",
        "requests_per_rep": requests,
        "reps": reps,
        "body_bytes": len(BODY),
        "median_round_trip_us": {name: value * 1e6 for name, value in result.items()},
        "per_rep_median_us": {n: [v * 1e6 for v in vs] for n, vs in medians.items()},
        "ratio_memo01_to_pynng": result["memo01 via domo"] / result["pynng echo"],
        "ratio_memo01_to_mdp": result["memo01 via domo"] / result["MDP/0.2 via domo"],
    }


def main() -> None:
    roles: dict[str, Callable[..., None]] = {
        "pynng-echo": run_pynng_echo,
        "broker": run_broker,
        "memo01-worker": run_memo01_worker,
        "mdp-worker": run_mdp_worker,
    }
    if len(sys.argv) > 1 and sys.argv[1] in roles:
        roles[sys.argv[1]](*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds in all")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 7)")
    parser.add_argument("--requests", type=int, default=2000, help="round trips per rep")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    args = parser.parse_args()
    record = bench(args)
    medians = record["median_round_trip_us"]
    assert isinstance(medians, dict)
    print(
        f"{'system':<18} median round trip ({record['reps']} reps x {record['requests_per_rep']})"
    )
    for name in SYSTEMS:
        print(f"{name:<18} {medians[name]:8.1f} us")
    print(f"memo01 via domo / pynng echo:      {record['ratio_memo01_to_pynng']:.2f}x")
    print(f"memo01 via domo / MDP/0.2 via domo: {record['ratio_memo01_to_mdp']:.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
