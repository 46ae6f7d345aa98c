"""An MDP/0.1 worker (ZeroMQ RFC 7) on a DEALER socket, every frame written by hand.

``python mdp01_worker.py BROKER`` serves "lower" (each frame in lower case) until SIGINT or
SIGTERM, then says DISCONNECT. Nothing here is domo's: any RFC 7 worker looks like this.
"""

import signal
import sys
import time

import zmq

WORKER = b"MDPW01"  # RFC 7's worker header
READY, REQUEST, REPLY, HEARTBEAT, DISCONNECT = b"\x01", b"\x02", b"\x03", b"\x04", b"\x05"
INTERVAL = 2.5  # seconds between heartbeats: the broker's --heartbeat-interval
LIVENESS = 3  # intervals of silence before the broker counts as gone: its --liveness


def lower(body: list[bytes]) -> list[bytes]:
    return [frame.lower() for frame in body]


def serve(endpoint: str, service: bytes) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    try:
        while True:  # one connection per pass; a new one after DISCONNECT or a silent broker
            socket.close(linger=0)
            socket = context.socket(zmq.DEALER)
            socket.connect(endpoint)
            # A DEALER adds no delimiter: every command starts with the empty frame by hand.
            socket.send_multipart([b"", WORKER, READY, service])
            heard = sent = time.monotonic()
            while True:
                now = time.monotonic()
                if now - heard >= LIVENESS * INTERVAL:
                    break  # the broker is gone: connect again
                if now - sent >= INTERVAL:
                    socket.send_multipart([b"", WORKER, HEARTBEAT])
                    sent = now
                wait = min(sent + INTERVAL, heard + LIVENESS * INTERVAL) - now
                if not socket.poll(max(0, int(wait * 1000)), zmq.POLLIN):
                    continue
                frames = socket.recv_multipart()
                heard = time.monotonic()  # anything from the broker shows it is alive
                if len(frames) < 3 or frames[:2] != [b"", WORKER]:
                    continue  # not RFC 7: ignore it
                command = frames[2]
                if command == REQUEST and len(frames) >= 6 and frames[4] == b"":
                    client, body = frames[3], frames[5:]
                    socket.send_multipart([b"", WORKER, REPLY, client, b"", *lower(body)])
                    sent = time.monotonic()
                elif command == DISCONNECT:
                    time.sleep(1.0)  # let the broker come back before connecting again
                    break
    except KeyboardInterrupt:
        socket.send_multipart([b"", WORKER, DISCONNECT])
        socket.close(linger=500)
    finally:
        socket.close(linger=0)
        context.term()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    serve(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555", b"lower")
