"""The Binary Star pair on Trio: state messages between the two brokers, and the broker's gate.

``Pair`` owns one ``PairMachine``. ``Pair.run`` binds a PUB socket (this broker's state, once
per heartbeat) and connects a SUB socket to the peer's PUB (BSTAR-03); it is the only task that
uses them. ``Pair.admit`` is the gate ``serve_broker`` calls for every message before the core
sees it: a client's request is the machine's ``client_request`` input (the failover vote,
BSTAR-10); any other message (a worker's) is taken only while the broker serves. A broker that
does not serve drops everything, as if it were not there, so clients time out and try the next
endpoint, and workers, unanswered, move on (BSTAR-17).

Every change of state or of serving is reported to ``on_transition`` (``domo broker`` prints it
with the wall time, the record the chaos run checks).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import trio
import zmq

from domo.protocol.mdp import BodyFrame

from .fsm import PairConfig, PairMachine, Transition, decode_state

__all__ = ["CLIENT_HEADERS", "Pair", "is_client_request"]

logger = logging.getLogger("domo.binarystar")

# MDP/0.2 clients (RFC 18), and MDP/0.1 clients behind REQ (an empty delimiter first, RFC 7).
CLIENT_HEADERS = (b"MDPC02", b"MDPC01")


def is_client_request(frames: Sequence[BodyFrame]) -> bool:
    """Whether a message (routing id removed) is a client's request (BSTAR-10)."""
    if not frames:
        return False
    first = frames[0]
    if first == b"MDPC02":
        return True
    return first == b"" and len(frames) > 1 and frames[1] in CLIENT_HEADERS


def _readable(socket: zmq.Socket[bytes]) -> bool:
    """Whether a message waits (reading EVENTS also re-arms the edge-triggered FD)."""
    events = socket.getsockopt(zmq.EVENTS)
    assert isinstance(events, int)
    return bool(events & zmq.POLLIN)


class Pair:
    """One broker's side of the pair: its machine, its two sockets, its gate."""

    def __init__(
        self,
        config: PairConfig,
        bind: str,
        peer: str,
        *,
        on_transition: Callable[[Transition], None] | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.config = config
        self.bind = bind
        self.peer = peer
        self.machine = PairMachine(config, trio.current_time())
        self._on_transition = on_transition
        self._context = context
        self.bound: str | None = None
        self.dropped = 0  # messages the gate dropped while not serving

    # --- the gate -----------------------------------------------------------------------------

    def admit(self, frames: Sequence[BodyFrame], now: float) -> bool:
        """Whether the broker's core may take this message now (BSTAR-10, BSTAR-17)."""
        machine = self.machine
        if is_client_request(frames):
            admitted = machine.client_request(now)
        else:
            machine.observe(now)
            admitted = machine.serving
        self._report()
        if not admitted:
            self.dropped += 1
        return admitted

    def _report(self) -> None:
        for transition in self.machine.take_events():
            logger.info(
                "pair: %s -> %s (%s; %s: %s)",
                transition.old.value,
                transition.new.value,
                "serving" if transition.serving else "not serving",
                transition.rule,
                transition.reason,
            )
            if self._on_transition is not None:
                self._on_transition(transition)

    # --- the state messages -------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish this broker's state and read the peer's until cancelled."""
        owned = self._context is None
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context() if owned else self._context  # type: ignore[assignment]
        pub = context.socket(zmq.PUB)
        sub = context.socket(zmq.SUB)
        try:
            pub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.CONFLATE, 1)  # only the peer's newest state matters (BSTAR-12)
            pub.bind(self.bind)
            self.bound = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            sub.connect(self.peer)
            task_status.started(self.bound)
            await self._serve(pub, sub)
        finally:
            pub.close(0)
            sub.close(0)
            if owned:
                context.term()  # both sockets are closed, with no linger: it returns at once

    async def _serve(self, pub: zmq.Socket[bytes], sub: zmq.Socket[bytes]) -> None:
        machine = self.machine
        fd = sub.fileno()
        while True:
            now = trio.current_time()
            for _ in range(64):  # bounded: the peer says one thing per heartbeat
                if not _readable(sub):
                    break
                decoded = decode_state(sub.recv_multipart(zmq.NOBLOCK))
                if decoded is None:  # BSTAR-16
                    logger.warning("pair: a message on %s that is not a peer state", self.peer)
                    continue
                if decoded[0] is self.config.role:  # BSTAR-14
                    logger.error(
                        "pair: the peer at %s is a %s too: one broker must be --primary, the "
                        "other --backup; neither serves until that is fixed",
                        self.peer,
                        self.config.role.value,
                    )
                machine.peer_state(*decoded, now)
            if machine.tick(now):
                # A PUB drops what a slow subscriber cannot take: it hears the next one.
                pub.send_multipart(machine.message(), zmq.NOBLOCK)
            self._report()
            if _readable(sub):
                continue  # more came meanwhile: the FD's edge may be spent
            wait = max(0.0, machine.next_deadline() - trio.current_time())
            with trio.move_on_after(wait if math.isfinite(wait) else 1.0):
                await trio.lowlevel.wait_readable(fd)
