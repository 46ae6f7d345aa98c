"""DCP v1 peers framed by hand on real ZeroMQ sockets against ``domo broker`` (a subprocess).

The frames are written out here from the DCP text (1-byte type frame) and from the wire
captures of DagBox's broker (4-byte little-endian type frame); nothing of domo is imported to
build or read them. A DCP worker (4-byte, like DagBox's) and a DCP client (1-byte, like the text)
talk through the broker, with several requests in flight; an MDP/0.2 client calls the DCP
worker and the DCP client calls ``domo worker echo`` (MDP/0.2). Then a stream of near misses
hits the live broker while those peers keep being served (specs/dcp-v1.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import zmq

from tests.interop.test_reqrep import broker_endpoint, domo_process, wait_for_service

pytestmark = [pytest.mark.io]

H = b"DGBX\x01"
REG1, PING1, PONG1, REQ1, REP1, RECON1 = (bytes([n]) for n in range(1, 7))
REG4, PING4, PONG4, REQ4, REP4, RECON4 = (n.to_bytes(4, "little") for n in range(1, 7))
INTERVAL = 0.5
BEATS = ["--heartbeat-interval", str(INTERVAL), "--liveness", "6"]
WAIT_MS = 5000
Context = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def context() -> Iterator[Context]:
    ctx: Context = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.term()


def dealer(context: Context, endpoint: str) -> zmq.Socket[bytes]:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    return sock


def receive(sock: zmq.Socket[bytes], timeout_ms: int = WAIT_MS) -> list[bytes]:
    assert sock.poll(timeout_ms), "nothing from the broker in time"
    return sock.recv_multipart()


class UpperWorker:
    """A DCP worker in DagBox's 4-byte framing: registers, pings, upper-cases data parts and
    copies the client address and metadata into its reply, as the text says."""

    def __init__(self, context: Context, endpoint: str, service: bytes) -> None:
        self.sock = dealer(context, endpoint)
        self.service = service
        self.stop = threading.Event()
        self.served = 0
        self.pongs = 0
        self.problems: list[str] = []
        self.sock.send_multipart([b"", H, REG4, service])
        echo = receive(self.sock)
        assert echo == [b"", H, REG4, service], echo  # DCP-04
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last_ping = float("-inf")
        while not self.stop.is_set():
            if time.monotonic() - last_ping >= INTERVAL / 2:
                self.sock.send_multipart([b"", H, PING4])
                last_ping = time.monotonic()
            if not self.sock.poll(50):
                continue
            frames = self.sock.recv_multipart()
            if frames == [b"", H, PONG4]:
                self.pongs += 1  # DCP-13
                continue
            if frames[:4] != [b"", H, REQ4, self.service]:
                self.problems.append(f"unexpected {frames!r}")
                continue
            client = frames[4]
            meta_end = frames.index(b"", 6)
            metadata, data = frames[6:meta_end], frames[meta_end + 1 :]
            reply = [b"", H, REP4, client, b"", *metadata, b"", *(d.upper() for d in data)]
            self.sock.send_multipart(reply)
            self.served += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``domo broker`` on 127.0.0.1 for this module, with ``domo worker echo`` (MDP/0.2)
    registered; each test uses services of its own."""
    tmp_path = tmp_path_factory.mktemp("dcp-broker")
    with ExitStack() as stack:
        process = stack.enter_context(
            domo_process(tmp_path, "broker", "broker", "--bind", "tcp://127.0.0.1:0", *BEATS)
        )
        endpoint = broker_endpoint(tmp_path, "broker", process)
        stack.enter_context(
            domo_process(tmp_path, "worker", "worker", "echo", "--connect", endpoint, *BEATS)
        )
        ctx: Context = zmq.Context()
        try:
            wait_for_service(ctx, endpoint, b"echo")
        finally:
            ctx.term()
        yield endpoint
        assert process.poll() is None, "the broker died"


def test_dcp_peers_across_widths_and_dialects(broker: str, context: Context) -> None:
    """DCP-02, DCP-03, DCP-04, DCP-08, DCP-09, DCP-10, DCP-11, DCP-13, DCP-21, DCP-22."""
    worker = UpperWorker(context, broker, b"upper")
    client = dealer(context, broker)
    try:
        # Several requests in flight, told apart by metadata; one goes to the MDP/0.2 echo.
        for n in range(4):
            client.send_multipart([b"", H, REQ1, b"upper", b"", b"id-%d" % n, b"", b"x%d" % n])
        client.send_multipart([b"", H, REQ1, b"echo", b"", b"id-e", b"t", b"", b"hi", b"there"])
        replies: dict[tuple[bytes, ...], tuple[bytes, list[bytes]]] = {}
        while len(replies) < 5:
            frames = receive(client)
            assert frames[:3] == [b"", H, REP1], frames  # the client's own width (DCP-03)
            assert frames[4] == b""
            end = frames.index(b"", 5)
            replies[tuple(frames[5:end])] = (frames[3], frames[end + 1 :])
        for n in range(4):
            assert replies[(b"id-%d" % n,)][1] == [b"X%d" % n]
        assert replies[(b"id-e", b"t")][1] == [b"hi", b"there"]
        identities = {address for address, _ in replies.values()}
        assert len(identities) == 1  # the client's own routing id, as DagBox sends it
        # An MDP/0.2 client calls the DCP worker.
        mdp = dealer(context, broker)
        mdp.send_multipart([b"MDPC02", b"\x01", b"upper", b"abc", b"de"])
        assert receive(mdp) == [b"MDPC02", b"\x03", b"upper", b"ABC", b"DE"]
        mdp.close()
        assert worker.served == 5
        deadline = time.monotonic() + 5
        while worker.pongs == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.pongs > 0  # DCP-13: its pings are answered
        assert not worker.problems
    finally:
        client.close()
        worker.close()


def test_ping_from_a_stranger_gets_reconnect_then_registration_works(
    broker: str, context: Context
) -> None:
    """DCP-14: reconnect to an unknown peer, in its own width; it registers and gets pong."""
    stranger = dealer(context, broker)
    try:
        stranger.send_multipart([b"", H, PING1])
        assert receive(stranger) == [b"", H, RECON1]
        stranger.send_multipart([b"", H, REG1, b"late"])
        assert receive(stranger) == [b"", H, REG1, b"late"]
        stranger.send_multipart([b"", H, PING1])
        assert receive(stranger) == [b"", H, PONG1]
    finally:
        stranger.close()


NEAR_MISSES: list[list[bytes]] = [
    [b"", b"DGBX\x02", REQ1, b"upper", b"", b"", b"x"],  # another version (DCP-01)
    [b"", b"DGBX", REQ1],  # a short header
    [b"", H],  # no type (DCP-02)
    [b"", H, b"\x04\x00"],  # a 2-byte type
    [b"", H, b"\x09"],  # no such type
    [b"", H, b"\x04\x00\x00\x01"],  # a wide type out of range
    [b"", H, REQ1],  # a request without service (DCP-06)
    [b"", H, REQ4, b"upper", b"addr", b"m"],  # the address's delimiter missing
    [b"", H, REQ4, b"upper", b"", b"m1"],  # the metadata delimiter missing
    [b"", H, REQ1, b"\xffbad", b"", b"", b"x"],  # a service name (DCP-05)
    [b"", H, REG1],  # a registration without service (DCP-04)
    [b"", H, REG4, b"mmi.grab"],
    [b"", H, REP1, b"", b"", b"d"],  # a reply naming no client (DCP-12)
    [b"", H, REP4, b"nobody", b"", b"", b"d"],  # a reply from a stranger: reconnect
    [b"", H, PONG4],  # broker-only types (DCP-15)
    [b"", H, RECON1],
    [b"", H, PING1, b"extra"],  # a ping with parts (DCP-13)
    [b"", H, REG1, b"a", b"b"],
]


def test_near_misses_while_others_are_served(broker: str, context: Context) -> None:
    """DCP-23: every near miss is dropped (or answered by the text's rules); the broker lives
    and the honest peers keep being served meanwhile."""
    worker = UpperWorker(context, broker, b"upper2")
    client = dealer(context, broker)
    attacker = dealer(context, broker)
    stop = threading.Event()
    answers: list[list[bytes]] = []

    def attack() -> None:
        while not stop.is_set():
            for frames in NEAR_MISSES:
                attacker.send_multipart(frames)
            while attacker.poll(0):
                answers.append(attacker.recv_multipart())
            time.sleep(0.01)

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    try:
        for n in range(30):
            client.send_multipart([b"", H, REQ4, b"upper2", b"", b"n%d" % n, b"", b"v"])
            reply = receive(client)
            assert reply[:3] == [b"", H, REP4]
            assert reply[4:] == [b"", b"n%d" % n, b"", b"V"]
            client.send_multipart([b"", H, REQ1, b"echo", b"", b"e%d" % n, b"", b"w"])
            assert receive(client)[-3:] == [b"e%d" % n, b"", b"w"]
        assert not worker.problems
        stop.set()
        thread.join(timeout=10)
        # The one near miss the text answers: a reply from a stranger gets reconnect (DCP-12).
        assert answers
        assert all(answer == [b"", H, RECON4] for answer in answers), answers[:3]
    finally:
        stop.set()
        thread.join(timeout=10)
        attacker.close()
        client.close()
        worker.close()


def test_a_silent_worker_loses_its_request_to_another(broker: str, context: Context) -> None:
    """DCP-16, DCP-14: a DCP worker that stops pinging mid-request is expired and the request
    goes to another worker; when the silent one pings again it is told to reconnect."""
    silent = dealer(context, broker)
    client = dealer(context, broker)
    standby: UpperWorker | None = None
    try:
        silent.send_multipart([b"", H, REG1, b"slow"])
        assert receive(silent) == [b"", H, REG1, b"slow"]
        client.send_multipart([b"", H, REQ1, b"slow", b"", b"job", b"", b"data"])
        taken = receive(silent)
        assert taken[:4] == [b"", H, REQ1, b"slow"]
        standby = UpperWorker(context, broker, b"slow")  # idle, pinging; the first is silent
        reply = receive(client, timeout_ms=int(6 * INTERVAL * 1000 + WAIT_MS))
        assert reply[:3] == [b"", H, REP1]
        assert reply[4:] == [b"", b"job", b"", b"DATA"]  # served by the standby (upper-cased)
        silent.send_multipart([b"", H, PING1])
        assert receive(silent) == [b"", H, RECON1]
    finally:
        silent.close()
        client.close()
        if standby is not None:
            standby.close()
