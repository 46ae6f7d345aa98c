"""A runtime of our own for domo's worker session: one blocking DEALER socket, no event loop.

``python embed_worker.py BROKER`` serves "reverse" (each frame reversed) until SIGINT or
SIGTERM, then tells the broker DISCONNECT and exits 0.
"""

import math
import signal
import sys
import time

import zmq

from domo.protocol import WorkerConfig, WorkerSession
from domo.protocol.events import ReconnectRequired, RequestReceived


def reverse(frames: list[bytes]) -> list[bytes]:
    return [frame[::-1] for frame in frames]


def serve(endpoint: str, service: bytes) -> None:
    context = zmq.Context()
    session = WorkerSession(service, WorkerConfig(heartbeat_interval=2.5, liveness=3))
    socket: zmq.Socket[bytes] | None = None
    try:
        while True:
            if socket is None:
                # No socket: open one when the session's reconnection delay has passed.
                while (delay := session.reconnect_at - time.monotonic()) > 0:
                    time.sleep(delay)
                socket = context.socket(zmq.DEALER)
                socket.connect(endpoint)
                events = session.connected(time.monotonic())  # queues READY
            else:
                # 1. Wait for a message from the broker, never past the session's deadline
                #    (its next heartbeat to send, or the moment it gives the broker up).
                deadline = session.next_deadline()
                assert deadline is not None  # a connected session always has a timer
                wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
                if socket.poll(wait_ms, zmq.POLLIN):
                    events = session.receive(socket.recv_multipart(), time.monotonic())
                else:
                    events = session.tick(time.monotonic())  # a heartbeat, or a lost broker
            # 2. Act on the events, in order. Answering a request is an input too, and its
            #    events join the list.
            reconnect = False
            for event in events:
                if isinstance(event, RequestReceived):
                    reply = reverse(list(event.body))
                    events.extend(session.send_final(reply, time.monotonic()))
                elif isinstance(event, ReconnectRequired):
                    reconnect = True  # DISCONNECT from the broker, or the broker went silent
                    print(event, file=sys.stderr)
                else:
                    print(event, file=sys.stderr)  # connected, violations: worth a log line
            # 3. Send what the session queued, in order; then drop the socket if asked to.
            for frames in session.take_outgoing():
                socket.send_multipart(frames)
            if reconnect:
                socket.close(linger=0)
                socket = None
    except KeyboardInterrupt:
        # 4. A graceful stop: DISCONNECT (a request in progress would go back to the broker).
        session.disconnect(time.monotonic())
        if socket is not None:
            for frames in session.take_outgoing():
                socket.send_multipart(frames)
    finally:
        if socket is not None:
            socket.close(linger=500)  # milliseconds for the DISCONNECT to leave
        context.term()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    serve(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555", b"reverse")
