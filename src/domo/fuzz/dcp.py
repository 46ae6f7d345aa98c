"""``domo fuzz --dialect dcp``: random DCP v1 scenarios against a live broker's ZeroMQ endpoint.

DCP (``specs/dcp-v1.md``) differs from MDP/0.2 on purpose: the broker never pings, echoes a
registration, answers a stranger's ping with reconnect, lets a client keep several requests in
flight and hands back their metadata. So this is a search of its own rather than a dialect of
the MDP fuzzer's broker target (``domo.fuzz.broker_target``), in the manner of
``domo.fuzz.memo01``: each scenario, drawn from a seeded ``random.Random``, plays DCP workers and
clients framed here by hand from the text (nothing of ``domo.protocol`` is used to build or read
a frame) on real DEALER sockets, and judges every message that comes back against a model of
what the spec requires:

- a registration is echoed, in the worker's width, before any request reaches it (DCP-04);
- every request reaches a worker of its service with its metadata and data (DCP-11, DCP-09,
  DCP-21), and its reply reaches the client that asked, in the width it asked in (DCP-03), with
  its client-address part (DCP-07, DCP-08) and metadata (DCP-09), whatever the worker wrote;
  several requests in flight per client each get theirs (DCP-10); a request for a service nobody
  serves yet is queued until a worker comes (DCP-19); no peer gets a reply it did not ask for;
- a registered worker's ping gets pong (DCP-13); a ping from a peer that is no registered worker
  (a stranger, a client, a worker in its other width, a worker the broker expired) gets reconnect
  (DCP-14, DCP-03); the broker never pings (DCP-16); a worker that vanishes holding a request
  has it served by another once its liveness is over (DCP-16); a second registration gets
  reconnect (DCP-18); a reply from a peer holding no request gets reconnect (DCP-12);
- ``mmi.service`` answers 200 or 404 with the request's metadata (DCP-26);
- near misses (malformed messages of every kind the text allows to go wrong) get no answer, or
  the text's, and the broker goes on serving everyone (DCP-23).

Workers ping every half interval; a scenario in which one of the fuzzer's own workers went quiet
for half its liveness, or the broker took that long to answer a ping (a stalled machine: the
broker may rightly have dropped a worker), is not judged, and is counted as such. A broken rule
is a ``DcpFinding`` with its rule id, the seed and the scenario number that repeat it.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import zmq

from .engine import Outcome, Violation, search
from .scenario import Step

__all__ = ["DcpFinding", "DcpFuzzResult", "DcpPlanner", "DcpUnreachable", "fuzz_dcp", "replay_dcp"]

HEADER = b"DGBX\x01"  # "DGBX" and version 1 (DCP-01)
REGISTER, PING, PONG, REQUEST, REPLY, RECONNECT = 1, 2, 3, 4, 5, 6
TYPE_NAMES = {1: "registration", 2: "ping", 3: "pong", 4: "request", 5: "reply", 6: "reconnect"}
WIDTHS = (1, 4)  # the text's one byte, DagBox's little-endian int (DCP-02)
MMI_SERVICE = b"mmi.service"
STEPS = (
    "request",
    "burst",
    "dual",
    "stranger",
    "client-ping",
    "width-ping",
    "near-miss",
    "vanish",
    "late-worker",
    "mmi",
    "reregister",
)

Context = zmq.Context[zmq.Socket[bytes]]


class DcpUnreachable(Exception):
    """Nothing answered a stranger's ping at the endpoint: no DCP broker there."""


@dataclass(frozen=True)
class DcpFinding:
    """A rule the broker broke, and the smallest plan found that breaks it."""

    rule: str
    explanation: str
    seed: int
    scenario: int
    steps: tuple[Step, ...] = ()  # the plan: replay_dcp plays it again
    scenarios: int = 1  # how many scenarios of the run broke it


@dataclass(frozen=True)
class DcpFuzzResult:
    """What ``fuzz_dcp`` ran and found. ``unjudged``: scenarios whose own workers stalled (not
    judged); ``steps``: how often each kind of step ran; ``checked``: how many of each kind of
    message from the broker were checked (replies, requests at workers, pongs, ...)."""

    scenarios: int
    seconds: float
    seed: int
    findings: tuple[DcpFinding, ...]
    unjudged: int
    steps: dict[str, int]
    checked: dict[str, int]
    judged: Counter[str] = field(default_factory=Counter)  # rule -> scenarios that judged it
    held: Counter[str] = field(default_factory=Counter)
    rules: tuple[str, ...] = ()
    stopped: str | None = None  # the broker stopped serving


def type_frame(kind: int, width: int) -> bytes:
    """The type frame of ``kind`` in ``width`` bytes."""
    return kind.to_bytes(width, "little")


def _other(width: int) -> int:
    return 4 if width == 1 else 1


def _split(parts: list[bytes]) -> tuple[bytes | None, tuple[bytes, ...], tuple[bytes, ...]] | None:
    """``address?, "", metadata*, "", data*`` as the text lays them out (DCP-06), or None."""
    at = 0
    address = None
    if parts and parts[0]:
        if len(parts) < 2 or parts[1]:
            return None
        address, at = parts[0], 2
    elif parts:
        at = 1
    else:
        return None
    end = at
    while end < len(parts) and parts[end]:
        end += 1
    if end >= len(parts):
        return None
    return address, tuple(parts[at:end]), tuple(parts[end + 1 :])


@dataclass(eq=False)
class _Request:
    number: int
    client: _Peer
    width: int
    service: bytes
    address: bytes | None
    metadata: tuple[bytes, ...]
    data: tuple[bytes, ...]
    deadline: float
    others_outstanding: int
    mmi_answer: bytes | None = None
    taken_by: _Peer | None = None
    vanished_from: _Peer | None = None
    misdelivered: bool = False
    queued: bool = False  # sent while no worker served its service
    dual: bool = False  # sent by a registered worker, as a client (DCP-20)

    @property
    def at_worker(self) -> tuple[bytes, ...]:
        """The data a worker is sent: exactly the client's, from DCP to DCP (DCP-21)."""
        return self.data

    def envelope(self) -> tuple[int, bytes, tuple[bytes, ...]]:
        """(width, client-address part, metadata) the reply must carry (DCP-03/07/08/09)."""
        return self.width, self.address or self.client.identity, self.metadata

    def key(self) -> tuple[int, bytes, bytes, tuple[bytes, ...]]:
        return self.width, self.service, self.address or b"", self.metadata

    def answers(self, data: tuple[bytes, ...]) -> bool:
        """Whether a reply's data are this request's answer."""
        if self.mmi_answer is not None:
            return data == (self.mmi_answer,)
        if not data:
            return False
        service, _, _ = data[0].rpartition(b"/")
        return service == self.service and data[1:] == self.at_worker

    def describe(self) -> str:
        return (
            f"request #{self.number} of {self.client.name} for {self.service!r} in width "
            f"{self.width} (address {self.address!r}, metadata {list(self.metadata)!r}, data "
            f"{list(self.data)!r})"
        )


@dataclass(eq=False)
class _Expected:
    """A message the broker owes a peer: a pong, a reconnect or a registration echo."""

    kind: int
    width: int
    parts: tuple[bytes, ...]
    rule: str
    why: str
    deadline: float
    then: Callable[[], None] | None = None
    routine: bool = False  # a worker's regular ping: the scenario does not wait for its pong
    optional: bool = False  # may come or not: neither is judged
    sent: float = 0.0


@dataclass(eq=False)
class _Peer:
    name: str
    identity: bytes
    socket: zmq.Socket[bytes]
    # The worker side (a peer may be a worker, a client or both; DCP-20).
    service: bytes | None = None
    width: int = 1
    echoed: bool = False
    holding: tuple[bytes, _Request] | None = None
    vanish: str | None = None  # "close" or "silent": hold the next request and go quiet
    silent: bool = False
    closed: bool = False
    garble: bool = False  # replies with other metadata than it was sent (DCP-09)
    last_sent: float = 0.0
    last_pong: float = 0.0  # when the broker last answered its routine ping
    max_gap: float = 0.0
    expected: deque[_Expected] = field(default_factory=deque)
    told: set[int] = field(default_factory=set)  # widths it has been owed a reconnect in
    outstanding: list[_Request] = field(default_factory=list)
    answered: list[_Request] = field(default_factory=list)


class _Scenario:
    """One scenario's peers, their model and its checks, pumped by one poll loop."""

    def __init__(
        self,
        context: Context,
        endpoint: str,
        rng: random.Random,
        tag: str,
        interval: float,
        liveness: int,
        window: float,
    ) -> None:
        self.context = context
        self.endpoint = endpoint
        self.rng = rng
        self.tag = tag
        self.interval = interval
        self.expiry = interval * liveness
        self.window = window  # what an answer may take
        self.poller = zmq.Poller()
        self.peers: list[_Peer] = []
        self.by_socket: dict[zmq.Socket[bytes], _Peer] = {}
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.timer_seq = 0
        self.requests = 0
        self.pending: dict[bytes, list[_Request]] = {}  # not yet taken by a worker, per service
        self.frozen: set[bytes] = set()  # services with a registration in progress
        self.stable: list[bytes] = []  # services with honest workers, for random requests
        self.findings: list[tuple[str, str]] = []
        self.steps: Counter[str] = Counter()
        self.checked: Counter[str] = Counter()
        self.ending = False  # no more routine pings: the scenario is being judged
        self.slowest_pong = 0.0  # the broker's longest answer to a routine ping, in seconds
        self.judged: set[str] = set()  # the rules a check had something to judge (coverage)
        self.broker_stalled = False  # a worker's pings went unanswered, then reconnect
        self.canary: _Peer | None = None  # the new peer pinging after near misses (DCP-23)
        self.opener: _Peer | None = None

    # -- plumbing ------------------------------------------------------------------------------

    def fail(self, rule: str, explanation: str) -> None:
        self.judged.add(rule)
        self.findings.append((rule, explanation))

    def judge(self, *rules: str) -> None:
        self.judged.update(rules)

    def peer(self, role: str) -> _Peer:
        name = f"{role}{len(self.peers)}"
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        identity = f"{self.tag}{name}".encode()
        socket.setsockopt(zmq.ROUTING_ID, identity)
        socket.connect(self.endpoint)
        peer = _Peer(name, identity, socket, last_sent=time.monotonic())
        self.peers.append(peer)
        self.by_socket[socket] = peer
        self.poller.register(socket, zmq.POLLIN)
        return peer

    def send(self, peer: _Peer, frames: list[bytes]) -> None:
        now = time.monotonic()
        if peer.echoed and not peer.silent:
            peer.max_gap = max(peer.max_gap, now - peer.last_sent)
        peer.last_sent = now
        peer.socket.send_multipart(frames)

    def close(self, peer: _Peer) -> None:
        if not peer.closed:
            peer.closed = True
            self.poller.unregister(peer.socket)
            peer.socket.close()

    def later(self, delay: float, action: Callable[[], None]) -> None:
        self.timer_seq += 1
        heapq.heappush(self.timers, (time.monotonic() + delay, self.timer_seq, action))

    def expect(
        self,
        peer: _Peer,
        kind: int,
        width: int,
        parts: tuple[bytes, ...],
        rule: str,
        why: str,
        then: Callable[[], None] | None = None,
        routine: bool = False,
        optional: bool = False,
    ) -> None:
        now = time.monotonic()
        self.judged.add(rule)
        peer.expected.append(
            _Expected(
                kind, width, parts, rule, why, now + self.window, then, routine, optional, now
            )
        )
        if kind == RECONNECT:
            peer.told.add(width)

    def pump(self, seconds: float, done: Callable[[], bool] | None = None) -> None:
        until = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, action = heapq.heappop(self.timers)
                action()
            if done is not None and done():
                return
            now = time.monotonic()
            if now >= until:
                return
            wake = min(until, self.timers[0][0]) if self.timers else until
            for socket, _ in self.poller.poll(max(0, math.ceil((wake - now) * 1000))):
                peer = self.by_socket[socket]
                while not peer.closed and socket.poll(0):
                    self.on_message(peer, socket.recv_multipart())

    # -- the peers' actions ----------------------------------------------------------------------

    def worker(
        self,
        service: bytes,
        width: int | None = None,
        peer: _Peer | None = None,
        garble: bool = False,
    ) -> _Peer:
        """A worker (or an existing peer) registers for ``service`` and pings from its echo on."""
        if peer is None:
            peer = self.peer("w")
            peer.garble = garble
            self.schedule_ping(peer)
        peer.width = width if width is not None else self.rng.choice(WIDTHS)
        self.register(peer, service)
        return peer

    def register(self, peer: _Peer, service: bytes) -> None:
        peer.service = service
        peer.echoed = False
        self.frozen.add(service)
        self.send(peer, [b"", HEADER, type_frame(REGISTER, peer.width), service])

        def echoed() -> None:
            peer.echoed = True
            peer.last_sent = max(peer.last_sent, time.monotonic() - self.interval)
            self.frozen.discard(service)

        why = f"{peer.name} registered for {service!r} in width {peer.width}"
        self.expect(peer, REGISTER, peer.width, (service,), "DCP-04", why, echoed)

    def schedule_ping(self, peer: _Peer) -> None:
        def ping() -> None:
            if peer.closed or peer.silent or self.ending:
                return
            if peer.echoed:
                self.send(peer, [b"", HEADER, type_frame(PING, peer.width)])
                why = f"registered worker {peer.name} pinged in width {peer.width}"
                self.expect(peer, PONG, peer.width, (), "DCP-13", why, routine=True)
            self.later(self.interval / 2, ping)

        self.later(self.rng.uniform(0, self.interval / 2), ping)

    def ask(
        self,
        client: _Peer,
        service: bytes,
        *,
        width: int | None = None,
        mmi_answer: bytes | None = None,
        target: bytes | None = None,
    ) -> _Request:
        """``client`` sends a request for ``service`` with random metadata, address and data."""
        rng = self.rng
        self.requests += 1
        number = self.requests
        width = width if width is not None else rng.choice(WIDTHS)
        metadata = [rng.randbytes(rng.randint(1, 6)) for _ in range(rng.choice((0, 0, 1, 1, 2, 3)))]
        address: bytes | None = None
        pick = rng.random()
        if pick < 0.1:
            address = client.identity
        elif pick < 0.2:
            address = rng.choice(self.peers).identity  # someone else's: still replied to us
        elif pick < 0.3:
            address = b"addr-" + rng.randbytes(4)
        if target is not None:
            data: tuple[bytes, ...] = (target,)
        else:
            nonce = b"n%d" % number
            shapes: list[tuple[bytes, ...]] = [
                (nonce,),
                (nonce, b"", b"tail"),
                (),
                (b"",),
                (b"", nonce),
                (nonce, rng.randbytes(rng.randint(0, 40))),
            ]
            data = rng.choice(shapes)
        request = _Request(
            number,
            client,
            width,
            service,
            address,
            tuple(metadata),
            data,
            time.monotonic() + self.window,
            len(client.outstanding),
            mmi_answer,
            dual=client.service is not None,
        )
        if request.others_outstanding:
            self.judge("DCP-10")
        while any(r.key() == request.key() for r in client.outstanding):
            request.metadata += (b"k%d" % number,)  # DCP-10: the same five would be dropped
        frames = [b"", HEADER, type_frame(REQUEST, width), service]
        if address is not None:
            frames.append(address)
        frames += [b"", *request.metadata, b"", *data]
        client.outstanding.append(request)
        if mmi_answer is None:
            self.pending.setdefault(service, []).append(request)
        self.send(client, frames)
        return request

    def reply(self, worker: _Peer) -> None:
        if worker.holding is None or worker.closed or worker.silent:
            return
        token, request = worker.holding
        worker.holding = None
        metadata = request.metadata
        if worker.garble:
            metadata = (b"garbled", *metadata[1:])
        tag = request.service + b"/" + worker.name.encode()
        frames = [b"", HEADER, type_frame(REPLY, worker.width), token, b"", *metadata, b"", tag]
        self.send(worker, frames + list(request.at_worker))

    # -- what comes back -----------------------------------------------------------------------

    def on_message(self, peer: _Peer, frames: list[bytes]) -> None:
        if len(frames) < 3 or frames[0] != b"" or frames[1] != HEADER:
            self.fail("DCP-01", f"{peer.name} got a message not framed as DCP v1: {frames[:4]!r}")
            return
        width = len(frames[2])
        kind = int.from_bytes(frames[2], "little")
        if width not in WIDTHS or kind not in TYPE_NAMES:
            self.fail("DCP-02", f"{peer.name} got type frame {frames[2]!r}")
            return
        parts = frames[3:]
        self.checked[TYPE_NAMES[kind]] += 1
        self.judge("DCP-01", "DCP-02", "DCP-16", *(("DCP-24",) if peer.service else ()))
        if kind == REQUEST:
            self.on_request(peer, width, parts)
        elif kind == REPLY:
            self.on_reply(peer, width, parts)
        elif kind == PING:
            self.fail("DCP-16", f"the broker pinged {peer.name} (the broker never pings)")
        else:
            self.on_control(peer, kind, width, tuple(parts))

    def on_control(self, peer: _Peer, kind: int, width: int, parts: tuple[bytes, ...]) -> None:
        name = TYPE_NAMES[kind]
        same = [e for e in peer.expected if e.kind == kind and e.parts == parts]
        owed = next((e for e in same if e.width == width), same[0] if same else None)
        if owed is None and kind in (PONG, RECONNECT):  # the answer to a ping, but the other one
            sibling = PONG if kind == RECONNECT else RECONNECT
            other = [e for e in peer.expected if e.kind == sibling]
            owed = next((e for e in other if e.width == width), other[0] if other else None)
            if owed is not None:
                peer.expected.remove(owed)
                if owed.routine and owed.optional:
                    return  # a ping sent before the reconnect that made its answer moot
                quiet = time.monotonic() - max(peer.last_pong, owed.sent - self.interval)
                if owed.routine and kind == RECONNECT and quiet > self.expiry / 2:
                    # No pong for half the liveness span, then reconnect: the broker stalled
                    # and may have expired the worker before reading its pings (not judged).
                    self.broker_stalled = True
                    self.reconnected(peer)
                    return
                rule = "DCP-14" if kind == PONG else owed.rule
                self.fail(rule, f"{owed.why}: got {name}, not {TYPE_NAMES[sibling]}")
                if kind == RECONNECT:
                    self.reconnected(peer)
                return
        if owed is None:
            if kind == RECONNECT and peer.service is not None:
                self.fail(
                    "DCP-24",
                    f"{peer.name} (worker of {peer.service!r}) got a reconnect "
                    "it had given no cause for",
                )
                self.reconnected(peer)
            else:
                self.fail(
                    {REGISTER: "DCP-04", PONG: "DCP-13"}.get(kind, "DCP-23"),
                    f"{peer.name} got a {name} it was owed none of: {list(parts)!r}",
                )
            return
        peer.expected.remove(owed)
        if owed.routine:
            self.slowest_pong = max(self.slowest_pong, time.monotonic() - owed.sent)
            peer.last_pong = time.monotonic()
        if width != owed.width:
            self.fail("DCP-03", f"{owed.why}: got its {name} in width {width}")
        if owed.then is not None:
            owed.then()

    def reconnected(self, peer: _Peer) -> None:
        """An honest worker told to reconnect: what it held goes back; it registers again."""
        peer.echoed = False
        for owed in peer.expected:
            owed.optional = owed.optional or owed.routine  # pong or reconnect, as it happened
        if peer.holding is not None:
            _, request = peer.holding
            peer.holding = None
            request.taken_by = None
            self.pending.setdefault(request.service, []).append(request)
        if peer.service is not None and not peer.closed and not peer.silent:
            self.register(peer, peer.service)

    def on_request(self, peer: _Peer, width: int, parts: list[bytes]) -> None:
        if peer.service is None:
            self.fail("DCP-11", f"{peer.name}, no worker, got a request: {parts[:6]!r}")
            return
        if peer.silent:
            self.fail("DCP-16", f"{peer.name}, silent for longer than its liveness, got a request")
            return
        if not peer.echoed and any(e.kind == REGISTER for e in peer.expected):
            self.fail("DCP-04", f"{peer.name} got a request before its registration echo")
        if width != peer.width:
            self.fail(
                "DCP-03",
                f"{peer.name} registered in width {peer.width} got a request in width {width}",
            )
        self.judge("DCP-11", "DCP-03", "DCP-04", "DCP-09", "DCP-17", "DCP-21")
        split = _split(parts[1:]) if parts else None
        if split is None or split[0] is None:
            self.fail(
                "DCP-11",
                f"{peer.name} got a request not laid out as service, client, '', "
                f"metadata, '', data: {parts[:8]!r}",
            )
            return
        token, metadata, data = split
        assert token is not None
        service = parts[0]
        if service != peer.service:
            self.fail(
                "DCP-11", f"{peer.name}, worker of {peer.service!r}, got a request for {service!r}"
            )
        candidates = [r for r in self.pending.get(service, []) if r.at_worker == data]
        request = next((r for r in candidates if r.metadata == metadata), None)
        if request is None and candidates:
            request = candidates[0]
            self.fail(
                "DCP-09",
                f"{peer.name} was sent metadata {list(metadata)!r} for {request.describe()}",
            )
        if request is None:
            self.fail(
                "DCP-11",
                f"{peer.name} got a request no client sent (or sent twice): "
                f"service {service!r}, metadata {list(metadata)!r}, data {list(data)!r}",
            )
            return
        self.pending[service].remove(request)
        if peer.holding is not None:
            self.fail(
                "DCP-17",
                f"{peer.name} got {request.describe()} while it held {peer.holding[1].describe()}",
            )
        request.taken_by = peer
        peer.holding = (token, request)
        if peer.vanish is not None:
            self.vanish(peer, request)
        else:
            self.later(self.rng.choice((0.0, 0.0, 0.005, 0.02)), lambda: self.reply(peer))

    def vanish(self, peer: _Peer, request: _Request) -> None:
        """``peer`` goes quiet holding ``request``: another worker must get it (DCP-16)."""
        peer.silent = True
        peer.holding = None
        request.taken_by = None
        request.vanished_from = peer
        request.deadline = time.monotonic() + self.expiry + 2 * self.interval + self.window
        self.pending[request.service].append(request)
        if peer.vanish == "close":
            self.close(peer)
            peer.expected.clear()  # pongs still on their way cannot be read any more
        self.worker(request.service)  # the standby

    def on_reply(self, peer: _Peer, width: int, parts: list[bytes]) -> None:
        split = _split(parts)
        if split is None or split[0] is None:
            self.fail(
                "DCP-08",
                f"{peer.name} got a reply not laid out as client address, '', "
                f"metadata, '', data: {parts[:8]!r}",
            )
            return
        address, metadata, data = split
        self.judge("DCP-03", "DCP-07", "DCP-08", "DCP-09")
        candidates = [r for r in peer.outstanding if r.answers(data)]
        exact = [r for r in candidates if r.envelope() == (width, address, metadata)]
        request = exact[0] if exact else candidates[0] if candidates else None
        if request is None:
            others = [r for p in self.peers if p is not peer for r in p.outstanding]
            elsewhere = next((r for r in others if r.answers(data)), None)
            if elsewhere is not None:
                elsewhere.misdelivered = True
                # A worker's own request is answered to it, not to another (DCP-20).
                rule = "DCP-20" if elsewhere.dual else "DCP-07"
                self.fail(rule, f"{peer.name} got the reply to {elsewhere.describe()}")
            elif any(r.answers(data) for r in peer.answered):
                self.fail("DCP-08", f"{peer.name} got a second reply with data {list(data)!r}")
            else:
                self.fail(
                    "DCP-08",
                    f"{peer.name} got a reply to no request it sent: address "
                    f"{address!r}, metadata {list(metadata)!r}, data {list(data)!r}",
                )
            return
        peer.outstanding.remove(request)
        peer.answered.append(request)
        if request.dual:
            self.judge("DCP-20")
        if request.mmi_answer is not None:
            self.judge("DCP-26")
        want_width, want_address, want_metadata = request.envelope()
        if width != want_width:
            self.fail("DCP-03", f"the reply to {request.describe()} came in width {width}")
        if address != want_address:
            rule = "DCP-07" if request.address is not None else "DCP-08"
            self.fail(rule, f"the reply to {request.describe()} has client address {address!r}")
        if metadata != want_metadata:
            self.fail(
                "DCP-09", f"the reply to {request.describe()} has metadata {list(metadata)!r}"
            )
        silent = request.vanished_from
        if silent is not None and not silent.closed:
            # It was expired (its request went to another): its next ping gets reconnect.
            self.send(silent, [b"", HEADER, type_frame(PING, silent.width)])
            why = f"{silent.name}, expired while silent, pinged again"
            self.expect(silent, RECONNECT, silent.width, (), "DCP-14", why)

    # -- steps -------------------------------------------------------------------------------

    def open_services(self) -> list[bytes]:
        return [s for s in self.stable if s not in self.frozen]

    def clients(self) -> list[_Peer]:
        return [p for p in self.peers if p.name.startswith("c") and not p.closed]

    def idle_workers(self, quiet: bool) -> list[_Peer]:
        """Registered, honest, idle workers (``quiet``: no request of their service about)."""
        return [
            p
            for p in self.peers
            if p.service in self.stable
            and p.echoed
            and p.holding is None
            and not p.silent
            and not p.closed
            and p.service not in self.frozen
            and not (quiet and self.busy(p.service))
        ]

    def workers_of(self, service: bytes) -> int:
        return sum(1 for p in self.peers if p.service == service and not (p.silent or p.closed))

    def busy(self, service: bytes) -> bool:
        """Whether a request for ``service``, or an ``mmi.service`` about it, is about: a
        registration then would race it."""
        if self.pending.get(service):
            return True
        return any(
            r.service == service or (r.mmi_answer is not None and r.data == (service,))
            for p in self.peers
            for r in p.outstanding
        )

    def step(self, kind: str) -> None:
        rng = self.rng
        services = self.open_services()
        clients = self.clients()
        if kind == "request" and services:
            self.ask(rng.choice(clients), rng.choice(services))
        elif kind == "burst" and services:
            client = rng.choice(clients)
            width = rng.choice((None, *WIDTHS))
            for _ in range(rng.randint(2, 4)):
                self.ask(client, rng.choice(services), width=width)
        elif kind == "dual":
            workers = self.idle_workers(quiet=False)
            if workers and services:
                self.ask(rng.choice(workers), rng.choice(services))  # DCP-20
        elif kind == "stranger":
            stranger = self.peer("s")
            width = rng.choice(WIDTHS)
            self.send(stranger, [b"", HEADER, type_frame(PING, width)])
            why = f"stranger {stranger.name} pinged in width {width}"
            then: Callable[[], None] | None = None
            if services and rng.random() < 0.5:
                chosen = rng.choice(services)

                def then() -> None:  # registers after its reconnect, and works
                    self.schedule_ping(stranger)
                    self.worker(chosen, width, stranger)

            self.expect(stranger, RECONNECT, width, (), "DCP-14", why, then)
        elif kind == "client-ping":
            client = rng.choice(clients)
            width = rng.choice(WIDTHS)
            self.send(client, [b"", HEADER, type_frame(PING, width)])
            why = f"client {client.name} (no worker) pinged in width {width}"
            self.expect(client, RECONNECT, width, (), "DCP-14", why)
        elif kind == "width-ping":
            workers = self.idle_workers(quiet=False)
            if workers:
                worker = rng.choice(workers)
                width = _other(worker.width)
                self.send(worker, [b"", HEADER, type_frame(PING, width)])
                why = f"{worker.name}, registered in width {worker.width}, pinged in width {width}"
                self.expect(worker, RECONNECT, width, (), "DCP-03", why)
        elif kind == "near-miss":
            self.send_near_misses()
        elif kind == "vanish":
            service = f"{self.tag}v{self.requests}".encode()
            vanisher = self.worker(service)
            vanisher.vanish = rng.choice(("close", "silent"))
            self.pump(self.window, lambda: vanisher.echoed)
            if vanisher.echoed:
                self.ask(rng.choice(clients), service)
        elif kind == "late-worker":
            service = f"{self.tag}q{self.requests}".encode()
            asked = [self.ask(rng.choice(clients), service) for _ in range(rng.randint(1, 2))]
            self.pump(rng.uniform(0, 0.2))
            self.worker(service)  # DCP-19: they waited in the queue
            for request in asked:
                request.queued = True
                request.deadline = time.monotonic() + self.window
        elif kind == "mmi" and services:
            known = rng.random() < 0.6
            target = rng.choice(services) if known else f"{self.tag}none".encode()
            answer = b"200" if known else b"404"
            self.ask(rng.choice(clients), MMI_SERVICE, mmi_answer=answer, target=target)
        elif kind == "reregister":
            workers = self.idle_workers(quiet=True)
            if workers:
                worker = rng.choice(workers)
                old = worker.service
                assert old is not None
                movable = self.workers_of(old) > 1  # its service keeps a worker
                new = rng.choice([s for s in services if movable and not self.busy(s)] or [old])
                self.frozen |= {old, new}
                self.send(worker, [b"", HEADER, type_frame(REGISTER, worker.width), new])
                worker.echoed = False
                why = f"{worker.name}, registered for {old!r}, registered again for {new!r}"

                def again() -> None:
                    self.frozen.discard(old)
                    self.register(worker, new)

                self.expect(worker, RECONNECT, worker.width, (), "DCP-18", why, again)
        else:
            return
        self.steps[kind] += 1

    def send_near_misses(self) -> None:
        """Malformed messages from a stranger, a client or a worker; then a new peer's ping
        must still be answered (DCP-23)."""
        rng = self.rng
        services = self.open_services() or [b"nobody"]
        senders = [self.peer("x"), *self.clients(), *self.idle_workers(quiet=False)]
        for _ in range(rng.randint(1, 4)):
            sender = rng.choice(senders)
            width = rng.choice(WIDTHS)
            frames, why, answered = rng.choice(near_misses(rng, width, rng.choice(services)))
            if answered and (sender.service is not None or sender.outstanding):
                continue  # a stranger's reply kicks a worker side: only from pure strangers
            self.send(sender, frames)
            if answered:
                # A peer already sent a reconnect in that width gets nothing while silenced
                # (DCP-12, MDP-D-06), reconnect once the silence has ended: which of the two
                # it is depends on timing, so it is not judged.
                optional = width in sender.told
                why = f"{sender.name} sent {why}"
                self.expect(sender, RECONNECT, width, (), "DCP-12", why, optional=optional)
        canary = self.peer("k")
        self.canary = canary
        width = rng.choice(WIDTHS)
        self.send(canary, [b"", HEADER, type_frame(PING, width)])
        why = f"after near misses, new peer {canary.name} pinged in width {width}"
        self.expect(canary, RECONNECT, width, (), "DCP-23", why)

    # -- the scenario ----------------------------------------------------------------------------

    def run(self, plan: Sequence[Step]) -> None:
        """Play the scenario: its peers from the setup seed (``self.rng``), then each step of
        ``plan`` with its own seed."""
        rng = self.rng
        opener = self.peer("s")
        self.opener = opener
        width = rng.choice(WIDTHS)
        self.send(opener, [b"", HEADER, type_frame(PING, width)])
        why = f"stranger {opener.name} pinged in width {width}"
        self.expect(opener, RECONNECT, width, (), "DCP-14", why)
        for letter in "abc"[: rng.randint(1, 3)]:
            service = f"{self.tag}{letter}".encode()
            self.stable.append(service)
            for _ in range(rng.randint(1, 2)):
                self.worker(service, garble=rng.random() < 0.15)
        for _ in range(rng.randint(1, 3)):
            self.peer("c")
        self.pump(self.window, lambda: not self.frozen)
        for step in plan:
            if step.kind == "setup":
                continue
            self.rng = rng = random.Random(step.arg)
            self.step(step.kind)
            self.pump(rng.choice((0.0, 0.0, 0.01, 0.05)))
        self.pump(self.settle_time(), self.settled)
        self.ending = True
        self.pump(self.window, self.answered_all)
        self.pump(max(0.1, 2 * self.interval))  # anything the broker should not send
        now = time.monotonic()
        for peer in self.peers:
            for owed in peer.expected:
                if not owed.optional:
                    self.fail(owed.rule, f"{owed.why}: no {TYPE_NAMES[owed.kind]} came")
            for request in peer.outstanding:
                if request.deadline <= now and not request.misdelivered:
                    self.fail(*self.lost(request))

    def settle_time(self) -> float:
        deadlines = [e.deadline for p in self.peers for e in p.expected if not e.optional]
        deadlines += [r.deadline for p in self.peers for r in p.outstanding]
        return max(deadlines, default=0.0) - time.monotonic()

    def answered_all(self) -> bool:
        return not any(e for p in self.peers for e in p.expected if not e.optional)

    def settled(self) -> bool:
        return not any(
            p.outstanding or any(not (e.routine or e.optional) for e in p.expected)
            for p in self.peers
        )

    def lost(self, request: _Request) -> tuple[str, str]:
        """The rule a request that got no reply names, by how far it went."""
        if request.mmi_answer is not None:
            return "DCP-26", f"no answer to {request.describe()}"
        if request.dual:
            return "DCP-20", (
                f"{request.describe()}, a registered worker's own request (it is a client "
                "too), got no reply"
            )
        if request.vanished_from is not None:
            return "DCP-16", (
                f"{request.vanished_from.name} vanished holding {request.describe()}, and it "
                f"was not served by another worker within liveness ({self.expiry:.2f} s) + "
                f"{self.window:.1f} s"
            )
        if request.taken_by is not None:
            return "DCP-08", f"{request.describe()} was served but its reply never came"
        if request.queued:
            return "DCP-19", (
                f"{request.describe()}, sent before any worker served its service, never "
                "reached the worker that came"
            )
        if request.others_outstanding:
            return "DCP-10", (
                f"{request.describe()}, sent with {request.others_outstanding} other(s) of its "
                "client in flight, never reached a worker"
            )
        return "DCP-11", f"{request.describe()} never reached a worker of its service"

    def stalled(self) -> bool:
        """Whether the machine stalled near a worker's expiry, so that the broker may rightly
        have dropped it (not judged): one of the fuzzer's own workers went quiet, or the broker
        took, for half the liveness span."""
        if self.slowest_pong > self.expiry / 2 or self.broker_stalled:
            return True
        now = time.monotonic()
        for peer in self.peers:
            gap = peer.max_gap
            if peer.echoed and not peer.silent and not peer.closed:
                gap = max(gap, now - peer.last_sent)
            if peer.service is not None and gap > self.expiry / 2:
                return True
        return False

    def close_all(self) -> None:
        for peer in self.peers:
            self.close(peer)


def near_misses(
    rng: random.Random, width: int, service: bytes
) -> list[tuple[list[bytes], str, bool]]:
    """Malformed DCP messages (and a reply from a peer that holds no request), each with what
    it is and whether the text answers it (reconnect, DCP-12); the rest are dropped (DCP-23)."""

    def t(kind: int) -> bytes:
        return type_frame(kind, width)

    version = bytes([rng.choice((0, 2, 255))])
    cases: list[tuple[list[bytes], str, bool]] = [
        ([b"", b"DGBX" + version, t(REQUEST), service, b"", b"", b"x"], "another version", False),
        ([b"", b"DGBX", t(PING)], "a 4-byte header", False),
        ([HEADER, t(PING)], "no leading empty frame", False),
        ([b"", HEADER], "no type frame", False),
        ([b"", HEADER, bytes(rng.choice((0, 2, 3, 5, 8)))], "a type frame of another width", False),
        ([b"", HEADER, type_frame(rng.choice((0, 7, 255)), width)], "no such type", False),
        ([b"", HEADER, t(PONG)], "a pong to the broker", False),
        ([b"", HEADER, t(RECONNECT)], "a reconnect to the broker", False),
        ([b"", HEADER, t(PING), b"extra"], "a ping with a part", False),
        ([b"", HEADER, t(REGISTER)], "a registration without service", False),
        ([b"", HEADER, t(REGISTER), service, b"more"], "a registration with two parts", False),
        ([b"", HEADER, t(REGISTER), b"mmi.mine"], "a registration for mmi.*", False),
        ([b"", HEADER, t(REGISTER), b"\xffbad\x01"], "an unprintable service", False),
        ([b"", HEADER, t(REGISTER), b"s" * 256], "a 256-byte service", False),
        ([b"", HEADER, t(REQUEST)], "a request without service", False),
        ([b"", HEADER, t(REQUEST), b"bad\x00", b"", b"", b"d"], "a request's bad service", False),
        ([b"", HEADER, t(REQUEST), service, b"addr", b"m"], "an address without delimiter", False),
        ([b"", HEADER, t(REQUEST), service, b"", b"m1"], "no metadata delimiter", False),
        ([b"", HEADER, t(REPLY), b"", b"", b"d"], "a reply naming no client", False),
        ([b"", HEADER, t(REPLY), b"who"], "a reply without delimiters", False),
        ([b"", HEADER, t(REPLY), b"nobody", b"", b"", b"d"], "a reply holding no request", True),
    ]
    return cases


def _probe(context: Context, endpoint: str, wait: float) -> None:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(endpoint)
        socket.send_multipart([b"", HEADER, type_frame(PING, 1)])
        if not socket.poll(int(wait * 1000)):
            raise DcpUnreachable(f"nothing answered a DCP ping at {endpoint} within {wait:.1f} s")
    finally:
        socket.close()


# The rules each kind of step gives something to judge, for the planner's steering.
STEP_RULES: dict[str, tuple[str, ...]] = {
    "request": ("DCP-03", "DCP-07", "DCP-08", "DCP-09", "DCP-11", "DCP-21"),
    "burst": ("DCP-10",),
    "dual": ("DCP-20",),
    "stranger": ("DCP-14",),
    "client-ping": ("DCP-14",),
    "width-ping": ("DCP-03",),
    "near-miss": ("DCP-23", "DCP-12"),
    "vanish": ("DCP-16",),
    "late-worker": ("DCP-19",),
    "mmi": ("DCP-26",),
    "reregister": ("DCP-18", "DCP-04"),
}
RULES = (
    "DCP-01", "DCP-02", "DCP-03", "DCP-04", "DCP-07", "DCP-08", "DCP-09", "DCP-10", "DCP-11",
    "DCP-12", "DCP-13", "DCP-14", "DCP-16", "DCP-17", "DCP-18", "DCP-19", "DCP-20", "DCP-21",
    "DCP-23", "DCP-24", "DCP-26",
)  # fmt: skip


class DcpPlanner:
    """DCP plans: a setup seed, then four to ten steps, one in two chosen for the rules judged
    least (the rest at random)."""

    rules: tuple[str, ...] = RULES
    death_rule = "DCP-14"

    def draw(self, rng: random.Random, judged: Mapping[str, int]) -> tuple[Step, ...]:
        plan = [Step("setup", 0, rng.randrange(2**31))]
        for _ in range(rng.randint(4, 10)):
            if rng.random() < 0.5:
                kind = rng.choice(STEPS)
            else:
                kind = min(
                    STEPS,
                    key=lambda k: min(judged.get(r, 0) for r in STEP_RULES[k]) + 3 * rng.random(),
                )
            plan.append(Step(kind, 0, rng.randrange(2**31)))
        return tuple(plan)

    def simpler(self, step: Hashable) -> Sequence[Hashable]:
        return []


def play_dcp(
    context: Context,
    endpoint: str,
    plan: Sequence[Hashable],
    tag: str,
    interval: float,
    liveness: int,
    window: float,
) -> tuple[Outcome, Counter[str], Counter[str]]:
    """Play one plan; what it found and judged, the steps played and the messages checked.

    A broker that answered neither the scenario's first stranger nor the new peer after its
    near misses has stopped serving: the outcome is fatal (DCP-23 after near misses, else
    DCP-14), and only what broke before is kept."""
    steps = [step for step in plan if isinstance(step, Step)]
    setup = steps[0].arg if steps and steps[0].kind == "setup" else 0
    scenario = _Scenario(context, endpoint, random.Random(setup), tag, interval, liveness, window)
    try:
        scenario.run(steps)
    finally:
        scenario.close_all()
    if scenario.stalled():
        return Outcome(judged=frozenset(), unjudged=True), scenario.steps, scenario.checked
    seen: dict[str, str] = {}
    for rule, explanation in scenario.findings:
        seen.setdefault(rule, explanation)
    fatal = None
    for peer, rule in ((scenario.canary, "DCP-23"), (scenario.opener, "DCP-14")):
        if peer is not None and any(e.kind == RECONNECT and not e.optional for e in peer.expected):
            fatal = Violation(rule, seen.pop(rule, f"{peer.name}'s ping got no answer"))
            break
    violations = [Violation(rule, why) for rule, why in seen.items()]
    return Outcome(violations, frozenset(scenario.judged), fatal), scenario.steps, scenario.checked


def fuzz_dcp(
    endpoint: str,
    *,
    scenarios: int = 20,
    seed: int = 0,
    time_budget: float = 60.0,
    heartbeat_interval: float = 2.5,
    liveness: int = 3,
    stop_at_first: bool = False,
    answer_window: float | None = None,
    lanes: int = 4,
    stop_after: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
) -> DcpFuzzResult:
    """Run up to ``scenarios`` DCP scenarios, ``lanes`` at a time, against the broker at ZeroMQ
    ``endpoint``, whose ``--heartbeat-interval`` and ``--liveness`` are given; the rules it
    broke, one finding per rule with the smallest plan found that breaks it. ``DcpUnreachable``
    if nothing answers at all. ``answer_window``: how long an answer may take (default
    ``max(2 s, 6 * interval)``, for a loaded machine); ``stop_at_first``: stop after the first
    finding."""
    window = answer_window if answer_window is not None else max(2.0, 6 * heartbeat_interval)
    steps: Counter[str] = Counter()
    checked: Counter[str] = Counter()
    context: Context = zmq.Context()

    class Lane:
        def __init__(self, index: int) -> None:
            self.index = index
            self.played = 0

        def play(self, plan: Sequence[Hashable]) -> Outcome:
            self.played += 1
            tag = f"d{seed}-{self.index}-{self.played}-"
            outcome, played, seen = play_dcp(
                context, endpoint, plan, tag, heartbeat_interval, liveness, window
            )
            steps.update(played)
            checked.update(seen)
            return outcome

        def close(self) -> None:
            pass

    try:
        _probe(context, endpoint, window)
        searched = search(
            Lane,
            DcpPlanner(),
            seed=seed,
            lanes=lanes,
            time_budget=time_budget,
            examples=scenarios,
            stop_after=stop_after,
            first=stop_at_first,
            progress=progress,
        )
    finally:
        context.destroy(linger=0)
    if searched.errors:
        raise RuntimeError(f"the DCP fuzzer failed: {searched.errors[0]}")
    findings = tuple(
        DcpFinding(
            f.violation.rule,
            f.violation.explanation,
            seed,
            -1,
            tuple(step for step in f.plan if isinstance(step, Step)),
            f.scenarios,
        )
        for f in searched.findings
    )
    return DcpFuzzResult(
        searched.scenarios,
        searched.seconds,
        seed,
        findings,
        searched.unjudged,
        dict(steps),
        dict(checked),
        judged=Counter(searched.judged),
        held=Counter(searched.held),
        rules=RULES,
        stopped=searched.stopped,
    )


def replay_dcp(
    endpoint: str,
    steps: Sequence[Step],
    *,
    heartbeat_interval: float = 2.5,
    liveness: int = 3,
    answer_window: float | None = None,
) -> list[Violation]:
    """Play one saved DCP plan once; the rules it broke."""
    window = answer_window if answer_window is not None else max(2.0, 6 * heartbeat_interval)
    context: Context = zmq.Context()
    try:
        outcome, _, _ = play_dcp(
            context, endpoint, steps, "dreplay-", heartbeat_interval, liveness, window
        )
    finally:
        context.destroy(linger=0)
    return [*outcome.violations, *([outcome.fatal] if outcome.fatal else [])]
