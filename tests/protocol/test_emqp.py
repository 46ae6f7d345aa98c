"""eMQP/1.0 through ``FamilyBroker``, sans-IO: every rule of specs/emqp-1.0.md, message by message.

``Net`` plays the sockets: it feeds the broker what a peer sends and takes what the broker sends
back, split per peer; every expected frame is spelled out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domo.protocol import BrokerConfig
from domo.protocol.dialects import Dialect, Role, detect
from domo.protocol.dialects.emqp import EMQP, BadInput, parse_queues
from domo.protocol.events import (
    BrokerEvent,
    MessageDropped,
    MmiReplied,
    ProtocolViolation,
    RequestDispatched,
    RequestExpired,
    RequestRedispatched,
    WorkerDisconnected,
    WorkerExpired,
)
from domo.protocol.family import FamilyBroker
from domo.protocol.layers.emqp import MAX_CREDITS, credit_cap
from domo.protocol.mdp import BodyFrame, Relayed

T = TypeVar("T")
E = b"eMQP/1.0"
JOB = json.dumps(["run", {"path": "jobs", "callable": "add", "args": [1, 2]}]).encode()
CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=10.0)
ONE_QUEUE = b'[[10, "a"]]'


class Net:
    """A FamilyBroker with the sockets played by the test."""

    def __init__(self, config: BrokerConfig = CONFIG) -> None:
        self.broker = FamilyBroker(config)
        self.events: list[BrokerEvent] = []
        self.now = 0.0

    def send(self, peer: bytes, *frames: BodyFrame, at: float | None = None) -> list[BrokerEvent]:
        self.now = self.now + 0.01 if at is None else at
        events = self.broker.receive(peer, list(frames), self.now)
        self.events += events
        return events

    def tick(self, at: float) -> list[BrokerEvent]:
        self.now = at
        events = self.broker.tick(at)
        self.events += events
        return events

    def out(self) -> list[tuple[bytes, Relayed]]:
        sent = [(peer, frames) for _, peer, frames in self.broker.take_outgoing()]
        self.events += self.broker.flushed()
        return sent

    def to(self, peer: bytes) -> list[Relayed]:
        return [frames for who, frames in self.out() if who == peer]

    def inform(self, worker: bytes, queues: bytes = ONE_QUEUE, slots: int = 1) -> None:
        self.send(worker, b"", E, b"INFORM", b"i-" + worker, queues, b"worker")
        for _ in range(slots):
            self.send(worker, b"", E, b"READY", b"r")
        self.out()

    def request(
        self,
        client: bytes,
        msgid: bytes,
        queue: bytes = b"a",
        headers: bytes = b"reply-requested",
        at: float | None = None,
    ) -> list[BrokerEvent]:
        return self.send(client, b"", E, b"REQUEST", msgid, queue, headers, JOB, at=at)


def commands(messages: Sequence[Relayed]) -> list[bytes]:
    return [bytes(m[2]) for m in messages]


def of(events: Sequence[BrokerEvent], kind: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]


# -- frames -----------------------------------------------------------------------------------


def test_emqp_01_messages_are_detected_by_their_header_and_command() -> None:
    """EMQP-01: messages are detected by their header and command."""
    assert detect([b"", E, b"REQUEST", b"m"]) == (Dialect.EMQP, 0)
    assert EMQP.claims(E, b"REQUEST") is Role.CLIENT
    assert EMQP.claims(E, b"PUBLISH") is Role.CLIENT
    assert EMQP.claims(E, b"READY") is Role.WORKER
    assert EMQP.claims(E, b"WHATEVER") is Role.WORKER
    assert EMQP.claims(b"eMQP/2.0", b"READY") is None
    # A DEALER peer: no address frames before the empty one (EMQP-01).
    assert detect([b"hop", b"", E, b"REQUEST", b"m"]) is None


def test_emqp_02_a_message_without_a_good_msgid_is_dropped_unanswered() -> None:
    """EMQP-02: a message without a good msgid is dropped unanswered."""
    net = Net()
    events = net.send(b"C", b"", E, b"REQUEST", b"", b"a", b"", JOB)
    assert [(e.rule, e.action) for e in of(events, ProtocolViolation)] == [("EMQP-02", "dropped")]
    events = net.send(b"C", b"", E, b"REQUEST", b"bad\x00id", b"a", b"", JOB)
    assert [e.rule for e in of(events, ProtocolViolation)] == ["EMQP-02"]
    events = net.send(b"W", b"", E, b"READY")
    assert [e.rule for e in of(events, ProtocolViolation)] == ["EMQP-02"]
    assert net.out() == []


# -- workers ----------------------------------------------------------------------------------


def test_emqp_03_inform_is_acked_then_heartbeated_at_once() -> None:
    """EMQP-03: inform is acked then heartbeated at once."""
    net = Net()
    net.send(b"W", b"", E, b"INFORM", b"i1", b'[[10, "a"], [5, "b"]]', b"worker", at=1.0)
    assert net.to(b"W") == [
        (b"", E, b"ACK", b"domo-1", b"i1"),
        (b"", E, b"HEARTBEAT", b"domo-2", b"1.000"),
    ]


def test_emqp_03_queue_forms() -> None:
    """EMQP-03: queue forms."""
    assert parse_queues(b"") == ((10, b"default"),)
    assert parse_queues(b'[[10, "alpha"], [5, "default"]]') == ((10, b"alpha"), (5, b"default"))
    assert parse_queues(b"alpha, beta") == ((10, b"alpha"), (10, b"beta"))
    for bad in [
        b"[",
        b"[]",
        b'[["x", "a"]]',
        b'[[1, "a"], [2, "a"]]',
        b'[[1, "mmi.service"]]',
        b'[[1, ""]]',
        b'[[true, "a"]]',
        json.dumps([[1, f"q{n}"] for n in range(17)]).encode(),
        b"\xff",
    ]:
        with pytest.raises(BadInput) as caught:
            parse_queues(bad)
        assert caught.value.rule == "EMQP-03", bad


@pytest.mark.parametrize(
    ("queues", "kind"),
    [(ONE_QUEUE, b"scheduler"), (b"[[1, 2]]", b"worker"), (b"a,,b", b"worker")],
)
def test_emqp_04_an_inform_not_served_gets_disconnect(queues: bytes, kind: bytes) -> None:
    """EMQP-04: an inform not served gets disconnect."""
    net = Net()
    events = net.send(b"W", b"", E, b"INFORM", b"i1", queues, kind)
    assert [e.rule for e in of(events, ProtocolViolation)] in (["EMQP-04"], ["EMQP-03"])
    assert net.to(b"W") == [(b"", E, b"DISCONNECT", b"domo-1")]
    # Not registered: its READY is dropped (EMQP-06) and no heartbeat ever comes.
    assert of(net.send(b"W", b"", E, b"READY", b"r"), MessageDropped)
    net.tick(5.0)
    assert net.out() == []


def test_emqp_05_a_second_inform_starts_over_and_gives_back_its_requests() -> None:
    """EMQP-05: a second inform starts over and gives back its requests."""
    net = Net()
    net.inform(b"W1")
    net.request(b"C", b"m1")
    assert commands(net.to(b"W1")) == [b"REQUEST"]
    net.inform(b"W2")
    events = net.send(b"W1", b"", E, b"INFORM", b"i2", b'[[1, "b"]]', b"worker")
    assert of(events, RequestRedispatched)
    assert commands(net.to(b"W2")) == [b"REQUEST"]  # the request moved on
    assert commands(net.to(b"W1")) == []
    net.send(b"W1", b"", E, b"ACK", b"x")  # now on queue b only
    net.request(b"C", b"m2", b"b")
    net.send(b"W1", b"", E, b"READY", b"r")
    assert [m[4] for m in net.to(b"W1") if m[2] == b"REQUEST"] == [b"b"]


def test_emqp_06_each_ready_is_one_slot_over_the_workers_queues_in_order() -> None:
    """EMQP-06: each ready is one slot over the workers queues in order."""
    net = Net()
    net.inform(b"W", b'[[10, "a"], [5, "b"]]', slots=0)
    net.request(b"C", b"on-b", b"b")
    net.request(b"C", b"on-a", b"a")
    assert net.to(b"W") == []  # no credit yet
    net.send(b"W", b"", E, b"READY", b"r1")
    # The slot offers itself to "a" first (listed first): that request goes, "b" waits.
    assert [m[3] for m in net.to(b"W") if m[2] == b"REQUEST"] == [b"on-a"]
    net.send(b"W", b"", E, b"READY", b"r2")
    assert [m[3] for m in net.to(b"W") if m[2] == b"REQUEST"] == [b"on-b"]
    net.send(b"W", b"", E, b"READY", b"r3")
    net.request(b"C", b"next", b"b")
    assert [m[3] for m in net.to(b"W") if m[2] == b"REQUEST"] == [b"next"]
    # A slot handed a request leaves its other queues: one request per READY.
    net.request(b"C", b"more", b"a")
    assert [m for m in net.to(b"W") if m[2] == b"REQUEST"] == []


@pytest.mark.parametrize(("max_peer_mib", "cap"), [(64, 7), (512, 63), (528, MAX_CREDITS), (16, 1)])
def test_emqp_06_ready_from_an_uninformed_peer_and_past_the_cap(
    max_peer_mib: int, cap: int
) -> None:
    """EMQP-06: ready from an uninformed peer is dropped; free slots are capped at 64, and at
    what a burst is sure to fit in a peer's pipe (16 messages of 4 MiB with the defaults: 7),
    so requests for every free slot at once never find the worker's pipe full."""
    config = BrokerConfig(
        heartbeat_interval=1.0,
        liveness=3,
        request_expiry=10.0,
        max_peer_bytes=max_peer_mib * 1024 * 1024,
    )
    assert credit_cap(config.pipe_messages) == cap
    net = Net(config)
    events = net.send(b"X", b"", E, b"READY", b"r")
    assert of(events, MessageDropped)
    assert net.out() == []
    net.inform(b"W", slots=cap)
    assert len(net.broker.workers()) == cap
    events = net.send(b"W", b"", E, b"READY", b"r")
    assert [e.rule for e in of(events, ProtocolViolation)] == ["EMQP-06"]
    assert len(net.broker.workers()) == cap
    for n in range(cap):  # every free slot taken at once: each REQUEST goes out
        net.request(b"C%d" % n, b"m%d" % n)
    assert len([m for m in net.to(b"W") if m[2] == b"REQUEST"]) == cap


def test_emqp_07_a_new_slot_never_takes_a_spent_ones_key_while_its_request_waits() -> None:
    """EMQP-07, EMQP-10: a slot spent and a new one credited before the outbox is taken: each
    REQUEST goes out with its own request's MSGID and job (a new slot under the spent one's key
    took the job meant for the REQUEST still waiting; found by domo fuzz --dialect emqp)."""
    net = Net()
    net.inform(b"W")
    other = JOB.replace(b"[1, 2]", b"[3, 4]")
    net.request(b"C", b"m1")  # its REQUEST waits in the outbox
    net.send(b"W", b"", E, b"REPLY", b"r1", b'{"value": 3}', b"m1")  # spends the slot
    net.send(b"W", b"", E, b"READY", b"r2")  # a new slot
    net.send(b"C", b"", E, b"REQUEST", b"m2", b"a", b"reply-requested", other)
    sent = [m for m in net.to(b"W") if m[2] == b"REQUEST"]
    assert [(m[3], m[-1]) for m in sent] == [(b"m1", JOB), (b"m2", other)]


def test_emqp_07_a_slot_is_spent_by_its_request() -> None:
    """EMQP-07: a slot is spent by its request."""
    net = Net()
    net.inform(b"W")
    net.request(b"C", b"m1")
    assert commands(net.to(b"W")) == [b"REQUEST"]
    events = net.send(b"W", b"", E, b"REPLY", b"r9", b'{"value": 3}', b"m1")
    assert [e.reason for e in of(events, WorkerDisconnected)] == ["spent"]
    assert net.broker.workers() == {}
    net.request(b"C", b"m2")
    assert net.to(b"W") == []  # waits for the worker's next READY
    net.send(b"W", b"", E, b"READY", b"r")
    assert commands(net.to(b"W")) == [b"REQUEST"]


# -- clients and requests -----------------------------------------------------------------------


def test_emqp_08_a_client_has_many_requests_keyed_by_msgid() -> None:
    """EMQP-08: a client has many requests keyed by msgid."""
    net = Net()
    net.inform(b"W", slots=2)
    net.request(b"C", b"m1")
    net.request(b"C", b"m2")
    assert [m[3] for m in net.to(b"W")] == [b"m1", b"m2"]
    net.request(b"C", b"m3")
    events = net.request(b"C", b"m3")  # m3 still outstanding
    assert [e.rule for e in of(events, ProtocolViolation)] == ["MDP-S-02"]
    net.send(b"W", b"", E, b"READY", b"r")
    assert [m[3] for m in net.to(b"W")] == [b"m3"]  # once, not twice


@pytest.mark.parametrize(
    ("queue", "headers", "message", "why"),
    [
        (b"a", b"timeout:abc", JOB, "timeout"),
        (b"a", b"reply-requested,xtimeout:5", JOB, "timeout"),
        (b"a", b"", b"not json", "JSON"),
        (b"a", b"", b'{"run": 1}', "JSON list"),
        (b"a", b"\xff", JOB, "UTF-8"),
        (b"", b"", JOB, "queue"),
        (b"\xfe", b"", JOB, "UTF-8"),
    ],
)
def test_emqp_09_what_a_jobmanager_cannot_take_is_refused_with_an_answer(
    queue: bytes, headers: bytes, message: bytes, why: str
) -> None:
    """EMQP-09: what a jobmanager cannot take is refused with an answer."""
    net = Net()
    net.inform(b"W")
    events = net.send(b"C", b"", E, b"REQUEST", b"m1", queue, headers, message)
    assert [e.rule for e in of(events, ProtocolViolation)] == ["EMQP-09"]
    [answer] = net.to(b"C")
    assert answer[:3] == (b"", E, b"REPLY")
    assert answer[5] == b"m1"
    assert why in json.loads(bytes(answer[4]))["error"]
    # Nothing reached the worker; a good request still does.
    net.request(b"C", b"m2")
    assert [m[3] for m in net.to(b"W")] == [b"m2"]


def test_emqp_09_a_frame_after_the_message_must_be_utf8_too() -> None:
    """EMQP-09: a frame after the message must be utf8 too."""
    net = Net()
    events = net.send(b"C", b"", E, b"REQUEST", b"m1", b"a", b"", JOB, b"\xff")
    assert [e.rule for e in of(events, ProtocolViolation)] == ["EMQP-09"]


def test_emqp_10_the_worker_gets_the_clients_msgid_queue_headers_and_message() -> None:
    """EMQP-10: the worker gets the clients msgid queue headers and message."""
    net = Net()
    net.inform(b"W")
    net.send(b"C", b"", E, b"REQUEST", b"m1", b"a", b"reply-requested,timeout:30", JOB, b"x")
    assert net.to(b"W") == [
        (b"", E, b"REQUEST", b"m1", b"a", b"reply-requested,timeout:30", JOB, b"x")
    ]


def test_emqp_11_a_receipt_when_first_handed_to_a_worker() -> None:
    """EMQP-11: a receipt when first handed to a worker."""
    net = Net()
    net.request(b"C", b"m1")
    assert net.to(b"C") == []  # waiting: not submitted yet
    net.send(b"W1", b"", E, b"INFORM", b"i", ONE_QUEUE, b"worker")
    net.send(b"W1", b"", E, b"READY", b"r")
    assert net.to(b"C") == [(b"", E, b"REPLY", b"domo-3", b"m1")]
    net.inform(b"W2")
    net.send(b"W1", b"", E, b"KBYE", b"k")  # lost: the request goes to W2
    out = net.out()  # one flush: what goes to W2 and to C
    assert commands([m for peer, m in out if peer == b"W2"]) == [b"REQUEST"]
    assert [m for peer, m in out if peer == b"C"] == []  # no second receipt


def test_emqp_12_the_result_reaches_a_client_that_asked() -> None:
    """EMQP-12: the result reaches a client that asked."""
    net = Net()
    net.inform(b"W")
    net.request(b"C", b"m1")
    net.out()
    net.send(b"W", b"", E, b"REPLY", b"w1", b'{"value": 3}', b"m1")
    assert net.to(b"C") == [(b"", E, b"REPLY", b"domo-4", b'{"value": 3}', b"m1")]


def test_a_done_requests_and_spent_slots_routes_are_forgotten_not_kept_idle() -> None:
    """A MSGID names one request and a READY one slot, never asked for again: when the core is
    done with them their routes go, where they were kept idle for a next request that cannot
    come (REQREP-06 keeps a peer's), 2 a request up to the bound of 4,096 (issue 27)."""
    net = Net()
    net.inform(b"W")
    base = (net.broker.idle(), net.broker.keys())
    for n in range(10):
        msgid = b"m%d" % n
        net.request(b"C", msgid)
        assert commands(net.to(b"W")) == [b"REQUEST"]
        net.send(b"W", b"", E, b"REPLY", b"w%d" % n, b'{"value": 3}', msgid)
        result = (b"", E, b"REPLY", b"domo-%d" % (4 + 2 * n), b'{"value": 3}', msgid)
        assert net.to(b"C") == [result]
        net.send(b"W", b"", E, b"READY", b"r")  # the next slot
        assert net.out() == []
        assert (net.broker.idle(), net.broker.keys()) == base, n


def test_emqp_12_without_reply_requested_a_request_ends_at_the_worker() -> None:
    """EMQP-12: without reply requested a request ends at the worker."""
    net = Net()
    net.inform(b"W")
    net.inform(b"W2", slots=0)
    net.request(b"C", b"m1", headers=b"")
    out = net.out()
    assert [(p, m[2]) for p, m in out] == [(b"C", b"REPLY"), (b"W", b"REQUEST")]
    assert net.broker.core.requests() == []
    # Lost with its worker? It was done: nothing goes to another worker.
    net.send(b"W", b"", E, b"KBYE", b"k")
    net.send(b"W2", b"", E, b"READY", b"r")
    assert net.out() == []


def test_emqp_13_a_reply_for_nothing_held_is_dropped() -> None:
    """EMQP-13: a reply for nothing held is dropped."""
    net = Net()
    net.inform(b"W")
    net.request(b"C", b"m1")
    net.out()
    events = net.send(b"W", b"", E, b"REPLY", b"w1", b'{"value": 3}', b"other")
    assert [e.rule for e in of(events, ProtocolViolation)] == ["EMQP-13"]
    events = net.send(b"W", b"", E, b"REPLY", b"w1")
    assert [e.rule for e in of(events, ProtocolViolation)] == ["EMQP-13"]
    net.send(b"W", b"", E, b"REPLY", b"w1", b'{"value": 3}', b"m1")  # still served
    assert commands(net.to(b"C")) == [b"REPLY"]


def test_emqp_14_a_silent_worker_loses_its_job_to_the_next() -> None:
    """EMQP-14: a silent worker loses its job to the next."""
    net = Net()
    net.inform(b"W1")
    net.request(b"C", b"m1")
    net.out()
    net.inform(b"W2")
    for second in (1.0, 2.0, 3.0):
        net.send(b"W2", b"", E, b"HEARTBEAT", b"h", b"0", at=second)
    events = net.tick(3.5)
    assert of(events, WorkerExpired)
    assert [m[3] for m in net.to(b"W2") if m[2] == b"REQUEST"] == [b"m1"]
    net.send(b"W2", b"", E, b"REPLY", b"w", b'{"value": 3}', b"m1")
    assert [m[4] for m in net.to(b"C")] == [b'{"value": 3}']


def test_emqp_15_a_slot_spent_by_a_reply_is_not_taken_for_a_stranger() -> None:
    """EMQP-15: a worker's liveness is one clock, the bridge's, so the core does not time its
    slots: a REPLY that spends a slot, half an interval on, is no "HEARTBEAT before READY" for
    it (the false MDP-H-01s seen against EventMQ's jobmanager), and the worker's other slot
    still serves."""
    net = Net()
    net.inform(b"W", slots=2)
    net.request(b"C", b"m1", at=0.1)
    assert commands(net.to(b"W")) == [b"REQUEST"]
    net.send(b"W", b"", E, b"REPLY", b"x", b'{"value": 1}', b"m1", at=2.0)
    net.send(b"W", b"", E, b"HEARTBEAT", b"h", b"2", at=2.6)
    net.request(b"C", b"m2", at=2.7)
    assert commands(net.to(b"W")) == [b"REQUEST"]
    net.send(b"W", b"", E, b"REPLY", b"y", b'{"value": 2}', b"m2", at=2.8)
    assert of(net.events, ProtocolViolation) == []
    assert [m[4] for m in net.to(b"C")] == [b'{"value": 2}']


# -- heartbeats and leaving --------------------------------------------------------------------


def test_emqp_15_heartbeats_every_interval_until_the_worker_falls_silent() -> None:
    """EMQP-15: heartbeats every interval until the worker falls silent."""
    net = Net()
    net.send(b"W", b"", E, b"INFORM", b"i", ONE_QUEUE, b"worker", at=0.0)
    assert commands(net.to(b"W")) == [b"ACK", b"HEARTBEAT"]
    assert net.broker.next_deadline() == 1.0
    net.tick(1.0)
    assert commands(net.to(b"W")) == [b"HEARTBEAT"]
    net.send(b"W", b"", E, b"READY", b"r", at=1.5)  # any command is a heartbeat
    net.tick(2.0)
    net.tick(3.0)
    net.tick(4.0)
    assert commands(net.to(b"W")) == [b"HEARTBEAT"] * 3
    net.tick(4.6)  # silent since 1.5: 3 intervals gone
    net.tick(9.0)
    assert net.out() == []
    assert net.broker.workers() == {}


def test_emqp_16_kbye_kbai_and_disconnect_all_mean_leaving() -> None:
    """EMQP-16: kbye kbai and disconnect all mean leaving."""
    for word in (b"KBYE", b"KBAI", b"DISCONNECT"):
        net = Net()
        net.inform(b"W1")
        net.request(b"C", b"m1")
        net.inform(b"W2")
        net.out()
        events = net.send(b"W1", b"", E, word, b"bye")
        assert of(events, RequestRedispatched), word
        assert [m[3] for m in net.to(b"W2")] == [b"m1"]
        assert of(net.send(b"W1", b"", E, b"HEARTBEAT", b"h"), MessageDropped)


@pytest.mark.parametrize("command", [b"SCHEDULE", b"UNSCHEDULE", b"PUBLISH"])
def test_emqp_17_schedule_unschedule_publish_are_refused(command: bytes) -> None:
    """EMQP-17: schedule unschedule publish are refused."""
    net = Net()
    net.inform(b"W")
    frames = [b"", E, command, b"s1", b"a", b"", b"60", JOB, b""]
    events = net.send(b"C", *frames)
    assert of(events, MessageDropped)
    [answer] = net.to(b"C")
    assert answer[2] == b"REPLY"
    assert answer[5] == b"s1"
    assert "not supported" in json.loads(bytes(answer[4]))["error"]
    assert net.to(b"W") == []


@pytest.mark.parametrize("command", [b"ACK", b"NONSENSE", b""])
def test_emqp_18_unknown_commands_are_dropped_and_harm_no_one(command: bytes) -> None:
    """EMQP-18: unknown commands are dropped and harm no one."""
    net = Net()
    net.inform(b"W")
    events = net.send(b"W", b"", E, command, b"x")
    assert [e.rule for e in of(events, ProtocolViolation)] in (["EMQP-18"], ["EMQP-02"])
    net.request(b"C", b"m1")
    assert commands(net.to(b"W")) == [b"REQUEST"]


def test_emqp_19_shutdown_says_kbye_to_each_worker() -> None:
    """EMQP-19: shutdown says kbye to each worker."""
    net = Net()
    net.inform(b"W1")
    net.inform(b"W2", slots=0)
    net.broker.shutdown(net.now + 0.1)
    assert sorted((p, m[2]) for p, m in net.out()) == [(b"W1", b"KBYE"), (b"W2", b"KBYE")]


# -- across dialects and the rest ----------------------------------------------------------------


def test_emqp_20_an_mdp_client_is_served_by_an_emqp_worker() -> None:
    """EMQP-20: an mdp client is served by an emqp worker."""
    net = Net()
    net.inform(b"W")
    net.send(b"M", b"MDPC02", b"\x01", b"a", JOB)
    [request] = net.to(b"W")
    assert request[2:4] == (b"REQUEST", b"domo-3")
    assert request[4:] == (b"a", b"reply-requested", JOB)
    net.send(b"W", b"", E, b"REPLY", b"w", b'{"value": 3}', b"domo-3")
    assert net.to(b"M") == [(b"MDPC02", b"\x03", b"a", b'{"value": 3}')]


def test_emqp_20_an_mdp_body_that_is_no_job_is_answered_and_the_slot_kept() -> None:
    """EMQP-20: an mdp body that is no job is answered and the slot kept."""
    net = Net()
    net.inform(b"W")
    net.send(b"M", b"MDPC02", b"\x01", b"a", b"hello")
    out = net.out()
    assert [p for p, _ in out] == [b"M"]
    assert "JSON" in json.loads(bytes(out[0][1][3]))["error"]
    net.send(b"M", b"MDPC02", b"\x01", b"a", JOB)
    assert commands(net.to(b"W")) == [b"REQUEST"]


def test_emqp_21_an_emqp_client_is_served_by_an_mdp_worker() -> None:
    """EMQP-21: an emqp client is served by an mdp worker."""
    net = Net()
    net.send(b"M", b"MDPW02", b"\x01", b"a")
    net.request(b"C", b"m1")
    out = net.out()
    assert (b"M", (b"MDPW02", b"\x02", out[1][1][2], b"", JOB)) in out
    client_key = out[1][1][2]
    net.send(b"M", b"MDPW02", b"\x03", client_key, b"", b"partial")
    net.send(b"M", b"MDPW02", b"\x04", client_key, b"", b"result", b"more")
    assert net.to(b"C") == [(b"", E, b"REPLY", b"domo-2", b"result", b"m1")]


def test_emqp_22_no_worker_for_the_queue_means_waiting_not_rerouting() -> None:
    """EMQP-22: no worker for the queue means waiting not rerouting."""
    net = Net()
    net.inform(b"W", b'[[10, "default"]]')
    net.request(b"C", b"m1", b"nobody")
    assert net.to(b"W") == []
    events = net.tick(11.0)
    assert of(events, RequestExpired)
    assert net.to(b"C") == []


def test_emqp_23_weights_do_not_overrule_least_recently_used() -> None:
    """EMQP-23: weights do not overrule least recently used."""
    net = Net()
    net.inform(b"LIGHT", b'[[1, "a"]]')
    net.inform(b"HEAVY", b'[[100, "a"]]')
    net.request(b"C", b"m1")
    assert [p for p, m in net.out() if m[2] == b"REQUEST"] == [b"LIGHT"]


def test_emqp_24_broker_ids_count_up_and_heartbeats_carry_its_clock() -> None:
    """EMQP-24: broker ids count up and heartbeats carry its clock."""
    net = Net()
    net.inform(b"W1")
    net.inform(b"W2")
    net.tick(1.25)
    ids = [bytes(m[3]) for _, m in net.out()]
    assert ids == sorted(set(ids), key=lambda i: int(i.split(b"-")[1]))
    assert all(i.startswith(b"domo-") for i in ids)
    net.tick(2.5)
    assert {m[4] for _, m in net.out()} == {b"2.500"}


def test_emqp_25_mmi_service_answers_an_emqp_client() -> None:
    """EMQP-25: mmi service answers an emqp client."""
    net = Net()
    net.inform(b"W")
    events = net.send(b"C", b"", E, b"REQUEST", b"q1", b"mmi.service", b"reply-requested", b"a")
    assert of(events, MmiReplied)
    assert net.to(b"C") == [(b"", E, b"REPLY", b"domo-3", b"200", b"q1")]


def test_emqp_26_timeout_and_other_headers_pass_unchanged() -> None:
    """EMQP-26: timeout and other headers pass unchanged."""
    net = Net()
    net.inform(b"W")
    headers = b"reply-requested,timeout:0,retry-count:3,guarantee"
    net.send(b"C", b"", E, b"REQUEST", b"m1", b"a", headers, JOB)
    [request] = net.to(b"W")
    assert request[5] == headers
    assert of(net.events, RequestDispatched)


def test_emqp_06_a_slot_handed_two_requests_at_once_gives_one_back_uncounted() -> None:
    """EMQP-06, EMQP-14: a worker on two queues leaves holding a request of each; both go back at
    once, and the core offers both to the one free slot of another worker (one registration per
    queue). The slot takes one; the other goes back unsent, its attempt not counted (MDP-D-08),
    and goes out with the worker's next READY."""
    net = Net()
    net.inform(b"W0", b'[[10, "a"], [5, "b"]]', slots=2)
    net.inform(b"W1", b'[[10, "a"], [5, "b"]]', slots=0)
    net.request(b"C", b"m1", b"a")
    net.request(b"C", b"m2", b"b")
    assert [m[3] for m in net.to(b"W0")] == [b"m1", b"m2"]
    net.send(b"W1", b"", E, b"READY", b"r")
    net.send(b"W0", b"", E, b"KBYE", b"bye")
    [first] = [m[3] for m in net.to(b"W1") if m[2] == b"REQUEST"]
    events = net.send(b"W1", b"", E, b"READY", b"r")
    [second] = [m[3] for m in net.to(b"W1") if m[2] == b"REQUEST"]
    assert {first, second} == {b"m1", b"m2"}
    assert [e.attempt for e in of(events, RequestDispatched)] == [2]  # W0, then W1: not 3


def test_emqp_14_a_leaving_worker_takes_back_no_job_of_its_own() -> None:
    """EMQP-14: a worker with a job and a free slot leaves; its slots are withdrawn together, so
    the job goes back to its queue, not to the leaving worker's other slot (which would send it
    nothing but count an attempt), and the next worker gets it as its second attempt."""
    net = Net()
    net.inform(b"W0", slots=2)
    net.request(b"C", b"m1")
    assert [m[3] for m in net.to(b"W0") if m[2] == b"REQUEST"] == [b"m1"]
    net.send(b"W0", b"", E, b"KBYE", b"bye")
    assert [m for m in net.to(b"W0") if m[2] == b"REQUEST"] == []
    assert net.broker.workers() == {}
    net.inform(b"W1", slots=0)
    events = net.send(b"W1", b"", E, b"READY", b"r")
    assert [m[3] for m in net.to(b"W1") if m[2] == b"REQUEST"] == [b"m1"]
    assert [e.attempt for e in of(events, RequestDispatched)] == [2]  # W0, then W1: not 3


def test_emqp_01_workers_and_clients_on_different_sockets() -> None:
    """EMQP-01: EventMQ's frontend and backend are two ports; a broker bound on both serves a
    worker on one (connection 1) and a client on the other (connection 0), even if ZeroMQ gives
    them the same routing id."""
    broker = FamilyBroker(CONFIG)
    broker.receive(b"P", [b"", E, b"INFORM", b"i", ONE_QUEUE, b"worker"], 0.0, connection=1)
    broker.receive(b"P", [b"", E, b"READY", b"r"], 0.1, connection=1)
    broker.take_outgoing()
    broker.receive(b"P", [b"", E, b"REQUEST", b"m1", b"a", b"reply-requested", JOB], 0.2)
    out = broker.take_outgoing()
    assert [(c, p, m[2]) for c, p, m in out] == [(0, b"P", b"REPLY"), (1, b"P", b"REQUEST")]
    broker.receive(b"P", [b"", E, b"REPLY", b"w", b'{"value": 3}', b"m1"], 0.3, connection=1)
    assert [(c, m[4]) for c, _, m in broker.take_outgoing()] == [(0, b'{"value": 3}')]


def test_emqp_14_an_unreachable_worker_gives_its_jobs_back() -> None:
    """EMQP-14: the I/O layer finds the worker's routing id gone: its job goes to the next
    worker and the broker stops heartbeating it."""
    net = Net()
    net.inform(b"W1")
    net.request(b"C", b"m1")
    net.out()
    net.inform(b"W2")
    events = net.broker.peer_unreachable(b"W1", net.now + 0.1)
    assert of(events, RequestRedispatched)
    assert [m[3] for m in net.to(b"W2") if m[2] == b"REQUEST"] == [b"m1"]
    net.tick(net.now + 1.5)
    assert [p for p, m in net.out() if m[2] == b"HEARTBEAT"] == [b"W2"]


def test_emqp_07_keys_are_forgotten_once_used() -> None:
    """EMQP-07, EMQP-08: a thousand requests through one worker leave the broker holding only
    the worker's free slot and nothing of the clients."""
    net = Net()
    net.inform(b"W")
    for number in range(1000):
        msgid = b"m%d" % number
        net.request(b"C%d" % (number % 7), msgid, headers=b"reply-requested" if number % 2 else b"")
        if number % 2:
            net.send(b"W", b"", E, b"REPLY", b"w", b"{}", msgid)
        net.send(b"W", b"", E, b"READY", b"r")
        net.out()
    assert net.broker.keys() == 1
    assert len(net.broker.workers()) == 1


COMMANDS = [b"INFORM", b"READY", b"REQUEST", b"REPLY", b"HEARTBEAT", b"KBYE", b"ACK", b"X"]
FRAME = st.one_of(
    st.sampled_from([b"", b"a", b"default", JOB, b"reply-requested", b"timeout:", b"[[1, 2]]"]),
    st.binary(max_size=12),
)
GARBAGE = st.lists(
    st.tuples(
        st.sampled_from([b"G1", b"G2", b"W"]),
        st.one_of(
            st.lists(FRAME, max_size=6).map(lambda rest: [b"", E, *rest]),
            st.tuples(st.sampled_from(COMMANDS), st.lists(FRAME, max_size=5)).map(
                lambda pair: [b"", E, pair[0], *pair[1]]
            ),
        ),
    ),
    max_size=12,
)


@settings(max_examples=150)
@given(garbage=GARBAGE)
def test_emqp_18_garbage_never_crashes_the_broker_nor_stops_others(
    garbage: list[tuple[bytes, list[bytes]]],
) -> None:
    """EMQP-18, EMQP-02, EMQP-09: any frames after the eMQP header, from any peer, raise nothing;
    every REQUEST a worker got has all its frames; a worker and a client that start afresh are
    served afterwards."""
    net = Net()
    for peer, frames in garbage:
        net.send(peer, *frames)
    for _, message in net.out():
        if message[2] == b"REQUEST":
            assert len(message) >= 7, message
    net.inform(b"W2", b'[[1, "final queue"]]')  # a queue no garbage names
    net.request(b"C", b"fresh", b"final queue")
    assert [m[3] for m in net.to(b"W2") if m[2] == b"REQUEST"] == [b"fresh"]
    net.send(b"W2", b"", E, b"REPLY", b"w", b"{}", b"fresh")
    assert [m[4:] for m in net.to(b"C") if len(m) == 6] == [(b"{}", b"fresh")]
