"""What is at an endpoint, in words: whether a ZeroMQ peer completes a handshake there, and if
not, what stands in the way (nothing listening, something that is not ZeroMQ, a CURVE mismatch).

MDP gives a peer no way to tell "no broker" from "a slow one": a worker's READY gets no answer,
and a client's request waits for a worker. ZeroMQ hides the transport too (it reconnects in the
background). So ``domo call`` and ``domo worker`` look underneath, with a socket of their own and
its monitor, when the broker is slow to answer: ``probe`` connects a DEALER, watches libzmq's
connection events for at most ``wait`` seconds, and says what it saw. It sends no message: a
broker sees a connection come and go, nothing else.
"""

from __future__ import annotations

from typing import Final

import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from domo.curve import CurveClient

_EVENTS: Final = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_FAILED: Final = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_POLL: Final = 0.02  # seconds between looks at the monitor
_TERM_WAIT: Final = 2.0  # seconds the probe's context may take to terminate (sockets closed)


async def probe(endpoint: str, wait: float, curve: CurveClient | None = None) -> str | None:
    """None if a ZeroMQ peer at ``endpoint`` completed the handshake within ``wait`` seconds
    (with ``curve``'s keys, if given); else what was seen, as a phrase for "cannot reach a
    broker at ENDPOINT: ...". A refused connection is watched until ``wait`` is over, in case
    a broker starts there meanwhile."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    seen = 0
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        address = f"inproc://domo-probe-{id(dealer):x}"
        dealer.monitor(address, _EVENTS)
        monitor = context.socket(zmq.PAIR)
        try:
            # No bound on the events' queue, and the monitor stopped before its receiver is
            # closed: libzmq's I/O thread sends events with a blocking send (libzmq issue 3575,
            # as in domo.trio._transport).
            monitor.setsockopt(zmq.RCVHWM, 0)
            monitor.setsockopt(zmq.LINGER, 0)
            monitor.connect(address)
            if curve is not None:
                curve.apply(dealer)
            dealer.connect(endpoint)
            with trio.move_on_after(wait):
                while True:
                    while monitor.poll(0):
                        event = int(parse_monitor_message(monitor.recv_multipart())["event"])
                        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                            return None
                        seen |= event
                        if event & _FAILED:
                            return _described(seen, wait, curve)
                    await trio.sleep(_POLL)
        finally:
            dealer.monitor(None, 0)
            monitor.close(linger=0)
            dealer.close(linger=0)
    finally:
        with trio.move_on_after(_TERM_WAIT), trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(context.term, abandon_on_cancel=True)
    return _described(seen, wait, curve)


def _described(seen: int, wait: float, curve: CurveClient | None) -> str:
    """What the events ``seen`` (a mask) say, as a phrase."""
    if seen & zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "the broker there refused this peer's CURVE key (is it on the broker's allow-list?)"
    if seen & (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
        if curve is None:
            return (
                "a ZeroMQ peer there refused the handshake (a broker that requires CURVE? "
                "give its public key with --curve-server-key)"
            )
        return (
            "the ZeroMQ handshake failed (a broker without CURVE, or with another key than "
            "--curve-server-key?)"
        )
    if seen & zmq.EVENT_CONNECTED:
        return (
            f"something listens there, but it did not answer ZeroMQ's handshake in {wait:g} s: "
            "it is not a ZeroMQ broker (an HTTP server, or another protocol, on that port?)"
        )
    if seen & zmq.EVENT_CONNECT_RETRIED:
        return "nothing listens there (connection refused): is `domo broker` running, on that port?"
    return f"no answer to a connection attempt in {wait:g} s (an address that does not route?)"
