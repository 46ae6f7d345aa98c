"""The Binary Star machine (``domo.binarystar.fsm``), pure: every cell of its table, the
client vote, the exact silence boundary, and the freeze (SIGSTOP) rule."""

from __future__ import annotations

import itertools

import pytest

from domo.binarystar.fsm import (
    PEER_EVENTS,
    TRANSITIONS,
    Event,
    PairConfig,
    PairMachine,
    Role,
    State,
    decode_state,
    encode_state,
)
from domo.protocol.errors import LocalProtocolError

BEAT = 1.0


def beat(m: PairMachine, until: float) -> None:
    """Tick ``m`` as its runtime does: at every heartbeat up to ``until`` (state published)."""
    now = m.now
    while now <= until:
        m.tick(now)
        now += BEAT


def serving(m: PairMachine) -> bool:
    return m.serving


def state_of(m: PairMachine) -> State:
    """The machine's state, read through a call so that checks in a row are not narrowed."""
    return m.state


def machine(role: Role, state: State, now: float = 0.0) -> PairMachine:
    """A machine of ``role`` put in ``state`` the way it gets there."""
    m = PairMachine(PairConfig(role, heartbeat=BEAT), now)
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    if state is State.ACTIVE and role is Role.PRIMARY:
        m.peer_state(other, State.BACKUP, now)  # BSTAR-05
    elif state is State.ACTIVE:
        m.peer_state(other, State.ACTIVE, now)  # BSTAR-07: passive
        m.peer_state(other, State.PRIMARY, now)  # BSTAR-08: the primary restarted
    elif state is State.PASSIVE:
        m.peer_state(other, State.ACTIVE, now)
    assert state_of(m) is state
    m.take_events()
    return m


def test_the_role_is_fixed_and_each_starts_waiting() -> None:
    """BSTAR-01, BSTAR-02: a primary starts in primary, a backup in backup; neither serves."""
    for role, state in ((Role.PRIMARY, State.PRIMARY), (Role.BACKUP, State.BACKUP)):
        m = PairMachine(PairConfig(role, heartbeat=BEAT), 0.0)
        assert (m.role, state_of(m), serving(m)) == (role, state, False)
        m.peer_state(Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY, State.ACTIVE, 0.1)
        assert m.role is role


def test_the_table_has_every_cell() -> None:
    """BSTAR-02, BSTAR-15: 4 states x 4 peer states, nothing missing, nothing extra."""
    peer_events = [e for e in Event if e is not Event.CLIENT_REQUEST]
    assert set(TRANSITIONS) == set(itertools.product(State, peer_events))
    assert {PEER_EVENTS[s] for s in State} == set(peer_events)


CASES = [
    # (role, state, peer says, expected state, rule)
    (Role.PRIMARY, State.PRIMARY, State.BACKUP, State.ACTIVE, "BSTAR-05"),
    (Role.PRIMARY, State.PRIMARY, State.ACTIVE, State.PASSIVE, "BSTAR-06"),
    (Role.PRIMARY, State.PRIMARY, State.PASSIVE, State.PRIMARY, "BSTAR-15"),
    (Role.BACKUP, State.BACKUP, State.ACTIVE, State.PASSIVE, "BSTAR-07"),
    (Role.BACKUP, State.BACKUP, State.PRIMARY, State.BACKUP, "BSTAR-15"),
    (Role.BACKUP, State.BACKUP, State.PASSIVE, State.BACKUP, "BSTAR-15"),
    (Role.PRIMARY, State.ACTIVE, State.BACKUP, State.ACTIVE, "BSTAR-15"),
    (Role.PRIMARY, State.ACTIVE, State.PASSIVE, State.ACTIVE, "BSTAR-15"),
    (Role.PRIMARY, State.ACTIVE, State.ACTIVE, State.PASSIVE, "BSTAR-11"),
    (Role.BACKUP, State.ACTIVE, State.ACTIVE, State.ACTIVE, "BSTAR-11"),
    (Role.BACKUP, State.ACTIVE, State.PRIMARY, State.ACTIVE, "BSTAR-15"),
    (Role.PRIMARY, State.PASSIVE, State.BACKUP, State.ACTIVE, "BSTAR-08"),
    (Role.BACKUP, State.PASSIVE, State.PRIMARY, State.ACTIVE, "BSTAR-08"),
    (Role.BACKUP, State.PASSIVE, State.ACTIVE, State.PASSIVE, "BSTAR-15"),
    (Role.PRIMARY, State.PASSIVE, State.PASSIVE, State.ACTIVE, "BSTAR-13"),
    (Role.BACKUP, State.PASSIVE, State.PASSIVE, State.PASSIVE, "BSTAR-13"),
]


@pytest.mark.parametrize(("role", "state", "peer", "expected", "rule"), CASES)
def test_each_peer_state_in_each_state(
    role: Role, state: State, peer: State, expected: State, rule: str
) -> None:
    """BSTAR-05 to BSTAR-08, BSTAR-11, BSTAR-13, BSTAR-15."""
    m = machine(role, state)
    assert state_of(m) is state
    other = Role.BACKUP if role is Role.PRIMARY else Role.PRIMARY
    m.peer_state(other, peer, 0.5)
    assert state_of(m) is expected
    assert serving(m) == (expected is State.ACTIVE)
    events = m.take_events()
    if expected is not state:
        [event] = events
        assert (event.old, event.new, event.rule, event.serving) == (
            state,
            expected,
            rule,
            expected is State.ACTIVE,
        )
    else:
        assert events == []
        assert TRANSITIONS[(state, PEER_EVENTS[peer])][1] == rule


def test_a_backup_gets_to_active_only_through_passive() -> None:
    """BSTAR-07, BSTAR-10: backup -> passive (primary active) -> active (silent + client)."""
    m = PairMachine(PairConfig(Role.BACKUP, heartbeat=BEAT), 0.0)
    beat(m, 5.0)
    assert not m.client_request(5.0)  # a backup alone never serves
    assert state_of(m) is State.BACKUP
    m.peer_state(Role.PRIMARY, State.ACTIVE, 5.0)
    assert state_of(m) is State.PASSIVE
    [passive] = m.take_events()
    assert (passive.rule, passive.serving) == ("BSTAR-07", False)
    beat(m, 6.0)
    assert not m.client_request(6.999)  # the peer was heard at 5.0: alive until 7.0
    assert state_of(m) is State.PASSIVE
    beat(m, 7.0)
    assert m.client_request(7.0)  # silent at exactly 2 x heartbeat (BSTAR-04)
    assert state_of(m) is State.ACTIVE
    assert serving(m)
    [event] = m.take_events()
    assert (event.rule, event.new, event.now) == ("BSTAR-10", State.ACTIVE, 7.0)


def test_a_silent_peer_alone_does_not_make_a_passive_broker_active() -> None:
    """BSTAR-10: without a client, nothing changes however long the peer is silent."""
    m = machine(Role.BACKUP, State.PASSIVE)
    for now in (1.0, 2.0, 10.0, 100.0):
        m.tick(now)
    assert state_of(m) is State.PASSIVE
    m.observe(101.0)  # a worker's message is no vote
    assert not serving(m)


def test_a_primary_alone_waits_one_expiry_before_serving() -> None:
    """BSTAR-09."""
    m = PairMachine(PairConfig(Role.PRIMARY, heartbeat=BEAT), 10.0)
    beat(m, 11.0)
    assert not m.client_request(11.999)
    assert state_of(m) is State.PRIMARY
    beat(m, 12.0)
    assert m.client_request(12.0)
    assert state_of(m) is State.ACTIVE
    [event] = m.take_events()
    assert event.rule == "BSTAR-09"


def test_a_restarted_primary_does_not_serve_beside_an_active_backup() -> None:
    """BSTAR-06, BSTAR-09: it hears the backup active before its wait ends, and yields."""
    m2 = PairMachine(PairConfig(Role.PRIMARY, heartbeat=BEAT), 0.0)
    m2.peer_state(Role.BACKUP, State.ACTIVE, 0.5)
    m2.peer_state(Role.BACKUP, State.ACTIVE, 1.5)
    assert not m2.client_request(1.6)
    assert state_of(m2) is State.PASSIVE


def test_an_active_broker_serves_its_clients() -> None:
    m = machine(Role.PRIMARY, State.ACTIVE)
    assert all(m.client_request(t) for t in (0.1, 0.2, 0.3))


def test_same_roles_never_serve() -> None:
    """BSTAR-14."""
    m = machine(Role.PRIMARY, State.ACTIVE)
    m.peer_state(Role.PRIMARY, State.PRIMARY, 0.5)
    assert state_of(m) is State.PASSIVE
    assert not serving(m)
    [event] = m.take_events()
    assert event.rule == "BSTAR-14"
    b = PairMachine(PairConfig(Role.BACKUP, heartbeat=BEAT), 0.0)
    b.peer_state(Role.BACKUP, State.BACKUP, 0.5)
    assert state_of(b) is State.BACKUP
    assert not b.client_request(0.6)


def test_a_frozen_active_broker_stops_serving_until_it_hears_its_peer() -> None:
    """BSTAR-12: SIGSTOPped for longer than the peer's patience, then resumed."""
    m = machine(Role.PRIMARY, State.ACTIVE)
    assert m.tick(0.0)
    assert m.client_request(0.9)
    # Not run from 0.9 to 3.0 (> 2 x heartbeat): the first input after the gap is a client's.
    assert not m.client_request(3.0)
    assert not serving(m)
    [event] = m.take_events()
    assert (event.rule, event.serving) == ("BSTAR-12", False)
    # What the peer said while this one was stopped is stale: within a heartbeat of waking,
    # a message changes nothing (it might be the backup's old "passive").
    m.peer_state(Role.BACKUP, State.PASSIVE, 3.1)
    assert not serving(m)
    assert state_of(m) is State.ACTIVE
    # A heartbeat after waking, the backup's news: it took over. This primary yields.
    m.peer_state(Role.BACKUP, State.ACTIVE, 4.0)
    assert state_of(m) is State.PASSIVE
    assert not m.client_request(4.2)


def test_a_frozen_broker_whose_peer_is_still_passive_serves_again_when_it_hears_it() -> None:
    """BSTAR-12: the peer did not take over (no client came): back to serving."""
    m = machine(Role.PRIMARY, State.ACTIVE)
    m.observe(0.5)
    m.observe(3.0)  # the gap
    assert not serving(m)
    m.peer_state(Role.BACKUP, State.PASSIVE, 4.0)  # a heartbeat after waking: news
    assert serving(m)
    assert m.client_request(4.1)


def test_a_frozen_broker_whose_peer_stays_silent_serves_after_a_full_expiry() -> None:
    """BSTAR-12: the peer is gone for good: serve again 2 x heartbeat after waking."""
    m = machine(Role.PRIMARY, State.ACTIVE)
    m.observe(0.5)
    assert not m.client_request(3.0)
    assert not m.client_request(4.999)
    assert m.client_request(5.0)
    assert serving(m)


def test_a_gap_is_counted_from_the_last_state_sent_not_the_last_input() -> None:
    """BSTAR-12: clients kept coming, but the state went unsent for 2 x heartbeat: the peer may
    have found this broker silent, so it is a gap; just under it is not."""
    m = machine(Role.PRIMARY, State.ACTIVE)
    assert m.tick(0.0)  # state sent at 0.0
    for now in (0.5, 1.0, 1.5, 1.999):
        assert m.client_request(now)  # inputs, but no tick: nothing sent since 0.0
    assert not m.client_request(2.0)
    [event] = m.take_events()
    assert (event.rule, event.serving) == ("BSTAR-12", False)
    assert "state unsent for 2 s" in event.reason


def test_a_frozen_passive_broker_does_not_take_its_stale_view_for_silence() -> None:
    """BSTAR-12, BSTAR-10: stopped while passive, resumed with a client waiting: the primary's
    last message is old, but that is no proof of its silence: a fresh expiry first."""
    m = machine(Role.BACKUP, State.PASSIVE)
    beat(m, 1.0)
    m.peer_state(Role.PRIMARY, State.ACTIVE, 1.0)
    assert not m.client_request(10.0)  # 9 s of nothing: a gap of its own, not the peer's
    assert state_of(m) is State.PASSIVE
    beat(m, 11.0)
    m.peer_state(Role.PRIMARY, State.ACTIVE, 11.5)  # the primary is alive after all
    beat(m, 13.0)
    assert not m.client_request(13.0)
    beat(m, 14.0)
    assert m.client_request(14.0)  # silent since 11.5 + 2: now the vote counts
    assert state_of(m) is State.ACTIVE


def test_tick_says_when_to_publish() -> None:
    """BSTAR-03: at once, then every heartbeat."""
    m = PairMachine(PairConfig(Role.PRIMARY, heartbeat=0.25), 0.0)
    assert m.tick(0.0)
    assert not m.tick(0.2)
    assert m.next_deadline() == 0.25
    assert m.tick(0.25)
    assert m.message() == [b"domo-bstar/1 primary primary"]


def test_state_messages_round_trip_and_garbage_is_none() -> None:
    """BSTAR-03, BSTAR-16."""
    for role, state in itertools.product(Role, State):
        assert decode_state(encode_state(role, state)) == (role, state)
    for bad in (
        [],
        [b"domo-bstar/1", b"primary"],
        [b"x", b"primary", b"active"],
        [b"domo-bstar/1", b"leader", b"active"],
        [b"domo-bstar/1", b"primary", b"\xff"],
    ):
        assert decode_state(bad) is None  # fmt: skip


def test_time_must_not_go_backwards() -> None:
    m = machine(Role.PRIMARY, State.ACTIVE, now=5.0)
    with pytest.raises(LocalProtocolError):
        m.client_request(4.0)


def test_heartbeat_must_be_positive() -> None:
    with pytest.raises(ValueError, match="heartbeat"):
        PairConfig(Role.PRIMARY, heartbeat=0)
