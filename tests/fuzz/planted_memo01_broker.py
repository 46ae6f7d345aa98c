"""A deliberately wrong memo01 broker: domo's broker with one method of its memo01 layer
altered.

``python planted_memo01_broker.py FLAW INTERVAL LIVENESS DIR`` serves ``domo.trio.serve_broker``
on a loopback ZeroMQ port and an NNG ipc endpoint in DIR with the flaw planted, prints the NNG
endpoint (``nng+ipc://...``) on stdout and serves until killed. FLAW is ``none`` (a control) or
one of :data:`PLANTS`, each named with the rule of specs/memo01.md it breaks.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import trio

from domo.protocol import BrokerConfig
from domo.protocol.dialects.memo01 import MessageType
from domo.protocol.memo01 import Memo01Broker
from domo.trio import serve_broker


def no_joining() -> None:
    """A resent JOB is never found again: it runs twice (MEMO-16)."""
    on_job = Memo01Broker._on_job

    def fresh(self: Memo01Broker, *args: Any) -> None:
        self._by_signature.clear()
        on_job(self, *args)

    Memo01Broker._on_job = fresh  # type: ignore[method-assign,assignment]


def stale_no_disconnect() -> None:
    """A worker message with an id the broker never gave is released with no reply, not
    answered DISCONNECT (MEMO-10)."""
    on_worker = Memo01Broker._on_worker

    def quiet(
        self: Memo01Broker, token: bytes, connection: int, data: bytes, message: Any, *rest: Any
    ) -> None:
        if message.id not in self._workers:
            self._reply(connection, token, None)
            return
        on_worker(self, token, connection, data, message, *rest)

    Memo01Broker._on_worker = quiet  # type: ignore[method-assign,assignment]


def garbage_answered() -> None:
    """Garbage from a client is answered (with DISCONNECT), where it gets no reply (MEMO-18)."""
    refuse = Memo01Broker._refuse

    def answering(self: Memo01Broker, token: bytes, connection: int, *rest: Any) -> None:
        refuse(self, token, connection, *rest)
        last = self._own[-1] if self._own else None
        if last is not None and last[1] == token and not last[2]:
            from domo.protocol.dialects.memo01 import encode

            self._own[-1] = (connection, token, (encode(MessageType.DISCONNECT, b"\0" * 8),))

    Memo01Broker._refuse = answering  # type: ignore[method-assign,assignment]


def leaving_kept() -> None:
    """A RESULT that says its worker is leaving is taken for an ordinary one: no DISCONNECT,
    and the worker keeps getting jobs (MEMO-06)."""
    finish = Memo01Broker._finish

    def staying(self: Memo01Broker, worker: Any, message: Any, *rest: Any) -> None:
        finish(self, worker, replace(message, leaving=False), *rest)

    Memo01Broker._finish = staying  # type: ignore[method-assign,assignment]


def out_of_turn_ignored() -> None:
    """A RESULT from an idle worker is released with no reply, not answered DISCONNECT
    (MEMO-09)."""
    on_worker = Memo01Broker._on_worker

    def ignoring(
        self: Memo01Broker, token: bytes, connection: int, data: bytes, message: Any, *rest: Any
    ) -> None:
        worker = self._workers.get(message.id)
        idle = worker is not None and worker.busy is None and not worker.answer_sent
        if idle and message.type is MessageType.RESULT:
            self._reply(connection, token, None)
            return
        on_worker(self, token, connection, data, message, *rest)

    Memo01Broker._on_worker = ignoring  # type: ignore[method-assign,assignment]


PLANTS: dict[str, tuple[Callable[[], None], str]] = {
    "no-joining": (no_joining, "MEMO-16"),
    "stale-no-disconnect": (stale_no_disconnect, "MEMO-10"),
    "garbage-answered": (garbage_answered, "MEMO-18"),
    "leaving-kept": (leaving_kept, "MEMO-06"),
    "out-of-turn-ignored": (out_of_turn_ignored, "MEMO-09"),
}


async def main(flaw: str, interval: float, liveness: int, directory: str) -> None:
    logging.getLogger("domo").setLevel(logging.ERROR)
    if flaw != "none":
        PLANTS[flaw][0]()
    config = BrokerConfig(heartbeat_interval=interval, liveness=liveness)
    nng = f"nng+ipc://{directory}/planted-{flaw}.ipc"
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_broker, "tcp://127.0.0.1:0", nng, config=config))
        print(nng, flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
