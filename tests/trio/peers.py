"""Peers for the runtime's process tests: ``python -m tests.trio.peers broker|worker|demo ...``.

Each runs in a subprocess that a test starts and kills by PID, and reports on stdout, one line
at a time, what the test waits for:

- ``broker ENDPOINT INTERVAL``: ``serve_broker``; prints ``bound <endpoint>``, then ``<event>``
  for each event of the core (its repr). SIGTERM stops it gracefully (DISCONNECT to workers).
- ``worker ENDPOINT SERVICE NAME INTERVAL DELAY``: ``run_worker``; the handler prints
  ``start <body>``, sleeps DELAY seconds and answers ``[NAME, *body]``.
- ``demo``: a broker on a free tcp port plus an ``echo`` worker; prints ``bound <endpoint>``.
"""

from __future__ import annotations

import signal
import sys
from functools import partial

import trio

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import BrokerEvent
from domo.trio import run_worker, serve_broker


def say(line: str) -> None:
    print(line, flush=True)


async def broker(endpoint: str, interval: float) -> None:
    def report(event: BrokerEvent) -> None:
        say(repr(event))

    config = BrokerConfig(heartbeat_interval=interval, liveness=3)
    serve = partial(serve_broker, config=config, on_event=report)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve, endpoint)
        say(f"bound {bound[0]}")
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()  # graceful: serve_broker shuts the core down
                break


async def worker(endpoint: str, service: str, name: str, interval: float, delay: float) -> None:
    async def handler(body: list[bytes]) -> list[bytes]:
        say(f"start {body[0].decode()}")
        await trio.sleep(delay)
        return [name.encode(), *body]

    config = WorkerConfig(heartbeat_interval=interval, liveness=3, reconnect_max=0.5)
    await run_worker(endpoint, service, handler, config=config)


async def demo() -> None:
    async def echo(body: list[bytes]) -> list[bytes]:
        return body

    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_broker, "tcp://127.0.0.1:0")
        await nursery.start(run_worker, bound[0], "echo", echo)
        say(f"bound {bound[0]}")


def main(argv: list[str]) -> None:
    kind, args = argv[0], argv[1:]
    if kind == "broker":
        trio.run(broker, args[0], float(args[1]))
    elif kind == "worker":
        trio.run(worker, args[0], args[1], args[2], float(args[3]), float(args[4]))
    elif kind == "demo":
        trio.run(demo)
    else:
        raise SystemExit(f"unknown peer {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
