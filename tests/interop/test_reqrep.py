"""REQ clients and ROUTER-DEALER hops (28/REQREP) through ``domo broker``, framed by hand.

The client side is MDP/0.1 as RFC 7 frames it: a REQ socket, whose empty delimiter ZeroMQ adds,
then ``MDPC01``, the service and the body; the one reply comes back as ``MDPC01``, the service
and the body. Behind one or two real ``zmq.proxy`` hops (ROUTER front, DEALER back), each hop
pushes a routing id onto the envelope; the broker must hand the reply back with the whole address
stack intact, or the proxies cannot route it home. The worker is domo's own MDP/0.2
``domo worker echo``, so these requests also cross dialects.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import zmq

pytestmark = [
    pytest.mark.io,
]

BEATS = ["--heartbeat-interval", "0.2", "--liveness", "3"]
REPLY_TIMEOUT_MS = 5000
Context = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def context() -> Iterator[Context]:
    """A ZeroMQ context of the test's own, terminated at the end (every socket has linger 0)."""
    ctx: Context = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.term()


@contextmanager
def domo_process(tmp_path: Path, name: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m domo ARGS`` with output to files; SIGKILLed by PID at exit if still running."""
    out = (tmp_path / f"{name}.out").open("wb")
    err = (tmp_path / f"{name}.err").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "domo", *args], stdin=subprocess.DEVNULL, stdout=out, stderr=err
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)  # only a process this helper started
        process.wait(timeout=10)
        out.close()
        err.close()


def broker_endpoint(tmp_path: Path, name: str, process: subprocess.Popen[bytes]) -> str:
    """The endpoint ``domo broker`` prints once it listens (bounded wait)."""
    path = tmp_path / f"{name}.out"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if "listening on " in line:
                return line.rsplit(" ", 1)[1]
        assert process.poll() is None, (tmp_path / f"{name}.err").read_text()
        time.sleep(0.02)
    raise AssertionError("domo broker never said where it listens")


@pytest.fixture
def broker_with_echo(tmp_path: Path, context: Context) -> Iterator[str]:
    """A ``domo broker`` on 127.0.0.1 and one ``domo worker echo``; yields the endpoint."""
    with ExitStack() as stack:
        broker = stack.enter_context(
            domo_process(tmp_path, "broker", "broker", "--bind", "tcp://127.0.0.1:0", *BEATS)
        )
        endpoint = broker_endpoint(tmp_path, "broker", broker)
        stack.enter_context(
            domo_process(tmp_path, "worker", "worker", "echo", "--connect", endpoint, *BEATS)
        )
        wait_for_service(context, endpoint, b"echo")
        yield endpoint


def wait_for_service(context: Context, endpoint: str, service: bytes) -> None:
    """Ask ``mmi.service`` in MDP/0.2 until the worker has registered (at most 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with context.socket(zmq.DEALER) as client:
            client.linger = 0
            client.connect(endpoint)
            client.send_multipart([b"MDPC02", b"\x01", b"mmi.service", service])
            if client.poll(2000) and client.recv_multipart()[-1] == b"200":
                return
        time.sleep(0.05)
    raise AssertionError(f"no worker registered {service!r}")


@contextmanager
def proxy_hop(context: Context, upstream: str) -> Iterator[str]:
    """A real ``zmq.proxy`` (ROUTER front bound on 127.0.0.1, DEALER back to ``upstream``)."""
    front = context.socket(zmq.ROUTER)
    back = context.socket(zmq.DEALER)
    control = context.socket(zmq.PAIR)
    steer = context.socket(zmq.PAIR)
    for sock in (front, back, control, steer):
        sock.linger = 0
    port = front.bind_to_random_port("tcp://127.0.0.1")
    back.connect(upstream)
    address = f"inproc://proxy-control-{id(front)}"
    control.bind(address)
    steer.connect(address)
    thread = threading.Thread(
        target=zmq.proxy_steerable, args=(front, back, None, control), daemon=True
    )
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        steer.send(b"TERMINATE")
        thread.join(timeout=10)
        assert not thread.is_alive(), "the proxy did not stop"
        for sock in (front, back, control, steer):
            sock.close()


def mdp01_request(
    context: Context, endpoint: str, service: bytes, body: list[bytes]
) -> list[bytes]:
    """One MDP/0.1 request from a REQ socket; the reply's frames (REQ strips the delimiter)."""
    client: zmq.Socket[bytes]
    with context.socket(zmq.REQ) as client:
        client.linger = 0
        client.connect(endpoint)
        client.send_multipart([b"MDPC01", service, *body])
        assert client.poll(REPLY_TIMEOUT_MS), "no reply in time"
        return list(client.recv_multipart())


def test_mdp01_req_client_direct(broker_with_echo: str, context: Context) -> None:
    """MDP01: a REQ client's request to an MDP/0.2 worker gets its one reply."""
    for number in range(3):
        body = [b"frame one %d" % number, b"", b"frame three"]
        assert mdp01_request(context, broker_with_echo, b"echo", body) == [
            b"MDPC01",
            b"echo",
            *body,
        ]


@pytest.mark.parametrize("hops", [1, 2])
def test_mdp01_req_client_behind_proxies(
    broker_with_echo: str, context: Context, hops: int
) -> None:
    """REQREP: each hop's routing id is kept, so the reply finds its way back through them."""
    with ExitStack() as stack:
        endpoint = broker_with_echo
        for _ in range(hops):
            endpoint = stack.enter_context(proxy_hop(context, endpoint))
        for number in range(3):
            body = [b"via %d hops, request %d" % (hops, number)]
            assert mdp01_request(context, endpoint, b"echo", body) == [b"MDPC01", b"echo", *body]


def test_two_req_clients_behind_one_proxy_get_their_own_replies(
    broker_with_echo: str, context: Context
) -> None:
    """REQREP: two clients share the hop's connection to the broker; replies are not crossed."""
    with proxy_hop(context, broker_with_echo) as endpoint, ExitStack() as stack:
        clients = []
        for _ in range(2):
            sock = stack.enter_context(context.socket(zmq.REQ))
            sock.linger = 0
            sock.connect(endpoint)
            clients.append(sock)
        for index, sock in enumerate(clients):
            sock.send_multipart([b"MDPC01", b"echo", b"from client %d" % index])
        for index, sock in enumerate(clients):
            assert sock.poll(REPLY_TIMEOUT_MS), f"client {index} got no reply"
            assert sock.recv_multipart() == [b"MDPC01", b"echo", b"from client %d" % index]


def test_mdp01_mmi_from_req_client(broker_with_echo: str, context: Context) -> None:
    """MMI answers an MDP/0.1 REQ client too."""
    assert mdp01_request(context, broker_with_echo, b"mmi.service", [b"echo"]) == [
        b"MDPC01",
        b"mmi.service",
        b"200",
    ]
    assert mdp01_request(context, broker_with_echo, b"mmi.service", [b"nobody"]) == [
        b"MDPC01",
        b"mmi.service",
        b"404",
    ]


def test_mdp01_worker_serves_mdp02_and_mdp01_clients(tmp_path: Path, context: Context) -> None:
    """MDP01 worker framing (RFC 7): READY, REQUEST with the client's address, one REPLY."""
    with domo_process(tmp_path, "broker", "broker", "--bind", "tcp://127.0.0.1:0", *BEATS) as b:
        endpoint = broker_endpoint(tmp_path, "broker", b)
        with context.socket(zmq.DEALER) as worker:
            worker.linger = 0
            worker.connect(endpoint)
            worker.send_multipart([b"", b"MDPW01", b"\x01", b"upper01"])
            wait_for_service(context, endpoint, b"upper01")
            with context.socket(zmq.DEALER) as client02, context.socket(zmq.REQ) as client01:
                for sock in (client02, client01):
                    sock.linger = 0
                    sock.connect(endpoint)
                client02.send_multipart([b"MDPC02", b"\x01", b"upper01", b"from 0.2"])
                client01.send_multipart([b"MDPC01", b"upper01", b"from 0.1"])
                for _ in range(2):
                    frames = next_request(worker)
                    assert frames[:3] == [b"", b"MDPW01", b"\x02"], frames
                    address, delimiter, body = frames[3], frames[4], frames[5:]
                    assert delimiter == b"", frames
                    worker.send_multipart(
                        [b"", b"MDPW01", b"\x03", address, b"", *(f.upper() for f in body)]
                    )
                assert client02.poll(REPLY_TIMEOUT_MS)
                assert client02.recv_multipart() == [b"MDPC02", b"\x03", b"upper01", b"FROM 0.2"]
                assert client01.poll(REPLY_TIMEOUT_MS)
                assert client01.recv_multipart() == [b"MDPC01", b"upper01", b"FROM 0.1"]


def next_request(worker: zmq.Socket[bytes]) -> list[bytes]:
    """The next non-HEARTBEAT message the broker sends an MDP/0.1 worker (answering beats)."""
    deadline = time.monotonic() + REPLY_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        if not worker.poll(100):
            worker.send_multipart([b"", b"MDPW01", b"\x04"])
            continue
        frames = worker.recv_multipart()
        if frames[:3] == [b"", b"MDPW01", b"\x04"]:
            worker.send_multipart([b"", b"MDPW01", b"\x04"])
            continue
        return frames
    raise AssertionError("the broker sent the MDP/0.1 worker no request")
