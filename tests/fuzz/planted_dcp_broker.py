"""Deliberately wrong DCP brokers for ``domo fuzz --dialect dcp``: domo's broker behind a relay
that plants one DCP mistake.

``python planted_dcp_broker.py FLAW INTERVAL LIVENESS`` serves domo's own broker
(``domo.trio.serve_broker``) on a loopback port in a thread of this process, binds a ROUTER on
another free port, prints that endpoint on stdout and relays every peer's messages to the broker
(one DEALER per peer, with the peer's routing id: ``_relay.py``) and back, until killed. The
frames are read here by hand from the DCP text (``""``, ``DGBX\\x01``, a type frame of 1 or 4
bytes, parts).
FLAW is one of (the rule ``specs/dcp-v1.md`` gives it):

- ``none``: the relay alters nothing (a control);
- ``reply-wrong-width``: a client's reply comes in the other type-frame width (DCP-03);
- ``reply-drops-metadata``: a client's reply loses its metadata parts (DCP-09);
- ``pong-to-stranger``: a ping the broker answers with reconnect gets pong instead (DCP-14);
- ``loses-second-request``: a request from a peer that already has one in flight is dropped
  (DCP-10);
- ``no-registration-echo``: a registration is not echoed (DCP-04);
- ``reply-to-another-client``: a reply goes to another peer that has sent requests (DCP-07);
- ``pings-workers``: with every pong, the broker also pings the worker (DCP-16);
- ``drops-unknown-service``: a request for a service no worker has registered for is dropped,
  as DagBox's broker does (DCP-19);
- ``dies-on-bad-input``: after the first message without the DCP v1 header or with a type
  frame that is no DCP type in 1 or 4 bytes, nothing more is relayed, as DagBox's broker aborts
  (DCP-23);
- ``drop-dual-reply``: the reply to a request a registered worker sent as a client is dropped
  (DCP-20);
- ``mmi-always-200``: ``mmi.service`` says 200 for a service nobody serves (DCP-26);
- ``no-reconnect-on-reregistration``: a second registration from a registered worker is
  swallowed, so it gets no reconnect (DCP-18);
- ``no-reconnect-for-stray-reply``: a reply from a peer that holds no request gets no reconnect
  (DCP-12).
"""

from __future__ import annotations

import queue
import sys
import threading
from functools import partial
from pathlib import Path

import trio

from domo.protocol import BrokerConfig
from domo.trio import serve_broker

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._relay import relay

HEADER = b"DGBX\x01"
REGISTER, PING, PONG, REQUEST, REPLY, RECONNECT = 1, 2, 3, 4, 5, 6
FLAWS = (
    "none",
    "reply-wrong-width",
    "reply-drops-metadata",
    "pong-to-stranger",
    "loses-second-request",
    "no-registration-echo",
    "reply-to-another-client",
    "pings-workers",
    "drops-unknown-service",
    "dies-on-bad-input",
    "drop-dual-reply",
    "mmi-always-200",
    "no-reconnect-on-reregistration",
    "no-reconnect-for-stray-reply",
)


def kind_of(frames: list[bytes]) -> int | None:
    """The DCP type of ``frames`` (routing id stripped), if it has a type frame of 1 or 4 bytes."""
    if len(frames) < 3 or frames[1] != HEADER or len(frames[2]) not in (1, 4):
        return None
    return int.from_bytes(frames[2], "little")


class Relay:
    """What one flaw changes, in each direction."""

    def __init__(self, flaw: str) -> None:
        self.flaw = flaw
        self.last_from: dict[bytes, int | None] = {}  # each peer's last message type
        self.in_flight: dict[bytes, int] = {}  # requests relayed, not yet replied, per peer
        self.askers: list[bytes] = []
        self.registered: set[bytes] = set()  # every service a worker registered for
        self.workers: set[bytes] = set()  # every peer that registered
        self.strays: set[bytes] = set()  # peers that sent a reply while registered nowhere
        self.dead = False

    def inbound(self, identity: bytes, frames: list[bytes]) -> bool:
        """Whether a peer's message goes on to the broker."""
        kind = kind_of(frames)
        if self.dead:
            return False
        if self.flaw == "dies-on-bad-input" and (kind is None or not REGISTER <= kind <= RECONNECT):
            self.dead = True  # as DagBox's broker aborts on a frame it cannot parse
            return False
        self.last_from[identity] = kind
        if kind == REGISTER and len(frames) > 3:
            if self.flaw == "no-reconnect-on-reregistration" and identity in self.workers:
                return False
            self.registered.add(frames[3])
            self.workers.add(identity)
        if kind == REPLY and identity not in self.workers:
            self.strays.add(identity)
        if kind == REQUEST:
            unknown = len(frames) > 3 and frames[3] not in self.registered
            if self.flaw == "drops-unknown-service" and unknown and frames[3][:4] != b"mmi.":
                return False
            if identity not in self.askers:
                self.askers.append(identity)
            if self.flaw == "loses-second-request" and self.in_flight.get(identity, 0) >= 1:
                return False
            self.in_flight[identity] = self.in_flight.get(identity, 0) + 1
        return True

    def outbound(self, identity: bytes, frames: list[bytes]) -> list[tuple[bytes, list[bytes]]]:
        """What the relay sends instead of the broker's ``frames`` to ``identity``."""
        if self.dead:
            return []
        kind = kind_of(frames)
        width = len(frames[2]) if kind is not None else 1
        if kind == REPLY:
            self.in_flight[identity] = max(0, self.in_flight.get(identity, 0) - 1)
            if self.flaw == "drop-dual-reply" and identity in self.workers:
                return []
            if self.flaw == "mmi-always-200" and frames[-1] == b"404":
                return [(identity, [*frames[:-1], b"200"])]
            if self.flaw == "reply-wrong-width":
                other = 4 if width == 1 else 1
                return [(identity, [*frames[:2], REPLY.to_bytes(other, "little"), *frames[3:]])]
            if self.flaw == "reply-drops-metadata":
                end = frames.index(b"", 5)  # "", header, type, address, "", metadata*, ""
                return [(identity, [*frames[:5], *frames[end:]])]
            if self.flaw == "reply-to-another-client":
                others = [asker for asker in self.askers if asker != identity]
                if others:
                    return [(others[-1], frames)]
        answers_ping = self.last_from.get(identity) == PING
        if kind == RECONNECT and self.flaw == "pong-to-stranger" and answers_ping:
            return [(identity, [*frames[:2], PONG.to_bytes(width, "little")])]
        if kind == REGISTER and self.flaw == "no-registration-echo":
            return []
        stray = identity in self.strays and identity not in self.workers
        if kind == RECONNECT and self.flaw == "no-reconnect-for-stray-reply" and stray:
            return []
        if kind == PONG and self.flaw == "pings-workers":
            return [(identity, frames), (identity, [*frames[:2], PING.to_bytes(width, "little")])]
        return [(identity, frames)]


def serve(config: BrokerConfig, bound: queue.Queue[str]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            serving = partial(serve_broker, "tcp://127.0.0.1:0", config=config)
            endpoints = await nursery.start(serving)
            bound.put(endpoints[0])

    trio.run(main)


def main() -> None:
    flaw, interval, liveness = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    if flaw not in FLAWS:
        raise SystemExit(f"unknown flaw {flaw!r}; one of {', '.join(FLAWS)}")
    config = BrokerConfig(heartbeat_interval=interval, liveness=liveness)
    bound: queue.Queue[str] = queue.Queue()
    threading.Thread(target=serve, args=(config, bound), daemon=True).start()
    backend = bound.get(timeout=10)
    planted = Relay(flaw)
    relay(backend, planted.inbound, planted.outbound)


if __name__ == "__main__":
    main()
