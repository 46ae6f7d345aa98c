"""The broker acts on a dialect's capabilities, not just declares them (specs/family.md).

No dialect domo ships lacks heartbeats, DISCONNECT or MMI (the ones to come do), so these tests
play a dialect of their own, ``quiet``, in several variants registered in a broker's own
``Registry``: an MDP/0.2 peer behind a leading empty frame and a header of the variant's own
(``"", "Q…W", command, ...`` for a worker, ``"", "Q…C", 0x01, service, body`` for a client),
whose capabilities turn one thing off at a time. Each test has an MDP/0.2 peer beside the
dialect's as the control: what it gets is MDP/0.2's rules, unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import Enum

import pytest

from domo.protocol import BrokerConfig
from domo.protocol.broker import (
    WORKER_TRANSITIONS,
    Action,
    PeerState,
    PeerTraits,
    WorkerInput,
    worker_transitions_for,
)
from domo.protocol.dialects import (
    DETECTION_ORDER,
    MDPC02,
    MDPW02,
    REGISTRY,
    Capabilities,
    CoreCommand,
    Dialect,
    DialectCodec,
    Invalid,
    Lookup,
    Registry,
    Role,
    RouteView,
)
from domo.protocol.dialects.mdp02 import (
    CLIENT_COMMANDS,
    WORKER_COMMANDS,
    command_of,
    decode_client,
    decode_worker,
    to_frames,
)
from domo.protocol.events import (
    MmiReplied,
    ProtocolViolation,
    RequestExpired,
    RequestQueued,
    WorkerDisconnected,
    WorkerExpired,
)
from domo.protocol.family import FamilyBroker, peer_key, traits_of
from domo.protocol.mdp import BodyFrame, Relayed

from .mdp_strategies import plain

INTERVAL, LIVENESS, EXPIRY = 1.0, 3, 10.0
CONFIG = BrokerConfig(heartbeat_interval=INTERVAL, liveness=LIVENESS, request_expiry=EXPIRY)
SPAN = INTERVAL * LIVENESS
HEARTBEAT_02 = (MDPW02, b"\x05")
DISCONNECT_02 = (MDPW02, b"\x06")


class Quiet(Enum):
    NO_BROKER_HEARTBEAT = "quiet-nbh"
    NO_WORKER_HEARTBEAT = "quiet-nwh"
    NO_HEARTBEATS = "quiet-nhb"
    NO_DISCONNECT = "quiet-ndc"
    NO_MMI = "quiet-nmmi"
    ALL = "quiet-all"


FULL = Capabilities(
    clients=True,
    workers=True,
    partial_replies=True,
    worker_heartbeats=True,
    broker_heartbeats=True,
    disconnect=True,
    mmi=True,
    outstanding_per_client=1,
    client_hops=False,
)
OFF = {
    Quiet.NO_BROKER_HEARTBEAT: {"broker_heartbeats": False},
    Quiet.NO_WORKER_HEARTBEAT: {"worker_heartbeats": False},
    Quiet.NO_HEARTBEATS: {"broker_heartbeats": False, "worker_heartbeats": False},
    Quiet.NO_DISCONNECT: {"disconnect": False},
    Quiet.NO_MMI: {"mmi": False},
    Quiet.ALL: {},
}


def headers(variant: Quiet) -> tuple[bytes, bytes]:
    """The variant's worker and client headers: ``Q`` + its index + ``W`` or ``C``."""
    index = list(Quiet).index(variant)
    return b"Q%dW" % index, b"Q%dC" % index


def codec(variant: Quiet) -> DialectCodec:
    worker_header, client_header = headers(variant)

    def claims(header: BodyFrame, command: BodyFrame) -> Role | None:
        if header == worker_header:
            return Role.WORKER
        return Role.CLIENT if header == client_header else None

    def decode(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
        # RFC 18's layout and codes behind its own headers (the MDP kin's shared reading).
        code = message[1] if len(message) > 1 else b""
        if message[0] == worker_header:
            return decode_worker(message, command_of(WORKER_COMMANDS, code))
        return decode_client(message, command_of(CLIENT_COMMANDS, code), 2)

    def encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed:
        header = worker_header if command.role is Role.WORKER else client_header
        return (b"", header, *to_frames(command)[1:])

    capabilities = dataclasses.replace(FULL, **OFF[variant])
    return DialectCodec(variant, capabilities, claims, decode, encode)


def broker() -> FamilyBroker:
    return FamilyBroker(CONFIG, Registry((*DETECTION_ORDER, *map(codec, Quiet))))


def ready(variant: Quiet, service: bytes = b"echo") -> list[BodyFrame]:
    return [b"", headers(variant)[0], b"\x01", service]


def key(variant: Quiet, routing_id: bytes) -> bytes:
    return peer_key(routing_id, (), variant)


def sent(made: FamilyBroker) -> list[tuple[bytes, tuple[bytes, ...]]]:
    """What the broker sends, as a runtime's flush takes it (``flushed`` included)."""
    out = [(peer, plain(frames)) for _, peer, frames in made.take_outgoing()]
    made.flushed()
    return out


def heartbeats_until(
    made: FamilyBroker, until: float, keep_alive: Sequence[tuple[bytes, list[BodyFrame]]] = ()
) -> dict[bytes, int]:
    """Tick every tenth of an interval up to ``until``; HEARTBEATs sent, per routing id. Every
    0.9 intervals, each of ``keep_alive`` (routing id, its HEARTBEAT) says it is alive."""
    counts: dict[bytes, int] = {}
    steps = round(until / (INTERVAL / 10))
    for step in range(1, steps + 1):
        now = step * INTERVAL / 10
        if step % 9 == 0:
            for peer, heartbeat in keep_alive:
                made.receive(peer, heartbeat, now)
        made.tick(now)
        for peer, frames in sent(made):
            if len(frames) <= 3 and frames[-1] == b"\x05":  # HEARTBEAT, in 0.2's code here
                counts[peer] = counts.get(peer, 0) + 1
    return counts


def test_no_heartbeat_to_a_worker_whose_dialect_broker_does_not_heartbeat() -> None:
    """FAM-01: no HEARTBEAT to it, ever; it is still expired when silent (MDP-H-05)."""
    made = broker()
    made.receive(b"Q", ready(Quiet.NO_BROKER_HEARTBEAT), 0.0)
    made.receive(b"M", [MDPW02, b"\x01", b"echo"], 0.0)
    sent(made)
    keep_alive: list[
        tuple[bytes, list[BodyFrame]]
    ] = [  # both workers keep talking, so neither expires while the clock runs
        (b"Q", [b"", headers(Quiet.NO_BROKER_HEARTBEAT)[0], b"\x05"]),
        (b"M", list(HEARTBEAT_02)),
    ]
    # Past one liveness span, so that the dialect worker's liveness timer fires while it is
    # alive: it must not send a HEARTBEAT then either.
    counts = heartbeats_until(made, 2 * SPAN - 0.2, keep_alive)
    assert counts == {b"M": 5}  # at 1.0 ... 5.0, to the MDP/0.2 worker only
    events = made.tick(5.4 + SPAN)  # the last keep-alive was at 5.4
    expired = [e.worker for e in events if isinstance(e, WorkerExpired)]
    assert sorted(expired) == sorted([key(Quiet.NO_BROKER_HEARTBEAT, b"Q"), b"M"])


def test_a_worker_whose_dialect_does_not_heartbeat_is_not_expired_for_silence() -> None:
    """FAM-02: silent for ten liveness spans and still registered, and still served; the broker
    still heartbeats it (FAM-01: its broker does)."""
    made = broker()
    made.receive(b"Q", ready(Quiet.NO_WORKER_HEARTBEAT), 0.0)
    made.receive(b"M", [MDPW02, b"\x01", b"other"], 0.0)
    sent(made)
    quiet = key(Quiet.NO_WORKER_HEARTBEAT, b"Q")
    assert made.workers()[quiet].expires_at == float("inf")
    counts = heartbeats_until(made, 10 * SPAN)
    assert counts[b"Q"] in (29, 30)  # one each interval (the last may fall on a rounded tick)
    assert b"M" not in made.workers()  # the MDP/0.2 control expired at 3.0 (MDP-H-05)
    assert quiet in made.workers()
    made.receive(b"C", [MDPC02, b"\x01", b"echo", b"hi"], 31.0)
    requests = [(peer, frames) for peer, frames in sent(made) if frames[2] != b"\x05"]
    assert requests == [
        (b"Q", (b"", headers(Quiet.NO_WORKER_HEARTBEAT)[0], b"\x02", b"C", b"", b"hi"))
    ]


def test_a_dialect_with_no_heartbeats_has_no_timer_at_all() -> None:
    """FAM-01, FAM-02: nothing is sent and nothing expires; no deadline is kept for it."""
    made = broker()
    made.receive(b"Q", ready(Quiet.NO_HEARTBEATS), 0.0)
    sent(made)
    assert made.next_deadline() is None
    assert heartbeats_until(made, 5 * SPAN) == {}
    assert key(Quiet.NO_HEARTBEATS, b"Q") in made.workers()


def test_no_disconnect_to_a_dialect_without_it() -> None:
    """FAM-03: READY twice (MDP-W-10) drops the worker without a DISCONNECT; the events say so.
    The MDP/0.2 control gets its DISCONNECT."""
    made = broker()
    quiet = key(Quiet.NO_DISCONNECT, b"Q")
    made.receive(b"Q", ready(Quiet.NO_DISCONNECT), 0.0)
    made.receive(b"M", [MDPW02, b"\x01", b"echo"], 0.0)
    sent(made)
    events = made.receive(b"Q", ready(Quiet.NO_DISCONNECT), 0.1)
    events += made.receive(b"M", [MDPW02, b"\x01", b"echo"], 0.1)
    assert [(e.peer, e.rule, e.action) for e in events if isinstance(e, ProtocolViolation)] == [
        (quiet, "MDP-W-10", "dropped"),
        (b"M", "MDP-W-10", "disconnected"),
    ]
    assert [(e.worker, e.disconnect_sent) for e in events if isinstance(e, WorkerDisconnected)] == [
        (quiet, False),
        (b"M", True),
    ]
    assert sent(made) == [(b"M", DISCONNECT_02)]
    assert made.core.worker_state(quiet).value == "silenced"  # dropped all the same


def test_no_disconnect_at_shutdown_to_a_dialect_without_it() -> None:
    """FAM-03 at a graceful stop (MDP-W-14)."""
    made = broker()
    made.receive(b"Q", ready(Quiet.NO_DISCONNECT), 0.0)
    made.receive(b"R", ready(Quiet.ALL), 0.0)
    sent(made)
    events = made.shutdown(0.5)
    assert sorted(
        (e.worker, e.disconnect_sent) for e in events if isinstance(e, WorkerDisconnected)
    ) == sorted([(key(Quiet.NO_DISCONNECT, b"Q"), False), (key(Quiet.ALL, b"R"), True)])
    assert sent(made) == [(b"R", (b"", headers(Quiet.ALL)[0], b"\x06"))]


def test_mmi_only_for_a_dialect_that_has_it() -> None:
    """FAM-04: a client without MMI asking mmi.service is queued like any request and expires
    (no worker may register mmi.*, MDP-D-14); a client with MMI is answered at once."""
    made = broker()
    made.receive(b"W", [MDPW02, b"\x01", b"echo"], 0.0)
    sent(made)
    no_mmi, with_mmi = headers(Quiet.NO_MMI)[1], headers(Quiet.ALL)[1]
    events = made.receive(b"A", [b"", no_mmi, b"\x01", b"mmi.service", b"echo"], 0.1)
    assert [type(e) for e in events] == [RequestQueued]
    events = made.receive(b"B", [b"", with_mmi, b"\x01", b"mmi.service", b"echo"], 0.1)
    assert [(type(e), e.status) for e in events if isinstance(e, MmiReplied)] == [
        (MmiReplied, b"200")
    ]
    assert sent(made) == [(b"B", (b"", with_mmi, b"\x03", b"mmi.service", b"200"))]
    events = made.tick(0.1 + EXPIRY)
    assert [e.client for e in events if isinstance(e, RequestExpired)] == [key(Quiet.NO_MMI, b"A")]


def test_traits_follow_the_capabilities_and_the_shipped_dialects_keep_mdp02_rules() -> None:
    """FAM-01..04, FAM-09 read from Capabilities; MDP/0.1 and majortomo workers and clients
    keep MDP/0.2's heartbeats, DISCONNECT and MMI, but are silent while busy (MDP01-12,
    MAJ-08; specs/mdp-0.1.md, specs/majortomo.md)."""
    assert traits_of(codec(Quiet.NO_HEARTBEATS).capabilities) == PeerTraits(
        heartbeats_expected=False, heartbeats_sent=False, neutral=True
    )
    assert traits_of(codec(Quiet.NO_MMI).capabilities) == PeerTraits(mmi=False, neutral=True)
    # Every peer known by a key is neutral (FAM-10); MDP/0.2's own rules otherwise.
    assert traits_of(REGISTRY.by_dialect[Dialect.MDP02].capabilities) == PeerTraits(neutral=True)
    for shipped in (Dialect.MDP01, Dialect.MAJORTOMO):  # FAM-09: silent while busy
        expected = PeerTraits(busy_heartbeats=False, neutral=True)
        assert traits_of(REGISTRY.by_dialect[shipped].capabilities) == expected, shipped


@pytest.mark.parametrize(
    ("traits", "rule", "changes"),
    [
        (PeerTraits(heartbeats_sent=False), "FAM-01", Action.SEND_HEARTBEAT),
        (PeerTraits(heartbeats_expected=False), "FAM-02", None),
        (PeerTraits(disconnect=False), "FAM-03", Action.SEND_DISCONNECT),
    ],
)
def test_a_dialects_worker_table_is_mdp02s_with_its_capabilities_applied(
    traits: PeerTraits, rule: str, changes: Action | None
) -> None:
    """FAM-01..03 as data: the cells a capability changes, and nothing else."""
    table = worker_transitions_for(traits)
    assert set(table) == set(WORKER_TRANSITIONS)
    registered = (PeerState.IDLE, PeerState.BUSY)
    for (state, input_), base in WORKER_TRANSITIONS.items():
        cell = table[state, input_]
        if changes is not None:
            touched = changes in base.actions
            expected_actions = tuple(a for a in base.actions if a is not changes)
            expected_after = base.next_state
        else:  # FAM-02: a registered worker's liveness ending changes nothing
            touched = state in registered and input_ is WorkerInput.EXPIRED
            expected_actions, expected_after = (), state
        if not touched:
            assert cell == base, (state, input_)
            continue
        assert cell.amended_by == rule, (state, input_)
        assert cell.actions == expected_actions
        assert cell.next_state == expected_after
        assert (cell.rule, cell.violation) == (base.rule, base.violation)
    assert worker_transitions_for(PeerTraits()) is WORKER_TRANSITIONS


def test_with_every_capability_off_each_cell_names_every_rule_that_changed_it() -> None:
    """FAM-01, FAM-02, FAM-03 together."""
    table = worker_transitions_for(
        PeerTraits(heartbeats_expected=False, heartbeats_sent=False, disconnect=False)
    )
    amended = {cell.amended_by for cell in table.values()}
    assert amended == {None, "FAM-01", "FAM-02", "FAM-03"}
    assert all(Action.SEND_DISCONNECT not in c.actions for c in table.values())
    assert all(Action.SEND_HEARTBEAT not in c.actions for c in table.values())


def test_fam_09_a_busy_majortomo_worker_gets_the_busy_worker_timeout() -> None:
    """FAM-09, MAJ-08, MDP01-12: a majortomo worker silent while busy is not expired after the
    liveness span (3 s here) but at exactly ``busy_worker_timeout`` (20 s) after it was last
    heard, as busy, and its request goes to the next worker; idle again, it is held to the
    liveness span as before."""
    from domo.protocol.events import RequestRedispatched, WorkerExpired
    from domo.protocol.family import FamilyBroker

    config = BrokerConfig(heartbeat_interval=1.0, liveness=3, busy_worker_timeout=20.0)
    broker = FamilyBroker(config)
    broker.receive(b"M", [b"", b"MDPW02", b"\x01", b"slow"], 0.0)  # majortomo's READY
    broker.receive(b"C", [b"MDPC02", b"\x01", b"slow", b"job"], 1.0)
    [request] = [f for _, _, f in broker.take_outgoing() if f[2] == b"\x02"]
    assert bytes(request[3]) == b"C"
    m = peer_key(b"M", (), Dialect.MAJORTOMO)
    assert broker.workers()[m].expires_at == 20.0  # last heard at 0.0, its READY
    for now in (2.0, 5.0, 10.0, 19.9):
        assert not [e for e in broker.tick(now) if isinstance(e, WorkerExpired)]
    assert list(broker.workers()) == [m]
    broker.receive(b"W", [b"MDPW02", b"\x01", b"slow"], 19.95)  # an MDP/0.2 worker waits
    events = broker.tick(20.0)
    assert [(e.worker, e.busy) for e in events if isinstance(e, WorkerExpired)] == [(m, True)]
    assert [e.lost_worker for e in events if isinstance(e, RequestRedispatched)] == [m]
    sent = [(to, f) for _, to, f in broker.take_outgoing() if f[1] == b"\x02"]
    assert sent == [(b"W", (b"MDPW02", b"\x02", b"C", b"", b"job"))]
    # Idle, a majortomo worker is held to the liveness span (MAJ-06).
    broker.receive(b"N", [b"", b"MDPW02", b"\x01", b"other"], 30.0)
    n = peer_key(b"N", (), Dialect.MAJORTOMO)
    assert broker.workers()[n].expires_at == 33.0
    assert [e.busy for e in broker.tick(33.0) if isinstance(e, WorkerExpired)] == [False]
