"""A runtime of our own for domo's client session: one blocking DEALER socket, no event loop.

``python embed_client.py BROKER SERVICE FRAME...`` sends one request, prints each frame of each
reply (PARTIALs as they come, then the FINAL) and exits 0, or exits 1 if the request failed.
"""

import math
import sys
import time

import zmq

from domo.protocol import ClientConfig, ClientSession
from domo.protocol.events import (
    FinalReceived,
    PartialReceived,
    ReconnectRequired,
    RequestFailed,
)


def request(endpoint: str, service: bytes, body: list[bytes]) -> bool:
    """Send one request through the broker at ``endpoint``; True once its FINAL is printed."""
    context = zmq.Context()
    session = ClientSession(ClientConfig(timeout=1.0, retries=2))
    socket = context.socket(zmq.DEALER)
    try:
        # 1. A new socket: tell the session, then hand it the request. Both queue messages
        #    (here one REQUEST) in the session's outbox; nothing is sent yet.
        socket.connect(endpoint)
        now = time.monotonic()
        events = session.connected(now) + session.request(service, body, now)
        while True:
            # 2. Act on the events of the last input, in order.
            for event in events:
                if isinstance(event, PartialReceived | FinalReceived):
                    for frame in event.body:
                        print(frame.decode(errors="replace"), flush=True)
                    if isinstance(event, FinalReceived):
                        return True
                elif isinstance(event, RequestFailed):
                    print(f"request failed: {event.reason}", file=sys.stderr)
                    return False
                elif isinstance(event, ReconnectRequired):
                    # No reply in time: this socket may still get the old reply, so it goes,
                    # and the session resends its request on the new one.
                    socket.close(linger=0)
                    socket = context.socket(zmq.DEALER)
                    socket.connect(endpoint)
                    events.extend(session.connected(time.monotonic()))
            # 3. Send what the session queued, in order.
            for frames in session.take_outgoing():
                socket.send_multipart(frames)
            # 4. Wait for a message, but never past the session's next deadline; then give the
            #    session the message or, if none came, the time (tick).
            deadline = session.next_deadline()
            wait_ms = None if deadline is None else math.ceil((deadline - time.monotonic()) * 1000)
            if socket.poll(None if wait_ms is None else max(0, wait_ms), zmq.POLLIN):
                events = session.receive(socket.recv_multipart(), time.monotonic())
            else:
                events = session.tick(time.monotonic())
    finally:
        socket.close(linger=0)
        context.term()


if __name__ == "__main__":
    endpoint, service, *frames = sys.argv[1:]
    ok = request(endpoint, service.encode(), [frame.encode() for frame in frames] or [b""])
    sys.exit(0 if ok else 1)
