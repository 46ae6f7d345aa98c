"""eMQP/1.0 peers framed by hand (real ZeroMQ DEALERs) against ``domo broker`` (specs/emqp-1.0.md).

The frames are spelled out here from the spec's tables, not made by domo's code: a worker that
INFORMs, gives READY credits, answers with REPLY; a client that sends REQUESTs; and a third
peer that sends near misses while the other two keep working. The broker is the ``domo broker``
command (the Trio runtime) in its own process, with quick heartbeats (0.2 s, liveness 3).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import trio
import zmq

from ..cli.conftest import QUICK_BEATS, StartDomo, run_domo

pytestmark = [pytest.mark.io, pytest.mark.slow]

E = b"eMQP/1.0"
JOB = json.dumps(["run", {"path": "jobs", "callable": "add", "args": [1, 2]}]).encode()
Frames = list[bytes]


class HandPeer:
    """One DEALER speaking eMQP by hand; ``expect`` skips and counts the broker's HEARTBEATs."""

    def __init__(self, endpoint: str, identity: bytes) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.IDENTITY, identity)
        self.socket.connect(endpoint)
        self.heartbeats: list[float] = []

    def send(self, *frames: bytes) -> None:
        self.socket.send_multipart(list(frames))

    def recv(self, timeout: float = 5.0) -> Frames | None:
        """The next message that is not a HEARTBEAT, or None after ``timeout`` seconds."""
        until = time.monotonic() + timeout
        while (left := until - time.monotonic()) > 0:
            if not self.socket.poll(int(left * 1000) + 1):
                return None
            frames = self.socket.recv_multipart()
            assert frames[:2] == [b"", E], frames  # EMQP-01: every message from the broker
            if frames[2] == b"HEARTBEAT":
                assert len(frames) == 5, frames
                self.heartbeats.append(time.monotonic())
                continue
            return frames
        return None

    def expect(self, command: bytes, timeout: float = 5.0) -> Frames:
        frames = self.recv(timeout)
        assert frames is not None, f"no {command!r} within {timeout} s"
        assert frames[2] == command, frames
        return frames

    def close(self) -> None:
        self.socket.close()
        self.context.term()


@pytest.fixture
def peers() -> Iterator[list[HandPeer]]:
    made: list[HandPeer] = []
    yield made
    for peer in made:
        peer.close()


# Heartbeats every 0.2 s, but a hand-framed worker that sends none stays on for 5 s.
PATIENT = ["--heartbeat-interval", "0.2", "--liveness", "25"]


async def broker_endpoint(domo: StartDomo, beats: list[str] = PATIENT) -> str:
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *beats)
    return await broker.endpoint()


def inform(worker: HandPeer, queues: bytes, slots: int) -> None:
    worker.send(b"", E, b"INFORM", b"inform-1", queues, b"worker")
    ack = worker.expect(b"ACK")
    assert ack[4:] == [b"inform-1"]  # EMQP-03
    assert worker.socket.poll(5000)
    beat = worker.socket.recv_multipart()  # EMQP-15: at once, before any READY
    assert beat[2] == b"HEARTBEAT", beat
    worker.heartbeats.append(time.monotonic())
    for _ in range(slots):
        worker.send(b"", E, b"READY", b"ready")


async def test_hand_framed_worker_and_client_through_domo_broker(
    domo: StartDomo, peers: list[HandPeer]
) -> None:
    """EMQP-03, EMQP-06, EMQP-07, EMQP-10, EMQP-11, EMQP-12, EMQP-15: two credits, three
    requests; each goes out with the client's MSGID, the third after a credit comes back; the
    client gets a receipt and then the result of each."""
    with trio.fail_after(60):
        endpoint = await broker_endpoint(domo)
        worker = HandPeer(endpoint, b"worker-1")
        client = HandPeer(endpoint, b"client-1")
        peers += [worker, client]
        inform(worker, b'[[10, "jobs"], [5, "default"]]', slots=2)
        assert worker.heartbeats, "the broker heartbeats first, right after its ACK (EMQP-15)"
        for number in range(3):
            client.send(b"", E, b"REQUEST", b"m%d" % number, b"jobs", b"reply-requested", JOB)
        first, second = worker.expect(b"REQUEST"), worker.expect(b"REQUEST")
        assert first[3:] == [b"m0", b"jobs", b"reply-requested", JOB]
        assert second[3] == b"m1"
        assert worker.recv(timeout=0.5) is None  # two credits, two requests
        for request in (first, second):
            worker.send(b"", E, b"REPLY", b"w-" + request[3], b'{"value": 3}', request[3])
        worker.send(b"", E, b"READY", b"ready")
        third = worker.expect(b"REQUEST")
        assert third[3] == b"m2"
        worker.send(b"", E, b"REPLY", b"w-m2", b'{"value": 4}', b"m2")
        got: dict[bytes, list[Frames]] = {}
        while sum(len(v) for v in got.values()) < 6:
            frames = client.expect(b"REPLY")
            got.setdefault(frames[-1], []).append(frames)
        for msgid, value in ((b"m0", b"3"), (b"m1", b"3"), (b"m2", b"4")):
            receipt, result = got[msgid]
            assert len(receipt) == 5  # "", eMQP/1.0, REPLY, id, msgid (EMQP-11)
            assert result[4] == b'{"value": %s}' % value  # EMQP-12
            assert receipt[3] != result[3]  # the broker's own ids (EMQP-24)


async def test_a_silent_worker_is_forgotten_and_comes_back_with_inform(
    domo: StartDomo, peers: list[HandPeer]
) -> None:
    """EMQP-15, EMQP-06, EMQP-14: the broker heartbeats a quiet worker every interval; silent past
    the liveness span it is forgotten (no more heartbeats, its READY is not a credit); as EventMQ's
    jobmanager does, it INFORMs again and is served."""
    with trio.fail_after(60):
        endpoint = await broker_endpoint(domo, QUICK_BEATS)
        worker = HandPeer(endpoint, b"worker-q")
        client = HandPeer(endpoint, b"client-q")
        peers += [worker, client]
        inform(worker, b"", slots=0)
        assert worker.recv(timeout=0.5) is None
        assert len(worker.heartbeats) >= 2  # every 0.2 s while the worker speaks
        assert worker.recv(timeout=1.5) is None  # silent past 0.6 s: forgotten
        count = len(worker.heartbeats)
        assert worker.recv(timeout=0.6) is None
        assert len(worker.heartbeats) == count  # no more heartbeats for it
        worker.send(b"", E, b"READY", b"ready")  # no INFORM in force: not a credit
        client.send(b"", E, b"REQUEST", b"m1", b"default", b"reply-requested", JOB)
        assert worker.recv(timeout=0.5) is None
        inform(worker, b"", slots=1)
        assert worker.expect(b"REQUEST")[3] == b"m1"


NEAR_MISSES: list[tuple[str, Frames, bytes | None]] = [
    ("no MSGID", [b"", E, b"REQUEST"], None),
    ("empty MSGID", [b"", E, b"REQUEST", b"", b"jobs", b"", JOB], None),
    ("no message", [b"", E, b"REQUEST", b"x1", b"jobs", b""], b"REPLY"),
    ("not a job", [b"", E, b"REQUEST", b"x2", b"jobs", b"reply-requested", b"{]"], b"REPLY"),
    ("bad timeout", [b"", E, b"REQUEST", b"x3", b"jobs", b"timeout:soon", JOB], b"REPLY"),
    ("not UTF-8", [b"", E, b"REQUEST", b"x4", b"jobs", b"\xc3\x28", JOB], b"REPLY"),
    ("schedule", [b"", E, b"SCHEDULE", b"x5", b"jobs", b"", b"5", JOB, b""], b"REPLY"),
    ("publish", [b"", E, b"PUBLISH", b"x6", b"topic", JOB], b"REPLY"),
    ("reply, no inform", [b"", E, b"REPLY", b"x7", b"{}", b"m0"], None),
    ("ready, no inform", [b"", E, b"READY", b"x8"], None),
    ("kbye, no inform", [b"", E, b"KBYE", b"x9"], None),
    ("other version", [b"", b"eMQP/1.1", b"READY", b"x10"], None),
    ("no delimiter", [E, b"READY", b"x11"], None),
    ("ack from a peer", [b"", E, b"ACK", b"x12", b"m0"], None),
    ("scheduler", [b"", E, b"INFORM", b"x13", b"", b"scheduler"], b"DISCONNECT"),
    ("bad queues", [b"", E, b"INFORM", b"x14", b'[[1, "mmi.x"]]', b"worker"], b"DISCONNECT"),
]


async def test_near_misses_get_their_answer_and_harm_no_one(
    domo: StartDomo, peers: list[HandPeer]
) -> None:
    """EMQP-02, EMQP-04, EMQP-06, EMQP-09, EMQP-17, EMQP-18, EMQP-25: each near miss, from a
    peer of its own, gets the spec's answer or none; the worker and client beside them go on
    working."""
    with trio.fail_after(90):
        endpoint = await broker_endpoint(domo)
        worker = HandPeer(endpoint, b"worker-n")
        client = HandPeer(endpoint, b"client-n")
        peers += [worker, client]
        inform(worker, b'[[10, "jobs"]]', slots=1)
        for number, (what, frames, answer) in enumerate(NEAR_MISSES):
            bad = HandPeer(endpoint, b"bad-%d" % number)
            peers.append(bad)
            bad.send(*frames)
            got = bad.recv(timeout=0.3 if answer is None else 5.0)
            assert (None if got is None else got[2]) == answer, (what, got)
            if answer == b"REPLY":
                assert "error" in json.loads(got[4]), what  # type: ignore[index]
                assert got[5] == frames[3], what  # type: ignore[index]
            # The good pair is unharmed after each one.
            msgid = b"good-%d" % number
            client.send(b"", E, b"REQUEST", msgid, b"jobs", b"reply-requested", JOB)
            request = worker.expect(b"REQUEST")
            assert request[3] == msgid, what
            worker.send(b"", E, b"REPLY", b"w", b'{"value": 3}', msgid)
            worker.send(b"", E, b"READY", b"ready")
            assert client.expect(b"REPLY")[-1] == msgid  # receipt
            result = client.expect(b"REPLY")
            assert (result[4], result[5]) == (b'{"value": 3}', msgid), what
        client.send(b"", E, b"REQUEST", b"q", b"mmi.service", b"reply-requested", b"jobs")
        assert client.expect(b"REPLY")[4:] == [b"200", b"q"]  # EMQP-25


async def test_domo_call_and_domo_worker_meet_hand_framed_emqp_peers(
    domo: StartDomo, peers: list[HandPeer]
) -> None:
    """EMQP-20, EMQP-21: `domo call` (MDP/0.2) is served by a hand-framed eMQP worker, and a
    hand-framed eMQP client by `domo worker echo`."""
    with trio.fail_after(60):
        endpoint = await broker_endpoint(domo)
        worker = HandPeer(endpoint, b"worker-x")
        client = HandPeer(endpoint, b"client-x")
        peers += [worker, client]
        inform(worker, b'[[10, "jobs"]]', slots=1)
        async with trio.open_nursery() as nursery:
            called: list[str] = []

            async def call() -> None:
                done = await run_domo("call", "jobs", JOB.decode(), "--connect", endpoint)
                called.append(done.stdout)

            nursery.start_soon(call)
            request = await trio.to_thread.run_sync(worker.expect, b"REQUEST", 10.0)
            assert request[4:] == [b"jobs", b"reply-requested", JOB]
            worker.send(b"", E, b"REPLY", b"w", b'{"value": 3}', request[3])
        assert called == ['{"value": 3}\n']
        await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
        await trio.sleep(0.5)
        client.send(b"", E, b"REQUEST", b"e1", b"echo", b"reply-requested", JOB)
        client.expect(b"REPLY")  # receipt
        assert client.expect(b"REPLY")[4:] == [JOB, b"e1"]
