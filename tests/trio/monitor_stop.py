"""The shutdown paths of a watched socket, looped: ``python -m tests.trio.monitor_stop MODE N``.

Run in a subprocess by ``tests/trio/test_monitor_stop.py``, because what it checks for is a hang
inside libzmq (a blocked I/O thread, a lock held for ever): no Python timeout can interrupt it,
so the process dumps every thread's stack and exits 1 after ``DEADLINE`` seconds instead, and
prints ``ok`` when all went through.

- ``close N``: N times, a ROUTER with its closed-connection watch (``ZmqConnection.watch_closed``)
  and peers that disconnect just after the watch is closed, as the broker's peers do while it
  stops; then the context must terminate. The watch stopped after its receiving socket had
  closed (libzmq issue 3575): the first disconnect blocked the I/O thread, and the stop (or
  the context's termination) for ever.
- ``unread N``: N connections come and go while nobody reads the watch, then a new peer must
  still be served and the watch close: a bounded event queue (pyzmq's ``get_monitor_socket``
  keeps libzmq's 1,000 + 1,000) blocked the I/O thread, and every connection on it, at about
  2,000 unread events.
- ``broker N``: N times, ``serve_broker`` with peers connected, cancelled while they disconnect.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
from functools import partial

import trio
import zmq

from domo.trio import serve_broker
from domo.trio._transport import ZmqConnection

DEADLINE = 30.0  # seconds; each mode takes under 3 here
PEERS = 100  # per round of ``broker``


def connected_peers(
    context: zmq.Context[zmq.Socket[bytes]],
    router: zmq.Socket[bytes],
    count: int,
) -> list[zmq.Socket[bytes]]:
    """``count`` DEALERs whose connections ``router`` has accepted (each sent one message)."""
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    peers = []
    for _ in range(count):
        peer = context.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        peer.connect(endpoint)
        peer.send(b"hello")
        peers.append(peer)
    for _ in range(count):
        if not router.poll(5000):
            raise AssertionError("a peer's message did not reach the router in 5 s")
        router.recv_multipart()
    return peers


async def close_after_watch(rounds: int) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    for _ in range(rounds):
        router = context.socket(zmq.ROUTER)
        router.bind("tcp://127.0.0.1:0")
        conn = ZmqConnection[bytes](router)
        watch = conn.watch_closed()
        peers = connected_peers(context, router, 8)
        watch.close(0)
        for peer in peers:
            peer.close()
        await trio.sleep(0.005)  # the disconnects reach the router's I/O thread
        conn.close(0)
    context.term()


async def unread_watch(rounds: int) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:0")
    conn = ZmqConnection[bytes](router)
    watch = conn.watch_closed()
    for _ in range(rounds):
        for peer in connected_peers(context, router, 1):
            peer.close()
    for peer in connected_peers(context, router, 1):  # still served
        peer.close()
    await trio.sleep(0.05)
    ended = sum(len(message) == 2 for message in watch.receive(rounds + 10))
    if ended < rounds:
        raise AssertionError(f"{ended} of {rounds} closed connections reported")
    watch.close(0)
    conn.close(0)
    context.term()


async def broker_stops(rounds: int) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    for _ in range(rounds):
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(partial(serve_broker, linger=0), "tcp://127.0.0.1:0")
            peers = []
            for _ in range(PEERS):
                peer = context.socket(zmq.DEALER)
                peer.setsockopt(zmq.LINGER, 0)
                peer.connect(bound[0])
                peer.send_multipart([b"", b"MDPC02", b"\x01", b"mmi.service", b"echo"])
                peers.append(peer)
            for peer in peers:  # answered: the broker has each connection
                if not await trio.to_thread.run_sync(peer.poll, 5000):
                    raise AssertionError("the broker did not answer mmi.service in 5 s")
            # The peers disconnect one by one from another thread while the broker stops, so
            # that closed connections keep reaching its monitor throughout its shutdown.
            closing = threading.Thread(target=close_slowly, args=(peers,))
            closing.start()
            await trio.sleep(0.001 * PEERS // 4)
            nursery.cancel_scope.cancel()
        closing.join()
    context.term()


def close_slowly(peers: list[zmq.Socket[bytes]]) -> None:
    for peer in peers:
        peer.close()
        time.sleep(0.0001)


MODES = {"close": close_after_watch, "unread": unread_watch, "broker": broker_stops}


def main() -> None:
    mode, rounds = sys.argv[1], int(sys.argv[2])
    faulthandler.dump_traceback_later(DEADLINE, exit=True)
    trio.run(MODES[mode], rounds)
    faulthandler.cancel_dump_traceback_later()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
