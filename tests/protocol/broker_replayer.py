"""Replay recorded broker inputs into a fresh ``Broker`` and print what it did, one line per call.

Used by ``test_broker_replay.py`` both in the test process and as a script in fresh processes
with other ``PYTHONHASHSEED`` values (MDP-D-03: the same inputs give the same outputs in a fresh
process). As a script it reads the inputs as JSON on stdin and writes the lines as JSON on
stdout; it imports nothing but ``domo`` and the standard library, so it runs by path.

An input is ``[kind, peer, frames, now]`` with bytes as hex strings: kind is ``receive``,
``tick``, ``unreachable``, ``congested`` or ``shutdown``; peer and frames are ``null`` where the
call takes none. A line is the ``repr`` of the call's events and of its outbox: both are built
only from bytes, str, int, float, bool and None, whose ``repr`` is the same in every process.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from domo.protocol.broker import Broker, BrokerConfig
from domo.protocol.mdp import Relayed

Record = list[Any]  # [kind, peer hex | None, [frame hex, ...] | None, now]

CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=6.0, max_redispatches=2)


def apply(broker: Broker, record: Record) -> tuple[str, list[tuple[bytes, Relayed]]]:
    """Apply one recorded input; the canonical line for what the broker did, and its outbox."""
    kind, peer_hex, frames_hex, now = record
    peer = b"" if peer_hex is None else bytes.fromhex(peer_hex)
    if kind == "receive":
        events = broker.receive(peer, [bytes.fromhex(f) for f in frames_hex], now)
    elif kind == "tick":
        events = broker.tick(now)
    elif kind == "unreachable":
        events = broker.peer_unreachable(peer, now)
    elif kind == "congested":
        events = broker.peer_congested(peer, now)
    elif kind == "shutdown":
        events = broker.shutdown(now)
    else:
        raise ValueError(f"unknown input kind {kind!r}")
    outbox = broker.take_outgoing()
    events += broker.flushed()  # every message was "sent": the FINALs complete (MDP-D-24)
    return f"{events!r} -> {outbox!r}", outbox


def replay(records: list[Record]) -> list[str]:
    """Every line of a fresh broker fed ``records``."""
    broker = Broker(CONFIG)
    return [apply(broker, record)[0] for record in records]


def main() -> None:
    records = json.load(sys.stdin)
    json.dump(replay(records), sys.stdout)


if __name__ == "__main__":
    main()
