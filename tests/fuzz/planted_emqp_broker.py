"""A deliberately wrong eMQP broker: domo's broker with one method of its eMQP bridge altered.

``python planted_emqp_broker.py FLAW INTERVAL LIVENESS`` serves ``domo.trio.serve_broker`` on a
free loopback port with the flaw planted, prints the endpoint on stdout and serves until killed
(a process of its own, as a broker under test is: the fuzzer's lanes must not share its CPU
time, nor its interpreter). FLAW is ``none`` (a control) or one of :data:`PLANTS`, each named
with the rule of specs/emqp-1.0.md it breaks.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import trio

from domo.protocol import BrokerConfig
from domo.protocol.dialects.emqp import DISCONNECT, HEARTBEAT, REPLY
from domo.protocol.layers import emqp as emqp_layer
from domo.protocol.mdp import BodyFrame, Relayed
from domo.trio import serve_broker

Bridge = emqp_layer.EmqpLayer


def count_ready_twice() -> None:
    """Each READY opens two slots (a slot does one request: EMQP-07)."""
    on_ready = Bridge._on_ready

    def twice(self: Bridge, worker: Any, now: float, events: list[Any]) -> None:
        on_ready(self, worker, now, events)
        on_ready(self, worker, now, events)

    Bridge._on_ready = twice  # type: ignore[method-assign]


def _sending(keep: Callable[[bytes, Relayed], bool], twice: bool = False) -> None:
    send = Bridge._send

    def sending(self: Bridge, address: Any, command: bytes, body: Relayed) -> None:
        if keep(command, body):
            send(self, address, command, body)
            if twice and command == REPLY and len(body) == 1:
                send(self, address, command, body)

    Bridge._send = sending  # type: ignore[method-assign]


def drop_results() -> None:
    """A worker's result stops at the broker, as in EventMQ 0.3.13 (EMQP-12); the broker's own
    MMI answers still go out."""
    encode = Bridge.encode

    def no_results(self: Bridge, key: bytes, route: Any, frames: Any) -> Any:
        out = encode(self, key, route, frames)
        mmi = out is not None and out[4] in (b"200", b"404", b"501")
        return None if out is not None and out[2] == REPLY and not mmi else out

    Bridge.encode = no_results  # type: ignore[method-assign,assignment]


def mmi_always_200() -> None:
    """``mmi.service`` says 200 for a queue nobody serves (EMQP-25)."""
    encode = Bridge.encode

    def always(self: Bridge, key: bytes, route: Any, frames: Any) -> Any:
        out = encode(self, key, route, frames)
        if out is not None and out[2] == REPLY and out[4] == b"404":
            return [*out[:4], b"200", *out[5:]]
        return out

    Bridge.encode = always  # type: ignore[method-assign,assignment]


def reroute_to_default() -> None:
    """A request for a queue no informed worker lists goes to "default", as in EventMQ 0.3.13
    (EMQP-22)."""
    on_request = Bridge._on_request

    def rerouting(
        self: Bridge, address: Any, message: Sequence[BodyFrame], now: float, events: list[Any]
    ) -> None:
        listed = {queue for w in self._workers.values() for _, queue in w.queues}
        queue = bytes(message[3]) if len(message) > 3 else b"mmi."
        if queue not in listed and not queue.startswith(b"mmi."):
            message = [*message[:3], b"default", *message[4:]]
        on_request(self, address, message, now, events)

    Bridge._on_request = rerouting  # type: ignore[method-assign]


def ignore_leaving() -> None:
    """KBYE, KBAI and DISCONNECT from a worker are taken for a HEARTBEAT: it keeps its slots
    and gets jobs (EMQP-16)."""
    receive = Bridge.receive

    def staying(
        self: Bridge, peer: bytes, message: Sequence[BodyFrame], now: float, connection: int
    ) -> Any:
        if len(message) > 1 and bytes(message[1]) in (b"KBYE", b"KBAI", DISCONNECT):
            message = [message[0], HEARTBEAT, *message[2:]]
        return receive(self, peer, message, now, connection)

    Bridge.receive = staying  # type: ignore[method-assign]


def forget_without_requeue() -> None:
    """A worker that leaves is forgotten and its idle slots withdrawn, but its busy slots stay
    with the core: the jobs it held are never given to another (EMQP-14). (Leaving its idle
    slots too would have the core dispatch to a worker the layer no longer knows: a crash, not
    the mistake planted.)"""

    def forget(
        self: Bridge, worker: Any, now: float, events: list[Any], *, expired: bool = False
    ) -> None:
        self._workers.pop(worker.address, None)
        seats = self._seats
        busy = seats._busy.get(worker.address, set())
        groups = seats._groups.get(worker.address, {})
        idle = [key for number, keys in groups.items() if number not in busy for key in keys]
        seats.forget(worker.address)
        events += seats._core.withdraw(idle, now, expired=expired)

    Bridge._forget = forget  # type: ignore[method-assign]


def stray_reply_drops_worker() -> None:
    """A REPLY naming no job this worker holds makes the broker forget the worker, where the
    message alone must be dropped (EMQP-13)."""
    on_reply = Bridge._on_reply

    def dropping(self: Bridge, worker: Any, message: Any, now: float, events: list[Any]) -> None:
        if len(message) >= 5 and bytes(message[-1]) in worker.jobs:
            on_reply(self, worker, message, now, events)
            return
        self._forget(worker, now, events)
        on_reply(self, worker, message, now, events)

    Bridge._on_reply = dropping  # type: ignore[method-assign]


PLANTS: dict[str, tuple[Callable[[], None], str, bool]] = {
    # name: (the plant, the rule it breaks, near misses needed to show it)
    "count-ready-twice": (count_ready_twice, "EMQP-07", False),
    "drop-receipts": (
        partial(_sending, lambda c, b: not (c == REPLY and len(b) == 1)),
        "EMQP-11",
        False,
    ),
    "receipts-twice": (partial(_sending, lambda c, b: True, twice=True), "EMQP-11", False),
    "drop-results": (drop_results, "EMQP-12", False),
    "reroute-to-default": (reroute_to_default, "EMQP-22", False),
    "silent-refusal": (partial(_sending, lambda c, b: c != DISCONNECT), "EMQP-04", True),
    "no-heartbeats": (partial(_sending, lambda c, b: c != HEARTBEAT), "EMQP-15", False),
    "mmi-always-200": (mmi_always_200, "EMQP-25", False),
    "ignore-leaving": (ignore_leaving, "EMQP-16", False),
    "forget-without-requeue": (forget_without_requeue, "EMQP-14", False),
    "stray-reply-drops-worker": (stray_reply_drops_worker, "EMQP-13", True),
}


async def main(flaw: str, interval: float, liveness: int) -> None:
    logging.getLogger("domo").setLevel(logging.ERROR)  # what the fuzzer sends it is no news
    if flaw != "none":
        PLANTS[flaw][0]()
    config = BrokerConfig(heartbeat_interval=interval, liveness=liveness)
    async with trio.open_nursery() as nursery:
        serving = partial(serve_broker, "tcp://127.0.0.1:0", config=config)
        endpoints = await nursery.start(serving)
        print(endpoints[0], flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
