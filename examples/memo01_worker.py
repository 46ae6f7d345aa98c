"""A MemoDB (memo01) worker with pynng and cbor2 only: no domo import, the protocol by hand.

It serves ``reverse`` (the payload reversed) at a broker's NNG endpoint, so that any client of
the broker can call it: a memo01 client over NNG, or an MDP client over ZeroMQ through the same
``domo broker``::

    pip install '.[nng]'
    domo broker --bind tcp://127.0.0.1:5555 --bind nng+tcp://127.0.0.1:5556
    python examples/memo01_worker.py tcp://127.0.0.1:5556
    domo call reverse hello        # prints "olleh"

A memo01 message is one NNG message: a CBOR header ``["memo01", type, id, ...]`` then the
payload (specs/memo01.md). The worker sends READY with its services, then answers each reply of
the broker: a JOB with a RESULT, a HEARTBEAT with a HEARTBEAT, a DISCONNECT with a new READY.
Ctrl-C stops it at the broker's next message (a HEARTBEAT comes every few seconds).
"""

from __future__ import annotations

import io
import sys

import cbor2
import pynng

READY, JOB, RESULT, HEARTBEAT, DISCONNECT = 1, 2, 3, 4, 5


def header(*items: object) -> bytes:
    return cbor2.dumps(["memo01", *items], canonical=True)


def split(message: bytes) -> tuple[list[object], bytes]:
    """The CBOR header and the payload after it."""
    stream = io.BytesIO(message)
    decoded = cbor2.CBORDecoder(stream).decode()
    return decoded, message[stream.tell() :]


def main(url: str, service: str = "reverse") -> None:
    ready = header(READY, b"", [service])
    with pynng.Req0(dial=url) as socket:
        context = socket.new_context()  # one context per worker: it does one job at a time
        context.send(ready)
        print(f"serving {service!r} at {url}", flush=True)
        while True:
            (_, kind, worker_id, *_), payload = split(context.recv())
            if kind == JOB:
                context.send(header(RESULT, worker_id) + payload[::-1])
            elif kind == HEARTBEAT:
                context.send(header(HEARTBEAT, worker_id))
            elif kind == DISCONNECT:  # the broker restarted or dropped us: start again
                context.send(ready)


if __name__ == "__main__":
    main(*sys.argv[1:])
