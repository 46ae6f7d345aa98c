"""An MDP/0.1 client (ZeroMQ RFC 7): a plain REQ socket, every frame written by hand.

``python mdp01_client.py BROKER SERVICE FRAME...`` prints each frame of the reply, or exits 1
when no reply came after every attempt. Nothing here is domo's: this is what a client written
for the Guide's broker already looks like.
"""

import sys

import zmq

CLIENT = b"MDPC01"  # RFC 7's client header


def request(endpoint: str, service: bytes, body: list[bytes]) -> list[bytes] | None:
    """One request; the reply's body, or None after three attempts of 2.5 s each."""
    context = zmq.Context()
    try:
        for _attempt in range(3):
            # A REQ socket that got no reply cannot send again: each attempt takes a new one.
            with context.socket(zmq.REQ) as socket:
                socket.setsockopt(zmq.LINGER, 0)  # an unanswered request is not kept at close
                socket.connect(endpoint)
                # REQ puts the empty delimiter frame first; the rest is RFC 7's REQUEST.
                socket.send_multipart([CLIENT, service, *body])
                if socket.poll(2500, zmq.POLLIN):
                    header, answered, *reply = socket.recv_multipart()
                    if header != CLIENT or answered != service:
                        raise RuntimeError(f"not a reply to this request: {header!r} {answered!r}")
                    return reply
        return None
    finally:
        context.term()


if __name__ == "__main__":
    endpoint, service, *frames = sys.argv[1:]
    reply = request(endpoint, service.encode(), [frame.encode() for frame in frames] or [b""])
    if reply is None:
        sys.exit(f"no reply from {service!r}")
    for frame in reply:
        print(frame.decode(errors="replace"))
