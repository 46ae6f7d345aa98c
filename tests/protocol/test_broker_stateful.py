"""The broker against an independent model, under random workers, clients, garbage and time.

A Hypothesis ``RuleBasedStateMachine`` plays several workers (fresh ids from a counter, in a
Bundle), a few clients, two served services plus one nobody serves, and a clock. Every input goes
both to a real ``Broker`` and to ``broker_model.Model`` (written from the spec, sharing no code
with the broker); after every call the whole outbox and every event are compared with the model:

- per peer, exactly the messages the model expects, in order: nothing to a silenced, expired or
  disconnected peer (MDP-D-06, MDP-D-07, MDP-W-13, MDP-H-07), DISCONNECT exactly when the model
  kicks (MDP-W-15), a REQUEST only to a live idle worker of the request's service carrying
  ``client, b""`` and the client's very body objects (MDP-W-02, MDP-S-03, MDP-A-04, MDP-A-06),
  PARTIAL/FINAL only to the client of that worker's request with the service frame (MDP-R-01,
  MDP-R-03, MDP-D-13), HEARTBEAT only after a full interval without any other message (MDP-D-05,
  MDP-H-03);
- the events as a multiset of summaries, including ``ProtocolViolation`` rules for valid but
  unexpected commands and each request's end (completed, expired, dropped with its reason).

Invariants after every step: registered workers, silences, outstanding requests (queued or
dispatched, attempts, partials, expiry) and services equal the model's; a non-empty queue means no
idle worker of that service; no live worker is overdue for a heartbeat or past its expiry; the
broker's ``next_deadline`` is never later than the model's earliest deadline.

Time moves on an exact grid (multiples of interval / 4), by arbitrary floats, and exactly onto the
model's next deadlines, either with a ``tick`` or silently, so that the next message fires the
timers (MDP-D-03). The teardown gives every service a fresh worker and answers until nothing is
outstanding: every request still outstanding gets exactly one FINAL. Finally the recorded inputs are
replayed into a fresh broker, which must produce the same outputs and events.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from hypothesis import event as note_reached
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from domo.protocol.broker import Broker, BrokerConfig, PeerState
from domo.protocol.dispatch import RequestState
from domo.protocol.events import BrokerEvent, RequestCompleted

from .broker_model import HEARTBEAT, MEANING_RULES, C, Expected, Frames, Model, W, summarize

INTERVAL = 1.0
LIVENESS = 3
REQUEST_EXPIRY = 5.0
MAX_REDISPATCHES = 1
CONFIG = BrokerConfig(
    heartbeat_interval=INTERVAL,
    liveness=LIVENESS,
    request_expiry=REQUEST_EXPIRY,
    max_redispatches=MAX_REDISPATCHES,
)
SERVICES = (b"alpha", b"beta")
UNSERVED = b"gamma"
CLIENTS = (b"C1", b"C2", b"C3", b"C4")
STRANGERS = (b"U1", b"U2")  # peers that never register on purpose
FOREIGN = b"C9"  # a client address no request has

Call = tuple[str, tuple[Any, ...], float]
EVENT_DETAIL = {"dropped", "violation", "disconnected"}  # show their reason / rule

# Near misses: a valid command, then one thing wrong with it (MDP-W-08: random garbage alone
# almost never gets past the header). Some mutations happen to give a valid command: the model
# reads every message itself, so that is fine.
BAD_NAMES = (b"", b"bad\x00name", b"\x7f", b"x" * 256, b"caf\xc3\xa9")
BAD_HEADERS = (b"MDPW01", b"MDPC01", b"mdpw02", b"MDPW02 ", b"", C, W)
CODES = (b"", b"\x00", b"\x01", b"\x02", b"\x03", b"\x04", b"\x05", b"\x06", b"\x07", b"\x01\x01")


def _bases(client: bytes) -> list[Frames]:
    return [
        (W, b"\x01", b"alpha"),
        HEARTBEAT,
        (W, b"\x06"),
        (W, b"\x03", client, b"", b"pp"),
        (W, b"\x04", client, b"", b"ff"),
        (W, b"\x02", client, b"", b"rr"),
        (C, b"\x01", b"alpha", b"qq"),
        (C, b"\x03", b"alpha", b"qq"),
    ]


def near_miss(data: st.DataObject, client: bytes) -> Frames:
    frames = list(data.draw(st.sampled_from(_bases(client)), label="base"))
    how = data.draw(
        st.sampled_from(["code", "count", "delimiter", "name", "header", "empty", "view"]),
        label="how",
    )
    if how == "code":
        frames[1] = data.draw(st.sampled_from(CODES), label="code")
    elif how == "count":
        if data.draw(st.booleans(), label="shorter") and len(frames) > 1:
            frames = frames[: data.draw(st.integers(1, len(frames) - 1), label="keep")]
        else:
            frames += [b"extra"] * data.draw(st.integers(1, 2), label="more")
    elif how == "delimiter" and len(frames) > 3:
        frames[3] = data.draw(st.sampled_from([b"x", b"\x00", b"  "]), label="delimiter")
    elif how == "name" and len(frames) > 2:
        frames[2] = data.draw(st.sampled_from(BAD_NAMES), label="name")
    elif how == "header":
        frames[0] = data.draw(st.sampled_from(BAD_HEADERS), label="header")
    elif how == "empty":
        frames = []
    elif how == "view":  # a frame before the body as a view: only a body frame may be one
        before_body = min(len(frames), 4 if frames[0] == W else 3)
        index = data.draw(st.integers(0, before_body - 1), label="view of frame")
        frames[index] = memoryview(frames[index])
    return tuple(frames)


class BrokerMachine(RuleBasedStateMachine):
    """Random peers against a broker and the model; see the module docstring."""

    workers = Bundle("workers")

    def __init__(self) -> None:
        super().__init__()
        self.broker = Broker(CONFIG)
        self.model = Model(INTERVAL, LIVENESS, REQUEST_EXPIRY, MAX_REDISPATCHES)
        self.clock = 0.0  # the time of the next input
        self.next_worker = 0
        self.next_body = 0
        self.dead: set[bytes] = set()  # workers that stopped sending (keepalive skips them)
        self.trace: list[tuple[Call, list[BrokerEvent], list[tuple[bytes, Frames]]]] = []
        self.last_sent: dict[bytes, float] = {}  # last time anything went to a peer
        self.completed: Counter[int] = Counter()
        self.finals: Counter[bytes] = Counter()  # non-mmi FINALs per client
        self.in_step = False
        self.steps = 0

    # -- driving both ----------------------------------------------------------------------

    def body(self, n: int) -> Frames:
        """Fresh body frames: new objects each time, so identity (MDP-S-03) can be checked;
        every third one a memoryview, as the I/O layer may hand a body frame over without a
        copy."""
        frames: list[bytes | memoryview] = []
        for _ in range(n):
            self.next_body += 1
            frame = b"body-%d" % self.next_body
            frames.append(memoryview(frame) if self.next_body % 3 == 0 else frame)
        return tuple(frames)

    def call(self, kind: str, *args: Any) -> None:
        """One input to both, then compare everything."""
        self.in_step = True
        now = self.clock
        self.model.begin(now)
        if kind == "receive":
            peer, frames = args
            self.model.receive(peer, frames)
            events = self.broker.receive(peer, list(frames), now)
        elif kind == "tick":
            events = self.broker.tick(now)
        else:
            (peer,) = args
            self.model.feedback(peer, kind)
            feedback = (
                self.broker.peer_unreachable
                if kind == "unreachable"
                else self.broker.peer_congested
            )
            events = feedback(peer, now)
        out = self.broker.take_outgoing()
        events += self.broker.flushed()  # all of it was sent: its FINALs complete (MDP-D-24)
        self.trace.append(((kind, args, now), events, out))
        self.steps += 1
        self.compare(now, out, events)
        self.in_step = False

    def compare(
        self, now: float, out: list[tuple[bytes, Frames]], events: list[BrokerEvent]
    ) -> None:
        expected: dict[bytes, list[Expected]] = defaultdict(list)
        for message in self.model.out:
            expected[message.peer].append(message)
        actual: dict[bytes, list[Frames]] = defaultdict(list)
        for peer, frames in out:
            actual[peer].append(tuple(frames))
        assert {p: [m.frames for m in ms] for p, ms in expected.items()} == dict(actual), (
            self.trace[-1][0]
        )
        for peer, messages in expected.items():
            for want, got in zip(messages, actual[peer], strict=True):
                if want.body_at is not None:  # the same objects, not copies (MDP-S-03)
                    assert all(
                        a is b
                        for a, b in zip(
                            got[want.body_at :], want.frames[want.body_at :], strict=True
                        )
                    )
        # Model-free checks of the same rules, for a clearer failure.
        for peer, frames in out:
            if frames == HEARTBEAT and peer in self.last_sent:
                assert now >= self.last_sent[peer] + INTERVAL, (peer, now)  # MDP-D-05
            if frames[:2] == (C, b"\x03") and frames[2][:4] != b"mmi.":
                self.finals[peer] += 1
            self.last_sent[peer] = now
        assert Counter(map(summarize, events)) == Counter(self.model.events), self.trace[-1][0]
        for summary in self.model.events:  # what the run reached: --hypothesis-show-statistics
            note_reached(
                str(summary[0]) + ("" if summary[0] not in EVENT_DETAIL else f" {summary[-2]}")
            )
        for event in events:
            assert event.at == now
            if isinstance(event, RequestCompleted):
                self.completed[event.request_id] += 1
                assert self.completed[event.request_id] == 1  # MDP-D-10: at most one FINAL

    def receive(self, peer: bytes, frames: Frames) -> None:
        self.call("receive", peer, frames)

    # -- workers ---------------------------------------------------------------------------

    @initialize(target=workers, service=st.sampled_from(SERVICES))
    def first_worker(self, service: bytes) -> bytes:
        return self.register_new(service)

    @rule(target=workers, service=st.sampled_from(SERVICES))
    def new_worker(self, service: bytes) -> bytes:
        """MDP-W-09: a new worker connects and sends READY."""
        return self.register_new(service)

    def register_new(self, service: bytes) -> bytes:
        self.next_worker += 1
        peer = b"W%d" % self.next_worker
        self.receive(peer, (W, b"\x01", service))
        return peer

    @rule(peer=workers, service=st.sampled_from([*SERVICES, b"mmi.x"]))
    def ready(self, peer: bytes, service: bytes) -> None:
        """READY from a known peer: re-opens after silence, kicks a registered one (MDP-W-10),
        refuses a reserved name (MDP-D-14)."""
        self.dead.discard(peer)
        self.receive(peer, (W, b"\x01", service))

    @rule(peer=workers)
    def heartbeat(self, peer: bytes) -> None:
        """MDP-H-02 from a registered worker; MDP-H-01 before READY; dropped when silenced."""
        self.receive(peer, HEARTBEAT)

    @rule()
    def keepalive(self) -> None:
        """Every registered worker that has not died sends HEARTBEAT."""
        for peer in [p for p in self.model.workers if p not in self.dead]:
            if peer in self.model.workers:
                self.receive(peer, HEARTBEAT)

    @precondition(lambda self: any(p not in self.dead for p in self.model.busy_workers()))
    @rule(data=st.data(), final=st.booleans(), n=st.integers(1, 2))
    def reply(self, data: st.DataObject, final: bool, n: int) -> None:
        """MDP-R-01: a busy worker sends a PARTIAL or its FINAL to its request's client."""
        busy = [p for p in self.model.busy_workers() if p not in self.dead]
        peer = data.draw(st.sampled_from(busy), label="busy worker")
        worker = self.model.workers[peer]
        assert worker.request is not None
        client = self.model.requests[worker.request].client
        code = b"\x04" if final else b"\x03"
        self.receive(peer, (W, code, client, b"", *self.body(n)))

    @rule(
        data=st.data(),
        peer=st.one_of(workers, st.sampled_from(STRANGERS)),
        how=st.sampled_from(["foreign", "stray", "request"]),
        final=st.booleans(),
    )
    def misbehave(self, data: st.DataObject, peer: bytes, how: str, final: bool) -> None:
        """Valid commands at the wrong time: a busy worker's reply to another client (MDP-D-13),
        a reply from an idle, unknown or silenced peer (MDP-W-15, MDP-D-06, MDP-D-10), a
        REQUEST from a worker (MDP-W-15)."""
        code = b"\x04" if final else b"\x03"
        busy = self.model.busy_workers()
        if how == "foreign" and busy:
            peer = data.draw(st.sampled_from(busy), label="busy worker")
            worker = self.model.workers[peer]
            assert worker.request is not None
            own = self.model.requests[worker.request].client
            client = data.draw(st.sampled_from([c for c in (*CLIENTS, FOREIGN) if c != own]))
        else:
            client = data.draw(st.sampled_from([*CLIENTS, FOREIGN]), label="address")
            if how == "request":
                code = b"\x02"
        self.receive(peer, (W, code, client, b"", *self.body(1)))

    @rule(peer=workers)
    def worker_disconnect(self, peer: bytes) -> None:
        """MDP-W-12, MDP-W-13: the worker says DISCONNECT."""
        self.receive(peer, (W, b"\x06"))

    @rule(peer=workers)
    def silent_death(self, peer: bytes) -> None:
        """The worker stops sending; only liveness can find out (MDP-H-05)."""
        self.dead.add(peer)

    # -- clients ---------------------------------------------------------------------------

    def free_clients(self) -> list[bytes]:
        return [c for c in CLIENTS if c not in self.model.clients]

    @precondition(lambda self: bool(self.free_clients()))
    @rule(
        data=st.data(),
        service=st.sampled_from([*SERVICES, *SERVICES, UNSERVED]),
        n=st.integers(1, 3),
    )
    def client_request(self, data: st.DataObject, service: bytes, n: int) -> None:
        """MDP-C-01, MDP-C-10: a client with nothing outstanding asks a service."""
        client = data.draw(st.sampled_from(self.free_clients()), label="client")
        self.receive(client, (C, b"\x01", service, *self.body(n)))

    @rule(
        data=st.data(),
        client=st.sampled_from(CLIENTS),
        how=st.sampled_from(["duplicate", "mmi.service", "mmi.other", "partial", "final"]),
    )
    def client_extra(self, data: st.DataObject, client: bytes, how: str) -> None:
        """A second REQUEST while one is outstanding (MDP-S-02, MDP-D-12); mmi.* queries
        answered by the broker (MDP-M-01, MDP-M-02, MDP-D-21); a client sending PARTIAL or FINAL
        (MDP-D-16)."""
        if how == "duplicate":
            service = data.draw(st.sampled_from([*SERVICES, UNSERVED]), label="service")
            frames = (C, b"\x01", service, *self.body(1))
        elif how.startswith("mmi."):
            names = [*SERVICES, UNSERVED, b"alph", b"alpha2", b"mmi.service"]
            query: bytes | memoryview = data.draw(st.sampled_from(names), label="query")
            if data.draw(st.booleans(), label="query as a view"):
                query = memoryview(bytearray(query))  # a body frame (MDP-M-01); not hashable
            frames = (C, b"\x01", how.encode(), query)
        else:
            frames = (C, b"\x02" if how == "partial" else b"\x03", b"alpha", *self.body(1))
        self.receive(client, frames)

    # -- the I/O layer's feedback ----------------------------------------------------------

    @rule(peer=st.one_of(workers, st.sampled_from(CLIENTS)), congested=st.booleans())
    def feedback(self, peer: bytes, congested: bool) -> None:
        """MDP-D-15: EHOSTUNREACH or EAGAIN at the high-water mark for a worker or a client."""
        self.call("congested" if congested else "unreachable", peer)

    # -- garbage ---------------------------------------------------------------------------

    @rule(
        peer=st.one_of(workers, st.sampled_from(CLIENTS), st.sampled_from(STRANGERS)),
        client=st.sampled_from(CLIENTS),
        data=st.data(),
        random=st.integers(0, 4),
    )
    def malformed(self, peer: bytes, client: bytes, data: st.DataObject, random: int) -> None:
        """MDP-W-08, MDP-W-16, MDP-R-02, MDP-D-01, MDP-D-16: a valid command with one flaw, and
        now and then arbitrary frames (alone they would miss most bugs)."""
        if random:
            frames = near_miss(data, client)
        else:
            frames = tuple(data.draw(st.lists(st.binary(max_size=8), max_size=5), label="frames"))
        self.receive(peer, frames)

    # -- time ------------------------------------------------------------------------------

    @rule(
        data=st.data(),
        how=st.sampled_from(["grid", "grid", "deadline", "deadline", "float"]),
        tick=st.booleans(),
    )
    def time_passes(self, data: st.DataObject, how: str, tick: bool) -> None:
        """MDP-D-03, MDP-D-04, MDP-D-05, MDP-D-06, MDP-D-11: time moves by multiples of
        interval / 4, exactly onto one of the model's next deadlines, or by any float; then a
        tick, or nothing (the next input fires the timers)."""
        upcoming = [t for t in self.model.deadlines() if t >= self.clock][:4]
        if how == "deadline" and upcoming:
            now = data.draw(st.sampled_from(upcoming), label="deadline")
        elif how == "float":
            delta = data.draw(st.floats(0, 3, allow_nan=False, allow_infinity=False))
            now = self.clock + delta
        else:
            now = self.clock + data.draw(st.integers(0, 12), label="quarters") * INTERVAL / 4
        self.clock = now
        if tick:
            self.call("tick")

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def same_workers(self) -> None:
        """MDP-D-04: the registered workers, in order of registration, equal the model's."""
        views = self.broker.workers()
        model = self.model
        assert list(views) == list(model.workers)
        for peer, view in views.items():
            mw = model.workers[peer]
            client = None if mw.request is None else model.requests[mw.request].client
            state = PeerState.IDLE if mw.request is None else PeerState.BUSY
            assert (view.service, view.state, view.client) == (mw.service, state, client)
            assert (view.last_heard, view.last_sent) == (mw.last_heard, mw.last_sent)
            # Heartbeats flowing, nobody overdue (MDP-H-04, MDP-D-05, MDP-D-04).
            assert view.last_sent + INTERVAL > self.broker.now
            assert view.last_heard + LIVENESS * INTERVAL > self.broker.now
        assert self.broker.silenced() == model.silenced

    @invariant()
    def no_request_lost(self) -> None:
        """Every accepted request that has not ended is queued or dispatched, as in the model
        (MDP-D-08 front and bound, MDP-D-09, MDP-D-11), and every service is as the model's."""
        model = self.model
        views = self.broker.requests()
        expected = []
        for r in model.outstanding():
            queued = r.state == "queued"
            expected.append(
                (
                    r.rid,
                    r.client,
                    r.service,
                    RequestState.QUEUED if queued else RequestState.DISPATCHED,
                    r.worker,
                    r.attempts,
                    r.partials,
                    r.queued_at + REQUEST_EXPIRY if queued else None,
                )
            )
        actual = [
            (
                v.request_id,
                v.client,
                v.service,
                v.state,
                v.worker,
                v.attempts,
                v.partials,
                v.expires_at,
            )
            for v in views
        ]
        assert actual == expected
        services = {
            name: (v.workers, v.idle, v.queued) for name, v in self.broker.services().items()
        }
        assert services == model.services()  # MDP-A-05: unused services are forgotten
        for view in self.broker.services().values():
            assert view.queued == 0 or view.idle == 0  # work conservation

    @invariant()
    def deadline_never_late(self) -> None:
        """MDP-D-03: ``next_deadline`` is no later than anything due, and never in the past."""
        deadline = self.broker.next_deadline()
        upcoming = self.model.deadlines()
        if upcoming:
            assert deadline is not None
            assert deadline <= upcoming[0]
        if deadline is not None and self.steps:
            assert deadline > self.broker.now

    # -- the end ---------------------------------------------------------------------------

    def teardown(self) -> None:
        if self.in_step:
            return  # a step failed: its error is the report
        self.settle()
        self.replay()

    def settle(self) -> None:
        """A fresh worker per service, then answer until nothing is outstanding: each request
        still outstanding gets exactly one FINAL (MDP-C-06, MDP-D-10)."""
        self.call("tick")  # time may have moved silently: let what is due happen first
        waiting = {c: self.model.requests[rid].service for c, rid in self.model.clients.items()}
        finals_before = Counter(self.finals)
        for service in (*SERVICES, UNSERVED):
            self.register_new(service)
        for _ in range(len(self.model.requests) + len(self.model.workers) + 2):
            busy = self.model.busy_workers()
            if not busy:
                break
            for peer in busy:
                worker = self.model.workers.get(peer)
                if worker is None or worker.request is None:
                    continue
                client = self.model.requests[worker.request].client
                self.receive(peer, (W, b"\x04", client, b"", *self.body(1)))
        assert self.model.clients == {}
        assert self.model.busy_workers() == []
        assert self.broker.requests() == []
        got = self.finals - finals_before
        assert dict(got) == dict.fromkeys(waiting, 1)

    def replay(self) -> None:
        """MDP-D-03: the same inputs into a fresh broker give the same outputs and events."""
        broker = Broker(CONFIG)
        for (kind, args, now), events, out in self.trace:
            if kind == "receive":
                peer, frames = args
                again = broker.receive(peer, list(frames), now)
            elif kind == "tick":
                again = broker.tick(now)
            elif kind == "unreachable":
                again = broker.peer_unreachable(args[0], now)
            else:
                again = broker.peer_congested(args[0], now)
            assert broker.take_outgoing() == out
            assert again + broker.flushed() == events


def test_meaning_rules_are_spec_rules() -> None:
    """The rules the model tells apart from frame rules are all in the spec (MDP-W-15 etc.)."""
    from pathlib import Path

    spec = (Path(__file__).resolve().parents[2] / "specs" / "mdp-0.2.md").read_text()
    for rule_id in MEANING_RULES:
        assert f"| {rule_id} |" in spec


# Runs of 100 steps at least (enough for workers to expire and requests to be re-dispatched);
# the number of runs, and longer runs, come from the profile (ci, dev, long).
_PROFILE_STEPS = settings().stateful_step_count  # the loaded profile's
BrokerMachine.TestCase.settings = settings(
    deadline=None, stateful_step_count=max(100, _PROFILE_STEPS)
)
TestBrokerMachine = BrokerMachine.TestCase
