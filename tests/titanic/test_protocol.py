"""The Titanic machine (``domo.titanic.protocol``), pure: every decision at exact times.

No I/O: requests, ids and time are inputs; the store's answers are given as records.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domo.protocol.errors import LocalProtocolError
from domo.titanic.protocol import (
    Answered,
    Dispatch,
    GiveUp,
    NoAnswer,
    NoService,
    Outcome,
    Purge,
    Record,
    RecordState,
    Refused,
    StoreRequest,
    TitanicConfig,
    TitanicMachine,
    is_request_id,
    pack_frames,
    status_code,
    unpack_frames,
)


def rid(n: int) -> bytes:
    return f"{n:032x}".encode()


def store(machine: TitanicMachine, n: int, service: bytes, now: float) -> StoreRequest:
    step = machine.accept([service, b"body%d" % n], rid(n), now)
    assert isinstance(step, StoreRequest)
    assert machine.stored(step, now) == [b"200", rid(n)]
    return step


def dispatches(effects: Sequence[object]) -> list[bytes]:
    return [e.request_id for e in effects if isinstance(e, Dispatch)]


# --- titanic.request ----------------------------------------------------------------------------


def test_accept_asks_for_a_commit_and_only_stored_answers_200_with_the_id() -> None:
    """TSP-S-02, TSP-S-04, TSP-D-01: nothing is answered 200 before the runtime says stored."""
    machine = TitanicMachine()
    step = machine.accept([b"echo", b"a", b"b"], rid(1), 10.0)
    assert step == StoreRequest(rid(1), b"echo", (b"a", b"b"), 10.0)
    assert machine.pending_count() == 0  # not queued before it is on disk
    assert machine.tick(10.0) == []
    assert machine.stored(step, 10.5) == [b"200", rid(1)]
    assert machine.pending_count() == 1
    assert dispatches(machine.tick(10.5)) == [rid(1)]


def test_a_failed_commit_answers_500_and_queues_nothing() -> None:
    """TSP-F-04, TSP-D-08."""
    machine = TitanicMachine()
    step = machine.accept([b"echo", b"a"], rid(1), 1.0)
    assert isinstance(step, StoreRequest)
    answer = machine.not_stored(step, "disk full", 1.0)
    assert status_code(answer[0]) == b"500"
    assert answer == [b"500 request not stored: disk full"]
    assert machine.pending_count() == 0
    assert machine.tick(2.0) == []


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([], "a service name and at least one body frame"),
        ([b"echo"], "a service name and at least one body frame"),
        ([b"", b"x"], "1 to 255 bytes"),
        ([b"e" * 256, b"x"], "1 to 255 bytes"),
        ([b"ech\x00", b"x"], "printable"),
        ([b"titanic.request", b"echo", b"x"], "TSP-D-10"),
    ],
)
def test_malformed_requests_are_refused_with_400_and_text(frames: list[bytes], why: str) -> None:
    """TSP-S-02, TSP-S-03, TSP-D-10, TSP-D-13: 400 says 'do not retry'; the text says why."""
    machine = TitanicMachine()
    step = machine.accept(frames, rid(1), 1.0)
    assert isinstance(step, Refused)
    assert status_code(step.reply[0]) == b"400"
    assert why in step.reply[0].decode()
    assert len(step.reply) == 1
    assert machine.pending_count() == 0


def test_a_255_byte_printable_service_is_accepted() -> None:
    """TSP-S-03: the broker's own bound (MDP-D-01), inclusive."""
    step = TitanicMachine().accept([b"~" * 255, b""], rid(1), 0.0)
    assert isinstance(step, StoreRequest)
    assert step.body == (b"",)


def test_ids_are_inputs_checked_fresh_and_lowercase() -> None:
    """TSP-S-05, TSP-D-09: the machine draws no id; a reused or badly written one is misuse."""
    machine = TitanicMachine()
    store(machine, 1, b"echo", 0.0)
    with pytest.raises(LocalProtocolError):
        machine.accept([b"echo", b"x"], rid(1), 0.0)
    with pytest.raises(LocalProtocolError):
        machine.accept([b"echo", b"x"], b"A" * 32, 0.0)
    with pytest.raises(LocalProtocolError):
        machine.accept([b"echo", b"x"], b"a" * 31, 0.0)


def test_time_must_not_go_backwards() -> None:
    """TSP-D-16: now never decreases; the call raises before any change."""
    machine = TitanicMachine()
    store(machine, 1, b"echo", 5.0)
    with pytest.raises(LocalProtocolError):
        machine.tick(4.0)
    assert dispatches(machine.tick(5.0)) == [rid(1)]


# --- titanic.reply and titanic.close ------------------------------------------------------------


def test_reply_ids_are_checked_before_any_lookup() -> None:
    """TSP-S-06, TSP-S-08: one frame, 32 characters of the RFC's range."""
    machine = TitanicMachine()
    assert machine.reply_id([rid(7)]) == rid(7)
    assert machine.reply_id([b"Z" * 32]) == b"Z" * 32  # the RFC's 'A' to 'Z'
    for frames in ([], [rid(1), rid(2)]):
        answer = machine.reply_id(frames)
        assert isinstance(answer, list)
        assert status_code(answer[0]) == b"400"
    for bad in (b"x" * 31, b"x" * 33, b"-" * 32, b""):
        answer = machine.reply_id([bad])
        assert isinstance(answer, list)
        assert answer[0].startswith(b"400 ")


def test_answer_reply_maps_every_state() -> None:
    """TSP-S-07, TSP-F-01, TSP-F-02, TSP-F-03, TSP-D-06, TSP-D-15."""
    machine = TitanicMachine()
    assert machine.answer_reply(rid(1), None) == [b"400 unknown request id"]
    pending = Record(rid(1), RecordState.PENDING)
    assert machine.answer_reply(rid(1), pending) == [b"300 pending"]
    done = Record(rid(1), RecordState.DONE, reply=(b"a", b"", b"c"))
    assert machine.answer_reply(rid(1), done) == [b"200", b"a", b"", b"c"]
    failed = Record(rid(1), RecordState.FAILED, reason="no reply from 'x' within 5 s")
    assert machine.answer_reply(rid(1), failed) == [b"400 given up: no reply from 'x' within 5 s"]


def test_reading_a_reply_changes_nothing() -> None:
    """TSP-S-09: titanic.reply is idempotent; the machine keeps no read state."""
    machine = TitanicMachine()
    done = Record(rid(1), RecordState.DONE, reply=(b"r",))
    first = machine.answer_reply(rid(1), done)
    assert [machine.answer_reply(rid(1), done) for _ in range(3)] == [first] * 3


def test_close_ids_and_answers() -> None:
    """TSP-S-10, TSP-S-11, TSP-D-13: one frame; a frame that cannot be an id is not known: 200."""
    machine = TitanicMachine()
    assert machine.close_id([rid(3)]) == rid(3)
    assert machine.close_id([b"nonsense"]) == [b"200"]
    for frames in ([], [rid(1), rid(1)]):
        answer = machine.close_id(frames)
        assert isinstance(answer, list)
        assert answer[0].startswith(b"400 ")
    assert machine.closed(rid(99), 1.0) == [b"200"]  # unknown: 200 all the same


def test_closing_a_waiting_request_takes_it_out_of_the_queue() -> None:
    """TSP-S-11."""
    machine = TitanicMachine(TitanicConfig(max_in_flight=1))
    store(machine, 1, b"echo", 0.0)
    store(machine, 2, b"echo", 0.0)
    assert dispatches(machine.tick(0.0)) == [rid(1)]
    assert machine.closed(rid(2), 0.1) == [b"200"]
    assert machine.dispatched(rid(1), Answered(), 0.2) is None
    assert machine.tick(0.2) == []
    assert machine.pending_count() == 0


def test_closing_a_request_in_flight_does_not_recall_it() -> None:
    """TSP-D-11: its outcome, when it comes, has nothing to record."""
    machine = TitanicMachine()
    store(machine, 1, b"echo", 0.0)
    assert dispatches(machine.tick(0.0)) == [rid(1)]
    machine.closed(rid(1), 0.5)
    assert machine.in_flight() == 1
    assert machine.dispatched(rid(1), Answered(), 1.0) is None
    assert machine.in_flight() == 0
    assert machine.pending_count() == 0
    with pytest.raises(LocalProtocolError):
        machine.dispatched(rid(1), Answered(), 1.0)


# --- request execution --------------------------------------------------------------------------


def test_dispatch_is_oldest_first_per_service_and_services_take_turns() -> None:
    """TSP-R-01, TSP-D-14."""
    machine = TitanicMachine(TitanicConfig(max_in_flight=10))
    for n, service in enumerate([b"a", b"a", b"a", b"b", b"b"]):
        store(machine, n, service, 0.0)
    effects = machine.tick(0.0)
    assert dispatches(effects) == [rid(0), rid(3), rid(1), rid(4), rid(2)]
    assert [e.attempt for e in effects if isinstance(e, Dispatch)] == [1] * 5


def test_max_in_flight_bounds_dispatches_and_an_answer_frees_a_place() -> None:
    """TSP-R-01: at most max_in_flight at once."""
    machine = TitanicMachine(TitanicConfig(max_in_flight=2))
    for n in range(4):
        store(machine, n, b"a", 0.0)
    assert dispatches(machine.tick(0.0)) == [rid(0), rid(1)]
    assert machine.tick(0.0) == []
    assert machine.in_flight() == 2
    machine.dispatched(rid(0), Answered(), 1.0)
    assert dispatches(machine.tick(1.0)) == [rid(2)]


def test_probe_is_asked_unless_the_service_answered_within_probe_interval() -> None:
    """TSP-R-01, TSP-D-05: mmi.service before a dispatch to a service not heard from lately."""
    machine = TitanicMachine(TitanicConfig(probe_interval=1.0, max_in_flight=1))
    store(machine, 1, b"a", 0.0)
    [first] = [e for e in machine.tick(0.0) if isinstance(e, Dispatch)]
    assert first.probe
    machine.dispatched(rid(1), Answered(), 2.0)
    store(machine, 2, b"a", 2.5)
    store(machine, 3, b"a", 2.5)
    effects = [e for e in machine.tick(2.9) if isinstance(e, Dispatch)]
    assert [(e.request_id, e.probe) for e in effects] == [(rid(2), False)]
    machine.dispatched(rid(2), Answered(), 2.9)
    effects = [e for e in machine.tick(3.9) if isinstance(e, Dispatch)]
    assert [(e.request_id, e.probe) for e in effects] == [(rid(3), True)]  # 3.9 - 2.9 >= 1.0


def test_no_service_holds_the_service_back_doubling_to_the_maximum() -> None:
    """TSP-D-05: back to the front of its queue; the whole service waits 1, 2, 4, 4 s."""
    machine = TitanicMachine(TitanicConfig(retry_initial=1.0, retry_max=4.0))
    store(machine, 1, b"a", 0.0)
    store(machine, 2, b"a", 0.0)
    store(machine, 3, b"b", 0.0)
    now = 0.0
    assert dispatches(machine.tick(now)) == [rid(1), rid(3), rid(2)]
    machine.dispatched(rid(3), Answered(), now)
    machine.dispatched(rid(2), Answered(), now)  # the service answered once, then was gone
    for hold in (1.0, 2.0, 4.0, 4.0):
        outcome = NoService() if hold != 2.0 else NoAnswer("timeout")
        assert machine.dispatched(rid(1), outcome, now) is None
        assert machine.next_deadline() == pytest.approx(now + hold)
        assert dispatches(machine.tick(now + hold - 0.001)) == []
        now += hold
        [again] = [e for e in machine.tick(now) if isinstance(e, Dispatch)]
        assert (again.request_id, again.probe) == (rid(1), True)
    machine.dispatched(rid(1), Answered(), now)
    store(machine, 4, b"a", now)
    assert dispatches(machine.tick(now)) == [rid(4)]  # an answer resets the hold


def test_a_request_whose_service_never_appears_is_given_up_at_its_expiry() -> None:
    """TSP-D-06: exactly at created + request_expiry, with a reason; never dispatched again."""
    config = TitanicConfig(
        request_expiry=10.0, purge_interval=1000.0, retry_initial=100.0, retry_max=100.0
    )
    machine = TitanicMachine(config)
    store(machine, 1, b"ghost", 100.0)
    assert dispatches(machine.tick(100.0)) == [rid(1)]
    machine.dispatched(rid(1), NoService(), 100.0)
    assert machine.tick(109.999) == []
    assert machine.next_deadline() is not None
    effects = machine.tick(110.0)
    assert effects == [GiveUp(rid(1), "no reply from 'ghost' within 10 s (1 attempt(s))")]
    assert machine.pending_count() == 0
    assert machine.tick(200.0) == []


def test_a_request_never_dispatched_expires_too() -> None:
    """TSP-D-06: 'never dispatched' when it never left the queue."""
    machine = TitanicMachine(TitanicConfig(request_expiry=5.0, max_in_flight=1))
    store(machine, 1, b"a", 0.0)
    store(machine, 2, b"a", 0.0)
    machine.tick(0.0)
    effects = machine.tick(5.0)
    assert GiveUp(rid(2), "no reply from 'a' within 5 s (never dispatched)") in effects


def test_an_answer_to_a_request_in_flight_at_its_expiry_still_counts() -> None:
    """TSP-D-06: expired in flight: an answer is kept; no answer gives up."""
    machine = TitanicMachine(TitanicConfig(request_expiry=5.0))
    store(machine, 1, b"a", 0.0)
    store(machine, 2, b"a", 0.0)
    machine.tick(0.0)
    assert machine.tick(6.0) == []  # both in flight: their outcomes decide
    assert machine.dispatched(rid(1), Answered(), 7.0) is None
    verdict = machine.dispatched(rid(2), NoAnswer("timeout"), 7.0)
    assert isinstance(verdict, GiveUp)
    assert verdict.request_id == rid(2)
    assert machine.pending_count() == 0


def test_purge_is_due_every_purge_interval_for_records_older_than_reply_expiry() -> None:
    """TSP-D-07."""
    machine = TitanicMachine(TitanicConfig(reply_expiry=100.0, purge_interval=60.0))
    assert machine.tick(1000.0) == []
    assert machine.next_deadline() == 1060.0
    assert machine.tick(1060.0) == [Purge(960.0)]
    assert machine.tick(1119.0) == []
    assert machine.tick(1120.0) == [Purge(1020.0)]


def test_recover_queues_pending_requests_in_store_order_at_least_once() -> None:
    """TSP-D-04, TSP-D-14: a restart dispatches again what was in flight."""
    machine = TitanicMachine()
    machine.recover([(rid(5), b"a", 1.0), (rid(2), b"a", 2.0), (rid(9), b"b", 3.0)], 10.0)
    assert dispatches(machine.tick(10.0)) == [rid(5), rid(9), rid(2)]
    machine.recover([(rid(5), b"a", 1.0)], 10.0)  # already known: not twice
    assert machine.pending_count() == 3


def test_dispatched_for_a_request_not_in_flight_is_misuse() -> None:
    machine = TitanicMachine()
    store(machine, 1, b"a", 0.0)
    with pytest.raises(LocalProtocolError):
        machine.dispatched(rid(1), Answered(), 0.0)  # stored, not dispatched


# --- frames, status, ids ------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=300), max_size=8))
def test_pack_and_unpack_frames_round_trip(frames: list[bytes]) -> None:
    """TSP-S-02, TSP-D-15: frame boundaries are kept, empty frames included."""
    assert unpack_frames(pack_frames(frames)) == frames


@given(st.binary(max_size=64))
def test_unpack_raises_only_value_error(blob: bytes) -> None:
    with contextlib.suppress(ValueError):
        unpack_frames(blob)


def test_status_code_reads_three_digits_and_ignores_the_text() -> None:
    """TSP-F-05, TSP-F-06, TSP-F-07."""
    assert status_code(b"200") == b"200"
    assert status_code(b"300 anything at all") == b"300"
    assert status_code(b"400 ") == b"400"
    for bad in (b"201", b"20", b"2000", b"200x", b"", b"OK", b"600 x"):
        assert status_code(bad) is None


def test_is_request_id() -> None:
    """TSP-S-05, TSP-S-08."""
    assert is_request_id(b"0123456789abcdefABCDEFxyzXYZ0000")
    assert not is_request_id(b"0123456789abcdef0123456789abcde")
    assert not is_request_id(b"0123456789abcdef0123456789abcde!")


# --- a model: whatever happens, nothing stored is lost or dispatched twice at once -------------


class TitanicModel(RuleBasedStateMachine):
    """Random storing, closing, outcomes and time; checked against a plain model at each step."""

    def __init__(self) -> None:
        super().__init__()
        self.config = TitanicConfig(
            request_expiry=8.0, retry_initial=0.5, retry_max=2.0, max_in_flight=3
        )
        self.machine = TitanicMachine(self.config)
        self.now = 0.0
        self.next_id = 0
        self.stored: dict[bytes, float] = {}  # pending in the model: id -> created
        self.in_flight: set[bytes] = set()
        self.finished: set[bytes] = set()

    def _apply(self, effects: Sequence[object]) -> None:
        for effect in effects:
            if isinstance(effect, Dispatch):
                assert effect.request_id in self.stored, "dispatched something not pending"
                assert effect.request_id not in self.in_flight, "dispatched twice at once"
                self.in_flight.add(effect.request_id)
            elif isinstance(effect, GiveUp):
                created = self.stored.pop(effect.request_id)
                assert self.now >= created + self.config.request_expiry
                self.finished.add(effect.request_id)

    @rule(service=st.sampled_from([b"a", b"b", b"c"]))
    def submit(self, service: bytes) -> None:
        self.next_id += 1
        step = self.machine.accept([service, b"x"], rid(self.next_id), self.now)
        assert isinstance(step, StoreRequest)
        assert self.machine.stored(step, self.now) == [b"200", rid(self.next_id)]
        self.stored[rid(self.next_id)] = self.now

    @rule(step=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.3]))
    def tick(self, step: float) -> None:
        self.now += step
        self._apply(self.machine.tick(self.now))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), kind=st.sampled_from(["answer", "no-service", "no-answer"]))
    def outcome(self, data: st.DataObject, kind: str) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.in_flight)))
        self.in_flight.discard(request_id)
        outcomes: dict[str, Outcome] = {
            "answer": Answered(),
            "no-service": NoService(),
            "no-answer": NoAnswer(),
        }
        outcome = outcomes[kind]
        verdict = self.machine.dispatched(request_id, outcome, self.now)
        if request_id not in self.stored:  # closed while in flight
            assert verdict is None
            return
        if kind == "answer":
            assert verdict is None
            del self.stored[request_id]
            self.finished.add(request_id)
        elif verdict is not None:
            assert isinstance(verdict, GiveUp)
            created = self.stored.pop(request_id)
            assert self.now >= created + self.config.request_expiry
            self.finished.add(request_id)

    @precondition(lambda self: self.next_id > 0)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        request_id = rid(data.draw(st.integers(1, self.next_id)))
        assert self.machine.closed(request_id, self.now) == [b"200"]
        self.stored.pop(request_id, None)

    @invariant()
    def agrees(self) -> None:
        assert self.machine.pending_count() == len(self.stored)
        assert self.machine.in_flight() == len(self.in_flight)
        assert self.machine.in_flight() <= self.config.max_in_flight
        for request_id in self.stored:
            assert self.machine.is_pending(request_id)
        deadline = self.machine.next_deadline()
        waiting = [t for r, t in self.stored.items() if r not in self.in_flight]
        if waiting:  # a request waiting to go always has a deadline: its expiry at the latest
            assert deadline is not None
            assert deadline <= min(waiting) + self.config.request_expiry

    def teardown(self) -> None:
        # Eventually: every pending request is dispatched, answered or given up (bounded loop).
        for _ in range(200):
            self.now += 1.0
            self._apply(self.machine.tick(self.now))
            for request_id in sorted(self.in_flight):
                self.in_flight.discard(request_id)
                verdict = self.machine.dispatched(request_id, Answered(), self.now)
                assert verdict is None
                self.stored.pop(request_id, None)
            if not self.stored and not self.in_flight:
                break
        assert self.machine.in_flight() == 0


TestTitanicModel = TitanicModel.TestCase
TestTitanicModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_poll_delays_start_quick_and_level_off() -> None:
    """TSP-F-02: "retry later": 5 ms, doubling, then once a second."""
    from itertools import islice

    from domo.titanic.client import poll_delays

    assert list(islice(poll_delays(), 10)) == [
        0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0,
    ]  # fmt: skip
