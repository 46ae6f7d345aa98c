"""Fairness of the broker's pump: a flood never holds back a reply already made (issue 14).

A ROUTER double hands the pump a worker's READY, a client's REQUEST and then a flood of junk
from a third peer, all ready at once (what a flood looks like from the pump). The request must
leave for the worker after at most ``SLICE`` more messages have been read, not after the whole
batch: with replies held until a batch of 256 ends, one flooding peer cut an honest client's
throughput to a twentieth (measured with ``tests/chaos/flood.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import trio

from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame
from domo.trio._pump import BATCH, SLICE, pump_router
from domo.trio._transport import SENT

WORKER, CLIENT, FLOODER = b"\x00worker", b"\x00client", b"\x00flood"
JUNK = [FLOODER, b"", b"MDPX99", b"\x01"]


class FloodedRouter:
    """Every message ready at once; a log of what the pump read and sent, in order."""

    def __init__(self, messages: list[list[BodyFrame]]) -> None:
        self.ready: deque[list[BodyFrame]] = deque(messages)
        self.log: list[tuple[str, bytes]] = []
        self.drained = trio.Event()

    async def wait(self, writable: bool) -> None:
        if not self.ready:
            self.drained.set()
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()

    def receive(self, limit: int) -> list[list[BodyFrame]]:
        taken = [self.ready.popleft() for _ in range(min(limit, len(self.ready)))]
        self.log.extend(("in", bytes(message[0])) for message in taken)
        return taken

    def readable(self) -> bool:
        return bool(self.ready)

    def send(self, frames: Sequence[BodyFrame]) -> int:
        self.log.append(("out", bytes(frames[0])))
        return SENT

    def close(self, linger: float) -> None:
        pass


async def test_a_request_leaves_before_the_flood_behind_it_is_read() -> None:
    flood: list[list[BodyFrame]] = [list(JUNK) for _ in range(BATCH * 2)]
    router = FloodedRouter(
        [
            [WORKER, b"", b"MDPW02", b"\x01", b"echo"],
            [CLIENT, b"", b"MDPC02", b"\x01", b"echo", b"hello"],
            *flood,
        ]
    )
    events: list[BrokerEvent] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump_router, FamilyBroker(), router, events.extend)
            await router.drained.wait()
            nursery.cancel_scope.cancel()

    request_read = router.log.index(("in", CLIENT))
    forwarded = router.log.index(("out", WORKER))
    read_between = sum(1 for kind, _ in router.log[request_read:forwarded] if kind == "in")
    assert read_between <= SLICE, f"the REQUEST waited for {read_between} messages to be read"
    assert sum(1 for kind, peer in router.log if (kind, peer) == ("in", FLOODER)) == len(flood)
