"""RFC 7's asynchronous client through ``domo broker``: a DEALER that sends 24 requests first.

RFC 7 (MDP/0.1): "Clients MAY use a DEALER (XREQ) socket when implementing an asynchronous
pattern"; the ZeroMQ Guide's ``mdcliapi2.py`` / ``mdclient2.py`` is such a client: it sends its
requests, then reads as many replies (each ``"", "MDPC01", service, body``; RFC 7's replies name
the service, not the request, so it counts them). Written here from the RFC's frame tables, with
plain blocking pyzmq and no domo import, like the worker it meets: an MDP/0.1 worker on a DEALER
(``"", "MDPW01", command, ...``, heartbeating as RFC 7 asks), or ``domo worker echo`` (MDP/0.2).
Every one of the 24 must come back, each body once (MDP01-09, FAM-08).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import zmq

from .test_reqrep import BEATS, Context, broker_endpoint, context, domo_process, wait_for_service

pytestmark = [pytest.mark.io]

__all__ = ["context"]  # the fixture, used by name

MDPC01, MDPW01 = b"MDPC01", b"MDPW01"
READY, REQUEST, REPLY, HEARTBEAT, DISCONNECT = b"\x01", b"\x02", b"\x03", b"\x04", b"\x05"
REQUESTS = 24


def rfc7_worker(context: Context, endpoint: str, service: bytes, stop: threading.Event) -> int:
    """An RFC 7 worker on a DEALER: READY, then REQUEST -> REPLY (the body upper-cased),
    HEARTBEAT every 0.2 s, DISCONNECT when told to stop; returns the requests it answered."""
    answered = 0
    with context.socket(zmq.DEALER) as worker:
        worker.linger = 0
        worker.connect(endpoint)
        worker.send_multipart([b"", MDPW01, READY, service])
        beat_at = time.monotonic() + 0.2
        while not stop.is_set():
            if worker.poll(50):
                frames = worker.recv_multipart()
                assert frames[:2] == [b"", MDPW01], frames
                if frames[2] == REQUEST:
                    client, empty, *body = frames[3:]
                    assert empty == b""
                    reply = [b.upper() for b in body]
                    worker.send_multipart([b"", MDPW01, REPLY, client, b"", *reply])
                    answered += 1
                else:
                    assert frames[2] == HEARTBEAT, frames
            if time.monotonic() >= beat_at:
                worker.send_multipart([b"", MDPW01, HEARTBEAT])
                beat_at = time.monotonic() + 0.2
        worker.send_multipart([b"", MDPW01, DISCONNECT])
    return answered


def rfc7_async_client(context: Context, endpoint: str, service: bytes) -> list[bytes]:
    """mdclient2's dialog: send REQUESTS requests on one DEALER, then read the replies."""
    with context.socket(zmq.DEALER) as client:
        client.linger = 0
        client.connect(endpoint)
        for index in range(REQUESTS):
            client.send_multipart([b"", MDPC01, service, b"hello %d" % index])
        replies: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(replies) < REQUESTS and time.monotonic() < deadline:
            if client.poll(200):
                empty, header, named, *body = client.recv_multipart()
                assert (empty, header, named) == (b"", MDPC01, service)
                replies.extend(body)
        return replies


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    with domo_process(
        tmp_path, "broker", "broker", "--bind", "tcp://127.0.0.1:0", *BEATS
    ) as process:
        yield broker_endpoint(tmp_path, "broker", process)


def test_mdp01_09_24_of_24_replies_from_an_rfc7_worker(context: Context, broker: str) -> None:
    stop = threading.Event()
    answered: list[int] = []
    thread = threading.Thread(
        target=lambda: answered.append(rfc7_worker(context, broker, b"upper", stop))
    )
    thread.start()
    try:
        wait_for_service(context, broker, b"upper")
        replies = rfc7_async_client(context, broker, b"upper")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert sorted(replies) == sorted(b"HELLO %d" % index for index in range(REQUESTS))
    assert answered == [REQUESTS]


def test_mdp01_09_24_of_24_replies_from_domo_workers(
    context: Context, broker: str, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        for name in ("w1", "w2"):  # two, so that replies may come back out of order
            stack.enter_context(
                domo_process(tmp_path, name, "worker", "echo", "--connect", broker, *BEATS)
            )
        wait_for_service(context, broker, b"echo")
        replies = rfc7_async_client(context, broker, b"echo")
    assert sorted(replies) == sorted(b"hello %d" % index for index in range(REQUESTS))
