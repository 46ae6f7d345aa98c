"""``FakeNetwork``: an in-memory ``Transport`` for testing the runtime in virtual time.

The pumps, ``serve_broker``, ``Client`` and ``run_worker`` all take ``transport=``; give them one
``FakeNetwork`` and they talk through in-memory queues instead of ZeroMQ, so a test can run under
``trio.testing.MockClock(autojump_threshold=0)`` (pytest-trio's ``autojump_clock``): heartbeats,
expiry and backoff take virtual seconds and no real time.

It behaves like ZeroMQ where the runtime depends on it: a ROUTER sees its peers' identities,
gets EHOSTUNREACH for an identity it does not know and EAGAIN when that peer's queue holds
``hwm`` messages; a DEALER finds the ROUTER by endpoint name at each send, so a ROUTER bound
again after a restart is reached by the same DEALERs, and what a DEALER sends while no ROUTER is
bound waits until one binds. Unlike ZeroMQ, a DEALER never blocks (it has no high-water mark).

Every message goes through ``policy(packet)``, which returns a delay in seconds (0 to deliver at
once) or None to drop it; ``packets`` records every message sent, with its fate.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, cast

import trio

from domo.protocol.mdp import BodyFrame

from ._transport import EAGAIN, EHOSTUNREACH, SENT, Connection, FrameT

__all__ = ["FakeNetwork", "Packet", "Policy"]


@dataclass(frozen=True, slots=True)
class Packet:
    """One message on the fake network: between a DEALER (``peer``) and a ROUTER."""

    to_router: bool
    peer: bytes  # the DEALER's identity
    frames: tuple[bytes, ...]
    at: float
    delay: float | None = None  # None: dropped


Policy = Callable[[Packet], float | None]


class _FakeConnection(Generic[FrameT]):
    """A ROUTER (``_FakeConnection[BodyFrame]``) or a DEALER (``_FakeConnection[bytes]``); what
    crosses the network is ``bytes``, as over ZeroMQ."""

    def __init__(self, net: FakeNetwork, endpoint: str, identity: bytes, hwm: int) -> None:
        self._net = net
        self.endpoint = endpoint
        self.identity = identity  # b"" for a ROUTER
        self.hwm = hwm
        self.closed = False
        self.peers: dict[bytes, _FakeConnection[bytes]] = {}  # a ROUTER's DEALERs
        self._inbox: list[tuple[float, int, list[FrameT]]] = []  # (due, seq, frames)
        self._seq = 0
        self._wakeup = trio.Event()

    def _ready(self) -> bool:
        return bool(self._inbox) and self._inbox[0][0] <= trio.current_time()

    async def wait(self, writable: bool) -> None:
        while not (writable or self._ready()):
            due = self._inbox[0][0] if self._inbox else math.inf
            self._wakeup = trio.Event()
            with trio.move_on_at(due):
                await self._wakeup.wait()
                break
        if self.closed:  # closed by another task while waiting, as trio's notify_closing says
            raise trio.ClosedResourceError("the connection was closed")
        await trio.lowlevel.checkpoint()

    def receive(self, limit: int) -> list[list[FrameT]]:
        messages: list[list[FrameT]] = []
        while len(messages) < limit and self._ready():
            messages.append(heapq.heappop(self._inbox)[2])
        return messages

    def readable(self) -> bool:
        return self._ready()

    def send(self, frames: Sequence[FrameT]) -> int:
        wire = [bytes(frame) for frame in frames]  # the same objects, if they are bytes
        if self.identity:  # a DEALER: to whichever ROUTER is bound there now
            router = self._net._routers.get(self.endpoint)
            if router is None:
                self._net._parked.setdefault(self.endpoint, []).append((self.dealer(), wire))
            else:
                router.peers[self.identity] = self.dealer()
                self._net._transmit(router, True, self.identity, [self.identity, *wire])
            return SENT
        peer = self.peers.get(wire[0])
        if peer is None or peer.closed:
            return EHOSTUNREACH
        if len(peer._inbox) >= self.hwm:
            return EAGAIN
        self._net._transmit(peer, False, wire[0], wire[1:])
        return SENT

    def dealer(self) -> _FakeConnection[bytes]:
        """This connection as the DEALER it is (``identity`` is set)."""
        assert self.identity
        return cast("_FakeConnection[bytes]", self)

    def close(self, linger: float) -> None:
        self.closed = True
        self._wakeup.set()  # a task waiting on it wakes with ClosedResourceError
        routers = self._net._routers
        for endpoint in [e for e, router in routers.items() if router is self]:
            del routers[endpoint]

    def _put(self, due: float, frames: list[bytes]) -> None:
        if not self.closed:
            self._seq += 1
            # bytes are frames of either kind of connection (FrameT is bytes or BodyFrame)
            heapq.heappush(self._inbox, (due, self._seq, cast("list[FrameT]", frames)))
            self._wakeup.set()


class FakeNetwork:
    """An in-memory ``Transport``; see the module docstring."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy
        self.packets: list[Packet] = []
        self._routers: dict[str, _FakeConnection[BodyFrame]] = {}
        self._parked: dict[str, list[tuple[_FakeConnection[bytes], list[bytes]]]] = {}  # no ROUTER
        self._dealers = 0

    def bind(self, endpoints: Sequence[str], hwm: int) -> tuple[Connection[BodyFrame], list[str]]:
        taken = [endpoint for endpoint in endpoints if endpoint in self._routers]
        if taken:
            raise OSError(f"address in use: {taken}")
        router = _FakeConnection[BodyFrame](self, "", b"", hwm)
        for endpoint in endpoints:
            self._routers[endpoint] = router
            for dealer, frames in self._parked.pop(endpoint, []):
                if not dealer.closed:
                    dealer.send(frames)
        return router, list(endpoints)

    def connect(self, endpoint: str) -> Connection[bytes]:
        self._dealers += 1
        identity = b"\x00" + self._dealers.to_bytes(4, "big")  # like ZeroMQ's generated ids
        dealer = _FakeConnection[bytes](self, endpoint, identity, 0)
        router = self._routers.get(endpoint)
        if router is not None:
            router.peers[identity] = dealer
        return dealer

    async def aclose(self) -> None:
        """Nothing to release: the network lives as long as the test holds it."""

    def _transmit(
        self, to: _FakeConnection[Any], to_router: bool, peer: bytes, frames: list[bytes]
    ) -> None:
        now = trio.current_time()
        wire = tuple(frames[1:]) if to_router else tuple(frames)
        packet = Packet(to_router, peer, wire, now, 0.0)
        delay = 0.0 if self.policy is None else self.policy(packet)
        if self.packets is not None:
            self.packets.append(Packet(to_router, peer, wire, now, delay))
        if delay is not None:
            to._put(now + delay, frames)
