"""MDP/0.2 peers framed by hand from the frame tables of RFC 18, to test domo against.

Nothing here imports domo: the frames are spelled out below from the RFC's text (client
REQUEST/PARTIAL/FINAL, worker READY/REQUEST/PARTIAL/FINAL/HEARTBEAT/DISCONNECT), with plain
blocking pyzmq, a ``zmq.Poller`` with timeouts, and heartbeats kept by hand. Each peer checks
every message it receives against the tables (a mismatch raises ``FrameError``) and records
what it received, with ``time.monotonic()`` times, for the tests to inspect.

- ``HandClient``: a DEALER; ``request()`` sends one REQUEST and returns PARTIAL* and the FINAL.
- ``HandWorker``: a DEALER; ``run(stop)`` sends READY, answers requests, heartbeats, and on
  ``stop`` sends DISCONNECT and then listens a while for anything the broker should not send.
- ``HandBroker``: a ROUTER; ``run(stop)`` registers workers, queues and routes requests,
  forwards PARTIAL/FINAL, heartbeats and expires workers; ``disconnect(worker)`` sends one
  DISCONNECT.

``run`` blocks: the tests call it in a thread. Each peer owns its context and closes its socket
and context when it is done (``close``); every loop is bounded by a time limit.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

# The RFC's frames, as bytes (frame 0 is the protocol header, frame 1 the command).
CLIENT = b"MDPC02"
WORKER = b"MDPW02"
C_REQUEST, C_PARTIAL, C_FINAL = b"\x01", b"\x02", b"\x03"
W_READY, W_REQUEST, W_PARTIAL, W_FINAL, W_HEARTBEAT, W_DISCONNECT = (
    b"\x01",
    b"\x02",
    b"\x03",
    b"\x04",
    b"\x05",
    b"\x06",
)
COMMAND_NAMES = {
    W_READY: "READY",
    W_REQUEST: "REQUEST",
    W_PARTIAL: "PARTIAL",
    W_FINAL: "FINAL",
    W_HEARTBEAT: "HEARTBEAT",
    W_DISCONNECT: "DISCONNECT",
}
FROM_BROKER = frozenset({"REQUEST", "HEARTBEAT", "DISCONNECT"})
FROM_WORKER = frozenset({"READY", "PARTIAL", "FINAL", "HEARTBEAT", "DISCONNECT"})

Frames = list[bytes]


class FrameError(AssertionError):
    """A message that does not match RFC 18's frame tables."""


def worker_command(frames: Frames, from_broker: bool) -> str:
    """The name of a worker-protocol command after checking its frames, else ``FrameError``."""
    if len(frames) < 2 or frames[0] != WORKER or frames[1] not in COMMAND_NAMES:
        raise FrameError(f"not an MDP/0.2 worker command: {frames!r}")
    name = COMMAND_NAMES[frames[1]]
    if name not in (FROM_BROKER if from_broker else FROM_WORKER):
        raise FrameError(f"{name} cannot come from the {'broker' if from_broker else 'worker'}")
    if name == "READY" and len(frames) != 3:
        raise FrameError(f"READY has exactly 3 frames: {frames!r}")
    if name in ("HEARTBEAT", "DISCONNECT") and len(frames) != 2:
        raise FrameError(f"{name} has exactly 2 frames: {frames!r}")
    if name in ("REQUEST", "PARTIAL", "FINAL") and (len(frames) < 5 or frames[3] != b""):
        raise FrameError(f"{name} is header, command, address, empty, body+: {frames!r}")
    return name


def client_reply(frames: Frames, service: bytes) -> tuple[str, Frames]:
    """``("PARTIAL" | "FINAL", body)`` after checking a reply's frames, else ``FrameError``."""
    if len(frames) < 4 or frames[0] != CLIENT or frames[1] not in (C_PARTIAL, C_FINAL):
        raise FrameError(f"not an MDP/0.2 client PARTIAL or FINAL: {frames!r}")
    if frames[2] != service:
        raise FrameError(f"a reply for {frames[2]!r}, not {service!r}")
    return ("PARTIAL" if frames[1] == C_PARTIAL else "FINAL"), frames[3:]


def _dealer(endpoint: str) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 500)  # a DISCONNECT sent just before close still leaves
    socket.connect(endpoint)
    return context, socket


def _close(context: zmq.Context[zmq.Socket[bytes]], socket: zmq.Socket[bytes]) -> None:
    if not socket.closed:
        socket.close()
    if not context.closed:
        context.term()


class HandClient:
    """An MDP/0.2 client on one DEALER: one request at a time, as the RFC says."""

    def __init__(self, endpoint: str) -> None:
        self._context, self._socket = _dealer(endpoint)

    def request(self, service: bytes, *body: bytes, timeout: float) -> list[tuple[str, Frames]]:
        """Send REQUEST; return every PARTIAL and the FINAL as ``(kind, body)``, in order."""
        self._socket.send_multipart([CLIENT, C_REQUEST, service, *body])
        replies: list[tuple[str, Frames]] = []
        deadline = time.monotonic() + timeout
        while not replies or replies[-1][0] != "FINAL":
            left = deadline - time.monotonic()
            if left <= 0 or not self._socket.poll(int(left * 1000) + 1):
                raise TimeoutError(f"no FINAL for {service!r} in {timeout} s; got {replies!r}")
            replies.append(client_reply(self._socket.recv_multipart(), service))
        return replies

    def close(self) -> None:
        _close(self._context, self._socket)


Handler = Callable[[Frames], list[Frames]]  # request body -> reply bodies; the last is FINAL


@dataclass
class HandWorker:
    """An MDP/0.2 worker on one DEALER, with its heartbeats done by hand.

    ``received``: ``(time, command, frames)`` for every message from the broker while serving;
    ``after_disconnect``: ``(seconds after our DISCONNECT, frames)`` of anything that arrived
    after it (the broker "MUST send no further commands to that worker" once it has the
    DISCONNECT; a message already on its way when the broker got it may still arrive).
    ``lost_broker`` is set if the broker fell silent for ``liveness`` intervals;
    ``told_to_disconnect`` if it sent DISCONNECT (both end ``run``).
    """

    endpoint: str
    service: bytes
    interval: float
    liveness: int
    handler: Handler
    received: list[tuple[float, str, Frames]] = field(default_factory=list)
    sent: list[tuple[float, str]] = field(default_factory=list)
    after_disconnect: list[tuple[float, Frames]] = field(default_factory=list)
    lost_broker: bool = False
    told_to_disconnect: bool = False

    def __post_init__(self) -> None:
        self._context, self._socket = _dealer(self.endpoint)
        self._last_sent = self._last_heard = time.monotonic()

    def run(self, stop: threading.Event, limit: float = 30.0) -> None:
        """Serve until ``stop`` is set (then DISCONNECT), the broker is lost, or ``limit``."""
        try:
            self._send(W_READY, self.service)
            ends = time.monotonic() + limit
            while not stop.is_set() and time.monotonic() < ends:
                if not self._serve_once():
                    return
            self._send(W_DISCONNECT)
            said_goodbye = self._last_sent
            quiet_until = said_goodbye + self.liveness * self.interval
            while (left := quiet_until - time.monotonic()) > 0:
                if self._socket.poll(int(left * 1000) + 1):
                    frames = self._socket.recv_multipart()
                    self.after_disconnect.append((time.monotonic() - said_goodbye, frames))
        finally:
            self.close()

    def _serve_once(self) -> bool:
        """Wait up to the next heartbeat; handle what came; False once the broker is gone."""
        wait = max(0.0, self._last_sent + self.interval - time.monotonic())
        if self._socket.poll(int(wait * 1000) + 1):
            frames = self._socket.recv_multipart()
            name = worker_command(frames, from_broker=True)
            now = time.monotonic()
            self.received.append((now, name, frames))
            if name == "DISCONNECT":
                self.told_to_disconnect = True
                return False
            self._last_heard = now  # any command but DISCONNECT is a heartbeat
            if name == "REQUEST":
                client, body = frames[2], frames[4:]
                replies = self.handler(body)
                for reply in replies[:-1]:
                    self._send(W_PARTIAL, client, b"", *reply)
                self._send(W_FINAL, client, b"", *replies[-1])
        now = time.monotonic()
        if now - self._last_heard >= self.liveness * self.interval:
            self.lost_broker = True
            return False
        if now - self._last_sent >= self.interval:
            self._send(W_HEARTBEAT)
        return True

    def _send(self, command: bytes, *rest: bytes) -> None:
        self._socket.send_multipart([WORKER, command, *rest])
        self._last_sent = time.monotonic()
        self.sent.append((self._last_sent, COMMAND_NAMES[command]))

    def close(self) -> None:
        _close(self._context, self._socket)


@dataclass
class _Registered:
    service: bytes
    last_heard: float
    last_sent: float
    client: bytes | None = None  # the client whose request this worker is handling


@dataclass(frozen=True)
class Seen:
    """One message the hand-framed broker received."""

    at: float
    peer: bytes
    frames: Frames


class HandBroker:
    """An MDP/0.2 broker on one ROUTER, kept as small as the RFC allows.

    Least recently used dispatch per service; requests for a service with no idle worker wait
    in its queue. ``seen()`` returns every message received so far; ``expired`` lists workers
    dropped for silence (the tests expect none). What it leaves out: a request whose worker is
    lost is lost too, and there is no ``mmi.`` service.
    """

    def __init__(self, endpoint: str, interval: float, liveness: int) -> None:
        self.interval = interval
        self.liveness = liveness
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.expired: list[bytes] = []
        self._workers: dict[bytes, _Registered] = {}
        self._idle: dict[bytes, deque[bytes]] = {}
        self._waiting: dict[bytes, deque[tuple[bytes, Frames]]] = {}
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def seen(self) -> list[Seen]:
        """A copy of every message received so far (safe from any thread)."""
        with self._lock:
            return list(self._seen)

    def disconnect(self, worker: bytes) -> None:
        """Send DISCONNECT to ``worker`` and forget it (done by the broker's own thread)."""

        def send_disconnect() -> None:
            self._forget(worker)
            self._socket.send_multipart([worker, WORKER, W_DISCONNECT])

        self._calls.put(send_disconnect)

    def run(self, stop: threading.Event, limit: float = 30.0) -> None:
        """Serve until ``stop`` is set or ``limit`` seconds have passed; then close."""
        try:
            ends = time.monotonic() + limit
            while not stop.is_set() and time.monotonic() < ends:
                if self._socket.poll(int(self.interval * 250) + 1):  # a quarter interval
                    self._receive(self._socket.recv_multipart())
                while not self._calls.empty():
                    self._calls.get()()
                self._keep_time(time.monotonic())
        finally:
            self.close()

    def _receive(self, message: Frames) -> None:
        peer, frames = message[0], message[1:]
        now = time.monotonic()
        with self._lock:
            self._seen.append(Seen(now, peer, frames))
        if frames[:1] == [CLIENT]:
            if len(frames) < 4 or frames[1] != C_REQUEST:
                raise FrameError(f"not a client REQUEST: {frames!r}")
            self._waiting.setdefault(frames[2], deque()).append((peer, frames[3:]))
            self._dispatch(frames[2], now)
            return
        name = worker_command(frames, from_broker=False)
        worker = self._workers.get(peer)
        if name == "READY" and worker is None:
            self._workers[peer] = _Registered(frames[2], now, now)
            self._idle.setdefault(frames[2], deque()).append(peer)
            self._dispatch(frames[2], now)
        elif name == "DISCONNECT":
            self._forget(peer)
        elif worker is None or name == "READY":  # valid but unexpected: DISCONNECT (RFC)
            self._forget(peer)
            self._socket.send_multipart([peer, WORKER, W_DISCONNECT])
        else:
            worker.last_heard = now
            if name in ("PARTIAL", "FINAL"):
                self._reply(peer, worker, name, frames, now)

    def _reply(
        self, peer: bytes, worker: _Registered, name: str, frames: Frames, now: float
    ) -> None:
        if frames[2] != worker.client:
            raise FrameError(f"{name} from {peer!r} for {frames[2]!r}, not {worker.client!r}")
        code = C_PARTIAL if name == "PARTIAL" else C_FINAL
        self._socket.send_multipart([frames[2], CLIENT, code, worker.service, *frames[4:]])
        if name == "FINAL":
            worker.client = None
            self._idle.setdefault(worker.service, deque()).append(peer)
            self._dispatch(worker.service, now)

    def _dispatch(self, service: bytes, now: float) -> None:
        idle, waiting = self._idle.get(service), self._waiting.get(service)
        while idle and waiting:
            peer = idle.popleft()  # the worker idle the longest
            client, body = waiting.popleft()
            self._workers[peer].client = client
            self._send_to_worker(peer, now, W_REQUEST, client, b"", *body)

    def _keep_time(self, now: float) -> None:
        for peer, worker in list(self._workers.items()):
            if now - worker.last_heard >= self.liveness * self.interval:
                self.expired.append(peer)
                self._forget(peer)
            elif now - worker.last_sent >= self.interval:
                self._send_to_worker(peer, now, W_HEARTBEAT)

    def _send_to_worker(self, peer: bytes, now: float, command: bytes, *rest: bytes) -> None:
        self._socket.send_multipart([peer, WORKER, command, *rest])
        self._workers[peer].last_sent = now

    def _forget(self, peer: bytes) -> None:
        worker = self._workers.pop(peer, None)
        if worker is not None and peer in self._idle.get(worker.service, ()):
            self._idle[worker.service].remove(peer)

    def close(self) -> None:
        if not self._socket.closed:
            self._socket.close()
        if not self._context.closed:
            self._context.term()
