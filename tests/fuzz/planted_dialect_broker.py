"""A deliberately wrong broker for ``domo fuzz --dialect``: domo's broker behind a relay that
alters one thing on the way to the peers.

``python planted_dialect_broker.py FLAW INTERVAL LIVENESS`` serves domo's own broker
(``domo.trio.serve_broker``, every dialect) on a loopback port in a thread of this process, binds
a ROUTER on another free port, prints that endpoint on stdout and relays every peer's messages to
the broker (one DEALER per peer, with the peer's routing id: ``_relay.py``) and back, until
killed. FLAW is one of:

- ``none``: the relay alters nothing (a control);
- ``mdp01-heartbeat-no-delimiter``: the HEARTBEAT an MDP/0.1 worker gets lacks its leading empty
  frame (``MDPW01, 0x04``): a mistake in hand-written 0.1 framing (breaks MDP01-02).
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

MDP01_HEARTBEAT = [b"", b"MDPW01", b"\x04"]


def alter(flaw: str, frames: list[bytes]) -> list[bytes]:
    """What the relay sends a peer instead of ``frames`` (the broker's message)."""
    if flaw == "mdp01-heartbeat-no-delimiter" and frames == MDP01_HEARTBEAT:
        return frames[1:]
    return frames


def serve(config: BrokerConfig, bound: queue.Queue[str]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            serving = partial(serve_broker, "tcp://127.0.0.1:0", config=config)
            endpoints = await nursery.start(serving)
            bound.put(endpoints[0])

    trio.run(main)


def main() -> None:
    flaw, interval, liveness = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    config = BrokerConfig(heartbeat_interval=interval, liveness=liveness)
    bound: queue.Queue[str] = queue.Queue()
    threading.Thread(target=serve, args=(config, bound), daemon=True).start()
    backend = bound.get(timeout=10)
    relay(backend, lambda _peer, _frames: True, lambda peer, frames: [(peer, alter(flaw, frames))])


if __name__ == "__main__":
    main()
