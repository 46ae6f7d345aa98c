"""DCP v1 through ``FamilyBroker`` against an independent model, as a Hypothesis state machine.

The model below is written from specs/dcp-v1.md alone: which workers are registered and for
what, which request each holds, what waits per service, which (client, width, service, address,
metadata) requests are in flight. Each step sends one hand-framed DCP message and checks that
the broker sent exactly what the model says, frame for frame: registration echo (DCP-04), pong
or reconnect (DCP-13, DCP-14), requests with the client's metadata (DCP-11), replies with the
client's metadata and written address in the client's width (DCP-03, DCP-07, DCP-08, DCP-09),
several requests per client and the duplicate dropped (DCP-10), re-registration through
reconnect (DCP-18), malformed input dropped with a violation (DCP-23). Timers never fire here
(the interval is far longer than a run); liveness is left to tests/protocol/test_dcp.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domo.protocol.broker import BrokerConfig
from domo.protocol.events import ProtocolViolation
from domo.protocol.family import FamilyBroker

H = b"DGBX\x01"
REG, PING, PONG, REQ, REP, RECON = 1, 2, 3, 4, 5, 6
WORKERS = [b"\x00w%d" % n for n in range(3)]
CLIENTS = [b"\x00c%d" % n for n in range(2)]
SERVICES = [b"a", b"b"]
MALFORMED = [
    [b"", b"DGBX\x02", b"\x04", b"a", b"", b"", b"d"],
    [b"", H, b"\x04\x00"],
    [b"", H, b"\x08"],
    [b"", H, b"\x04", b"a", b"x", b"m"],
    [b"", H, b"\x04", b"a", b"", b"m"],
    [b"", H, b"\x01", b"mmi.x"],
    [b"", H, b"\x03"],
    [b"", H, b"\x05", b"", b"", b"d"],
]


def t(kind: int, width: int) -> bytes:
    """A type frame, written out: one byte, or four little-endian."""
    return bytes([kind]) if width == 1 else bytes([kind, 0, 0, 0])


@dataclass
class Request:
    client: bytes
    width: int
    service: bytes
    address: bytes | None
    metadata: tuple[bytes, ...]
    data: tuple[bytes, ...]

    @property
    def key(self) -> tuple[object, ...]:
        return (self.client, self.width, self.service, self.address, self.metadata)


@dataclass
class Worker:
    width: int
    service: bytes | None = None  # None: not registered
    holding: Request | None = None
    token: bytes = b""


@dataclass
class Model:
    workers: dict[bytes, Worker] = field(default_factory=dict)
    queues: dict[bytes, list[Request]] = field(default_factory=dict)
    in_flight: set[tuple[object, ...]] = field(default_factory=set)


class DcpMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        config = BrokerConfig(
            heartbeat_interval=1000.0, liveness=3, request_expiry=10_000.0, max_redispatches=10**6
        )
        self.broker = FamilyBroker(config)
        self.model = Model()
        self.now = 0.0
        self.widths = {worker: 1 + 3 * (n % 2) for n, worker in enumerate(WORKERS)}
        for worker, width in self.widths.items():
            self.model.workers[worker] = Worker(width)

    # -- plumbing -------------------------------------------------------------------------------

    def send(self, peer: bytes, frames: list[bytes]) -> list[object]:
        self.now += 0.001
        return list(self.broker.receive(peer, frames, self.now))

    def sent(self) -> list[tuple[bytes, tuple[bytes, ...]]]:
        out = [(p, tuple(map(bytes, f))) for _, p, f in self.broker.take_outgoing()]
        self.broker.flushed()
        return out

    def request_frames(self, worker: bytes, request: Request) -> tuple[bytes, ...]:
        w = self.model.workers[worker]
        return (b"", H, t(REQ, w.width), request.service)

    def expect_dispatches(self, out: list[tuple[bytes, tuple[bytes, ...]]], service: bytes) -> None:
        """Every queued request of ``service`` goes to an idle worker of it, any one (LRU is the
        core's business), with the client's metadata and data (DCP-11)."""
        queue = self.model.queues.get(service, [])
        while queue:
            idle = [
                p for p, w in self.model.workers.items() if w.service == service and not w.holding
            ]
            if not idle:
                return
            assert out, f"a request for {service!r} waits while {idle} are idle"
            to, frames = out.pop(0)
            assert to in idle, (to, idle)
            request = queue.pop(0)
            worker = self.model.workers[to]
            assert frames[:4] == self.request_frames(to, request)
            body = (*request.metadata, b"", *request.data)
            assert frames[5:] == (b"", *body), (frames, request)
            worker.holding, worker.token = request, frames[4]

    def unregister(self, peer: bytes) -> None:
        worker = self.model.workers[peer]
        if worker.holding is not None and worker.service is not None:
            self.model.queues.setdefault(worker.service, []).insert(0, worker.holding)
        worker.service, worker.holding = None, None

    # -- rules ----------------------------------------------------------------------------------

    @rule(peer=st.sampled_from(WORKERS), service=st.sampled_from(SERVICES))
    def register(self, peer: bytes, service: bytes) -> None:
        worker = self.model.workers[peer]
        width = worker.width
        self.send(peer, [b"", H, t(REG, width), service])
        out = self.sent()
        if worker.service is None:  # DCP-04: echoed, then what waits goes to it
            assert out[:1] == [(peer, (b"", H, t(REG, width), service))]
            worker.service = service
            rest = out[1:]
            self.expect_dispatches(rest, service)
            assert rest == []
        else:  # DCP-18: reconnect; its request goes to another worker, if one is idle
            assert out[:1] == [(peer, (b"", H, t(RECON, width)))]
            old = worker.service
            self.unregister(peer)
            rest = out[1:]
            self.expect_dispatches(rest, old)
            assert rest == []

    @rule(peer=st.sampled_from(WORKERS + CLIENTS), width=st.sampled_from([1, 4]))
    def ping(self, peer: bytes, width: int) -> None:
        worker = self.model.workers.get(peer)
        if worker is not None:
            width = worker.width  # a worker keeps its width (DCP-03)
        self.send(peer, [b"", H, t(PING, width)])
        out = self.sent()
        registered = worker is not None and worker.service is not None
        kind = PONG if registered else RECON  # DCP-13, DCP-14
        assert out == [(peer, (b"", H, t(kind, width)))]

    @rule(
        client=st.sampled_from(CLIENTS + WORKERS[:1]),
        width=st.sampled_from([1, 4]),
        service=st.sampled_from(SERVICES),
        address=st.sampled_from([None, b"written"]),
        metadata=st.lists(st.sampled_from([b"m1", b"m2", b"m3"]), max_size=2).map(tuple),
        data=st.lists(st.sampled_from([b"d", b"", b"e"]), min_size=1, max_size=2).map(tuple),
    )
    def request(
        self,
        client: bytes,
        width: int,
        service: bytes,
        address: bytes | None,
        metadata: tuple[bytes, ...],
        data: tuple[bytes, ...],
    ) -> None:
        if data == (b"",):
            data = (b"x",)  # one empty data part is the one case DCP-21 merges
        request = Request(client, width, service, address, metadata, data)
        written = [] if address is None else [address]
        frames = [b"", H, t(REQ, width), service, *written, b"", *metadata, b"", *data]
        events = self.send(client, frames)
        out = self.sent()
        if request.key in self.model.in_flight:  # DCP-10: the first stands
            assert out == []
            assert [e.rule for e in events if isinstance(e, ProtocolViolation)] == ["MDP-S-02"]
            return
        self.model.in_flight.add(request.key)
        self.model.queues.setdefault(service, []).append(request)
        self.expect_dispatches(out, service)
        assert out == []

    @precondition(lambda self: any(w.holding for w in self.model.workers.values()))
    @rule(data=st.data())
    def reply(self, data: st.DataObject) -> None:
        busy = sorted(p for p, w in self.model.workers.items() if w.holding)
        peer = data.draw(st.sampled_from(busy))
        worker = self.model.workers[peer]
        request = worker.holding
        assert request is not None
        answer = (b"r", *request.data)
        frames = [b"", H, t(REP, worker.width), worker.token, b"", b"junk", b"", *answer]
        self.send(peer, frames)
        out = self.sent()
        address = request.address if request.address is not None else request.client
        expected = (b"", H, t(REP, request.width), address, b"", *request.metadata, b"", *answer)
        assert out[:1] == [(request.client, expected)]  # DCP-03, DCP-07, DCP-08, DCP-09
        self.model.in_flight.discard(request.key)
        worker.holding = None
        rest = out[1:]
        assert worker.service is not None
        self.expect_dispatches(rest, worker.service)
        assert rest == []

    @rule(peer=st.sampled_from(WORKERS + CLIENTS), frames=st.sampled_from(MALFORMED))
    def malformed(self, peer: bytes, frames: list[bytes]) -> None:
        events = self.send(peer, frames)
        assert self.sent() == []  # DCP-23
        rules = [e.rule for e in events if isinstance(e, ProtocolViolation)]
        assert len(rules) == 1
        assert rules[0].startswith("DCP-")

    @invariant()
    def keys_counts_the_routes_not_kept_idle(self) -> None:
        """``keys()`` (counted as routes are made, parked and forgotten) agrees with the routes."""
        assert self.broker.keys() == len(self.broker._routes) - self.broker.idle()

    @invariant()
    def the_core_agrees_on_the_workers(self) -> None:
        registered = {
            self.broker.address(key)[1]: view.service for key, view in self.broker.workers().items()
        }
        modelled = {p: w.service for p, w in self.model.workers.items() if w.service is not None}
        assert registered == modelled


TestDcpMachine = DcpMachine.TestCase
