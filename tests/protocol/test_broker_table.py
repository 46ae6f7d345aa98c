"""Every cell of the broker's worker-side transition table, driven through the public API.

``WORKER_TRANSITIONS`` (``domo.protocol.broker``) is data: for each (PeerState, WorkerInput) it
names the next state, the actions and the rule of ``specs/mdp-0.2.md`` that decides it. This file
checks, in the manner of h2's ``tests/test_state_machines.py``, that the broker does what each cell
says: a fresh broker is brought to a scene where the peer ``P`` is in the cell's state, the input
is applied the way the outside world applies it (a message through ``receive``, a timer by
advancing time to its exact boundary, I/O feedback through ``peer_unreachable`` /
``peer_congested``), and then the peer's state, the whole outbox and the events are compared with
what the cell's actions imply.

Each state is reached in several ways (``SCENES``), because a state is a promise about the future
whatever the road that led to it: a peer silenced for sending DISCONNECT, for being kicked, for
expiring or for speaking garbage must all behave alike.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from domo.protocol.broker import (
    WORKER_TRANSITIONS,
    Action,
    Broker,
    BrokerConfig,
    PeerState,
    Transition,
    WorkerInput,
)
from domo.protocol.events import (
    BrokerEvent,
    MessageDropped,
    PartialForwarded,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestRedispatched,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)

INTERVAL = 1.0
LIVENESS = 3
SPAN = LIVENESS * INTERVAL
CONFIG = BrokerConfig(
    heartbeat_interval=INTERVAL, liveness=LIVENESS, request_expiry=100.0, max_redispatches=2
)

W = b"MDPW02"
C = b"MDPC02"
P = b"P"  # the peer whose state the cell is about
OTHER = b"W2"  # another worker of the same service, idle, ready to take a re-dispatch
CLIENT = b"C1"
SERVICE = b"echo"
READY = (W, b"\x01", SERVICE)
HEARTBEAT = (W, b"\x05")
DISCONNECT = (W, b"\x06")


def body() -> tuple[bytes, bytes]:
    """A fresh two-frame body (new objects, so identity checks mean something: MDP-S-03)."""
    return (b"hello-" + str(id(object())).encode(), b"world")


@dataclass
class Scene:
    """A broker with ``P`` in some state, its outbox drained, at time ``now``.

    Nothing is due before ``now + INTERVAL / 2``: a message input is applied at that time.
    """

    broker: Broker
    now: float
    state: PeerState
    request_body: tuple[bytes, ...] | None = None  # the client's request, if any
    busy: bool = False  # P is handling the client's request
    queued: bool = False  # the client's request waits in the queue
    other_idle: bool = False  # OTHER is registered and idle
    silenced_at: float | None = None  # when P's current silence began
    timeline: list[str] = field(default_factory=list)

    def send(self, peer: bytes, frames: tuple[bytes, ...], now: float) -> list[BrokerEvent]:
        events = self.broker.receive(peer, list(frames), now)
        self.now = now
        return events


def _client_request(scene: Scene, now: float) -> None:
    scene.request_body = body()
    scene.send(CLIENT, (C, b"\x01", SERVICE, *scene.request_body), now)


def _settle(scene: Scene) -> Scene:
    scene.broker.take_outgoing()
    assert scene.broker.worker_state(P) is scene.state, scene.timeline
    return scene


def unknown_fresh() -> Scene:
    """P never spoke; a client request waits for a worker."""
    scene = Scene(Broker(CONFIG), 0.0, PeerState.UNKNOWN, queued=True)
    _client_request(scene, 0.0)
    return _settle(scene)


def unknown_forgotten() -> Scene:
    """P was silenced, stayed quiet for the whole span and was forgotten (MDP-D-06)."""
    scene = Scene(Broker(CONFIG), 0.0, PeerState.UNKNOWN, queued=True)
    scene.send(P, READY, 0.0)
    scene.send(P, DISCONNECT, 0.0)
    scene.broker.tick(SPAN)
    _client_request(scene, SPAN)
    return _settle(scene)


def idle() -> Scene:
    """P registered first, then OTHER; no requests."""
    scene = Scene(Broker(CONFIG), 0.0, PeerState.IDLE, other_idle=True)
    scene.send(P, READY, 0.0)
    scene.send(OTHER, READY, INTERVAL / 4)
    return _settle(scene)


def busy() -> Scene:
    """P handles the client's request; OTHER registered afterwards and is idle."""
    scene = Scene(Broker(CONFIG), 0.0, PeerState.BUSY, busy=True, other_idle=True)
    scene.send(P, READY, 0.0)
    _client_request(scene, 0.0)
    scene.send(OTHER, READY, INTERVAL / 4)
    return _settle(scene)


def _silenced(how: Callable[[Scene], None]) -> Callable[[], Scene]:
    def make() -> Scene:
        scene = Scene(Broker(CONFIG), 0.0, PeerState.SILENCED, queued=True)
        how(scene)
        scene.silenced_at = scene.now
        _client_request(scene, scene.now)
        return _settle(scene)

    make.__name__ = f"silenced_{how.__name__}"
    make.__doc__ = how.__doc__
    return make


def _sent_disconnect(scene: Scene) -> None:
    """P registered, then sent DISCONNECT (MDP-W-13)."""
    scene.send(P, READY, 0.0)
    scene.send(P, DISCONNECT, 0.0)


def _kicked(scene: Scene) -> None:
    """P sent READY twice and was told DISCONNECT (MDP-W-10, MDP-W-15)."""
    scene.send(P, READY, 0.0)
    scene.send(P, READY, 0.0)
    assert scene.broker.take_outgoing() == [(P, DISCONNECT)]


def _expired(scene: Scene) -> None:
    """P registered and never spoke again: expired (MDP-H-05)."""
    scene.send(P, READY, 0.0)
    scene.broker.tick(SPAN)
    scene.now = SPAN


def _invalid(scene: Scene) -> None:
    """P registered, then sent a malformed message (MDP-W-16)."""
    scene.send(P, READY, 0.0)
    scene.send(P, (W, b"\x05", b"extra"), 0.0)


def _stranger_invalid(scene: Scene) -> None:
    """P never registered and sent a malformed worker message: READY without its service
    frame (MDP-W-01, MDP-W-16)."""
    scene.send(P, (W, b"\x01"), 0.0)


SCENES: dict[PeerState, list[Callable[[], Scene]]] = {
    PeerState.UNKNOWN: [unknown_fresh, unknown_forgotten],
    PeerState.IDLE: [idle],
    PeerState.BUSY: [busy],
    PeerState.SILENCED: [
        _silenced(how) for how in (_sent_disconnect, _kicked, _expired, _invalid, _stranger_invalid)
    ],
}

MESSAGE_INPUTS: dict[WorkerInput, Callable[[], tuple[bytes, ...]]] = {
    WorkerInput.READY: lambda: READY,
    WorkerInput.READY_RESERVED: lambda: (W, b"\x01", b"mmi.echo"),
    WorkerInput.HEARTBEAT: lambda: HEARTBEAT,
    WorkerInput.PARTIAL: lambda: (W, b"\x03", CLIENT, b"", *body()),
    WorkerInput.FINAL: lambda: (W, b"\x04", CLIENT, b"", *body()),
    WorkerInput.FOREIGN_REPLY: lambda: (W, b"\x04", b"C9", b"", *body()),
    WorkerInput.REQUEST: lambda: (W, b"\x02", CLIENT, b"", *body()),
    WorkerInput.DISCONNECT: lambda: DISCONNECT,
    # A near miss: a FINAL whose delimiter frame is not empty (MDP-R-02).
    WorkerInput.INVALID: lambda: (W, b"\x04", CLIENT, b"x", *body()),
}
FEEDBACK_INPUTS = (WorkerInput.UNREACHABLE, WorkerInput.CONGESTED)
TIMER_INPUTS = (WorkerInput.EXPIRED, WorkerInput.HEARTBEAT_DUE, WorkerInput.SILENCE_OVER)

DISCONNECT_REASON = {
    WorkerInput.DISCONNECT: "worker-disconnect",
    WorkerInput.INVALID: "invalid-message",
    WorkerInput.UNREACHABLE: "unreachable",
    WorkerInput.CONGESTED: "congested",
}


def _case_id(case: object) -> str:
    if isinstance(case, WorkerInput):
        return case.name
    return getattr(case, "__name__", str(case))


def test_table_is_total() -> None:
    """Every (state, input) pair has exactly one cell: the broker never meets an unplanned case."""
    pairs = set(itertools.product(PeerState, WorkerInput))
    assert set(WORKER_TRANSITIONS) == pairs
    assert len(WORKER_TRANSITIONS) == len(PeerState) * len(WorkerInput)
    assert set(MESSAGE_INPUTS) | set(FEEDBACK_INPUTS) | set(TIMER_INPUTS) == set(WorkerInput)


def test_table_keeps_the_spec_promises() -> None:
    """Properties every cell must have, whatever the table says elsewhere.

    MDP-W-14: DISCONNECT only to a peer that has just said something (never on a timer or on
    I/O feedback). MDP-D-06: a silenced peer is sent nothing but, on READY, a new conversation.
    MDP-D-07: an expired worker is sent nothing. MDP-W-15: every DISCONNECT is followed by
    silence. MDP-H-03: heartbeats come only from the timer.
    """
    for (state, input_), cell in WORKER_TRANSITIONS.items():
        sends = {Action.SEND_DISCONNECT, Action.SEND_HEARTBEAT} & set(cell.actions)
        if Action.SEND_DISCONNECT in cell.actions:
            assert input_ in MESSAGE_INPUTS, (state, input_)
            assert cell.next_state is PeerState.SILENCED, (state, input_)
            assert cell.violation, (state, input_)
        if Action.SEND_HEARTBEAT in cell.actions:
            assert input_ is WorkerInput.HEARTBEAT_DUE, (state, input_)
        if state is PeerState.SILENCED and input_ is not WorkerInput.READY_RESERVED:
            assert not sends, (state, input_)
        if state is PeerState.UNKNOWN or input_ in (WorkerInput.EXPIRED, *FEEDBACK_INPUTS):
            assert Action.SEND_HEARTBEAT not in cell.actions, (state, input_)
        if input_ in (WorkerInput.EXPIRED, *FEEDBACK_INPUTS):
            assert not sends, (state, input_)
        assert cell.rule.startswith("MDP-"), (state, input_)


SpecCell = tuple[PeerState, bool, str | None, bool]  # next state, DISCONNECT, violation, HEARTBEAT


def spec_cell(state: PeerState, input_: WorkerInput) -> SpecCell:
    """What specs/mdp-0.2.md says a cell must do, read independently of the table.

    Returns the state after the input (before any dispatch), whether DISCONNECT is sent, the
    rule of the ``ProtocolViolation`` if the input is one, and whether a HEARTBEAT is sent.
    """
    S, In = PeerState, WorkerInput
    registered = state in (S.IDLE, S.BUSY)
    if input_ in (In.EXPIRED, In.HEARTBEAT_DUE, In.SILENCE_OVER):
        if registered and input_ is In.EXPIRED:
            return (S.SILENCED, False, None, False)  # MDP-H-05, MDP-D-07: nothing sent
        if registered and input_ is In.HEARTBEAT_DUE:
            return (state, False, None, True)  # MDP-H-04
        if state is S.SILENCED and input_ is In.SILENCE_OVER:
            return (S.UNKNOWN, False, None, False)  # MDP-D-06
        return (state, False, None, False)  # MDP-D-03: no such timer in this state
    if input_ in (In.UNREACHABLE, In.CONGESTED):
        return (S.SILENCED if registered else state, False, None, False)  # MDP-D-15
    if state is S.SILENCED:
        if input_ is In.READY:
            return (S.IDLE, False, None, False)  # MDP-D-06: READY opens a new conversation
        if input_ is In.READY_RESERVED:
            return (S.SILENCED, True, "MDP-D-14", False)
        return (S.SILENCED, False, None, False)  # MDP-D-06: dropped, no second DISCONNECT
    if state is S.UNKNOWN:
        return {
            In.READY: (S.IDLE, False, None, False),  # MDP-W-09
            In.READY_RESERVED: (S.SILENCED, True, "MDP-D-14", False),
            In.HEARTBEAT: (S.SILENCED, True, "MDP-H-01", False),
            In.DISCONNECT: (S.SILENCED, False, None, False),  # MDP-W-12
            In.INVALID: (S.SILENCED, False, "MDP-W-16", False),
        }.get(input_, (S.SILENCED, True, "MDP-W-15", False))
    if input_ in (In.READY, In.READY_RESERVED):
        return (S.SILENCED, True, "MDP-W-10", False)
    if input_ is In.HEARTBEAT:
        return (state, False, None, False)  # MDP-H-02
    if input_ is In.DISCONNECT:
        return (S.SILENCED, False, None, False)  # MDP-W-13
    if input_ is In.INVALID:
        return (S.SILENCED, False, "MDP-W-16", False)
    if input_ is In.REQUEST or state is S.IDLE:
        return (S.SILENCED, True, "MDP-W-15", False)
    if input_ is In.FOREIGN_REPLY:
        return (S.SILENCED, True, "MDP-D-13", False)
    return (S.BUSY if input_ is In.PARTIAL else S.IDLE, False, None, False)  # MDP-R-01


@pytest.mark.parametrize(
    ("state", "input_"), list(itertools.product(PeerState, WorkerInput)), ids=_case_id
)
def test_table_matches_the_spec(state: PeerState, input_: WorkerInput) -> None:
    """Each cell's content agrees with an independent reading of the spec: the other tests
    here check the broker follows the table, this one that the table is right."""
    cell = WORKER_TRANSITIONS[state, input_]
    next_state, disconnect, violation, heartbeat = spec_cell(state, input_)
    assert cell.next_state is next_state
    assert (Action.SEND_DISCONNECT in cell.actions) is disconnect
    assert (Action.SEND_HEARTBEAT in cell.actions) is heartbeat
    assert cell.violation is (violation is not None)
    if violation is not None:
        assert cell.rule == violation
    refreshes = next_state in (PeerState.IDLE, PeerState.BUSY) and input_ in (
        WorkerInput.HEARTBEAT,
        WorkerInput.PARTIAL,
        WorkerInput.FINAL,
    )
    assert (Action.REFRESH in cell.actions) is (refreshes and state is not PeerState.SILENCED)
    loses_worker = state in (PeerState.IDLE, PeerState.BUSY) and next_state is PeerState.SILENCED
    assert (Action.UNREGISTER in cell.actions) is loses_worker


# --- what a cell implies ----------------------------------------------------------------------


@dataclass
class Expected:
    """The state, outbox and event kinds a cell implies for a scene."""

    state: PeerState
    outbox: list[tuple[bytes, tuple[bytes, ...]]] = field(default_factory=list)
    events: list[tuple[type, bytes]] = field(default_factory=list)  # (event class, peer/worker)


def implied(
    scene: Scene, input_: WorkerInput, cell: Transition, frames: tuple[bytes, ...] | None
) -> Expected:
    """Translate the cell's actions, in order, into messages and events for this scene."""
    out = Expected(cell.next_state)
    request = scene.request_body
    if cell.violation:
        out.events.append((ProtocolViolation, P))
    for action in cell.actions:
        if action is Action.SEND_DISCONNECT:
            out.outbox.append((P, DISCONNECT))
        elif action is Action.SEND_HEARTBEAT:
            out.outbox.append((P, HEARTBEAT))
        elif action is Action.REGISTER:
            out.events.append((WorkerRegistered, P))
            if scene.queued:
                # "register (idle), then dispatch": the waiting request makes P busy at once.
                assert request is not None
                out.state = PeerState.BUSY
                out.outbox.append((P, (W, b"\x02", CLIENT, b"", *request)))
                out.events.append((RequestDispatched, P))
        elif action is Action.FORWARD_PARTIAL:
            assert frames is not None
            out.outbox.append((CLIENT, (C, b"\x02", SERVICE, *frames[4:])))
            out.events.append((PartialForwarded, P))
        elif action is Action.FORWARD_FINAL:
            assert frames is not None
            out.outbox.append((CLIENT, (C, b"\x03", SERVICE, *frames[4:])))
            out.events.append((RequestCompleted, P))
        elif action is Action.UNREGISTER:
            kind = WorkerExpired if input_ is WorkerInput.EXPIRED else WorkerDisconnected
            out.events.append((kind, P))
            if scene.busy:
                assert request is not None
                assert scene.other_idle
                out.events.append((RequestRedispatched, P))
                out.outbox.append((OTHER, (W, b"\x02", CLIENT, b"", *request)))
                out.events.append((RequestDispatched, OTHER))
        elif action is Action.KEEP_SILENT:
            out.events.append((MessageDropped, P))
    return out


def event_peer(event: BrokerEvent) -> bytes | None:
    """The peer an event is about, as ``Expected.events`` names it."""
    if isinstance(event, ProtocolViolation | MessageDropped):
        return event.peer
    if isinstance(event, RequestRedispatched):
        return event.lost_worker
    if isinstance(event, WorkerRegistered | WorkerExpired | WorkerDisconnected):
        return event.worker
    if isinstance(event, RequestDispatched | PartialForwarded | RequestCompleted):
        return event.worker
    return None


def check_outcome(
    scene: Scene,
    input_: WorkerInput,
    events: list[BrokerEvent],
    frames: tuple[bytes, ...] | None = None,
) -> None:
    """The peer's state, the whole outbox and the events match the cell."""
    broker = scene.broker
    cell = WORKER_TRANSITIONS[scene.state, input_]
    expected = implied(scene, input_, cell, frames)
    outbox = broker.take_outgoing()
    events = [*events, *broker.flushed()]  # the outbox was sent: a FINAL completes (MDP-D-24)
    assert broker.worker_state(P) is expected.state
    assert outbox == expected.outbox
    if frames is not None:
        # Body frames go through as the very same objects (MDP-S-03).
        for peer, sent in outbox:
            if peer == CLIENT:
                assert all(a is b for a, b in zip(sent[3:], frames[4:], strict=True))
    if scene.request_body is not None:
        for _, sent in outbox:
            if sent[1] == b"\x02" and sent[0] == W:
                assert all(a is b for a, b in zip(sent[4:], scene.request_body, strict=True))
    assert [(type(e), event_peer(e)) for e in events] == expected.events
    for event in events:
        assert event.at == broker.now
        if isinstance(event, ProtocolViolation):
            assert event.action == ("disconnected" if (P, DISCONNECT) in outbox else "dropped")
            # A malformed message carries the codec's rule; anything else the cell's.
            rule = "MDP-R-02" if input_ is WorkerInput.INVALID else cell.rule
            assert event.rule == rule
        if isinstance(event, WorkerDisconnected):
            assert event.disconnect_sent == (Action.SEND_DISCONNECT in cell.actions)
            assert event.reason == DISCONNECT_REASON.get(input_, "unexpected-command")
    # What the actions leave behind.
    if Action.SILENCE in cell.actions:
        assert broker.silenced()[P] == broker.now + SPAN
    if Action.KEEP_SILENT in cell.actions:
        assert broker.silenced()[P] == broker.now + SPAN  # the silence is extended
    if expected.state in (PeerState.IDLE, PeerState.BUSY):
        assert P not in broker.silenced()
        view = broker.workers()[P]
        assert view.state is expected.state
        if Action.REFRESH in cell.actions or Action.REGISTER in cell.actions:
            assert view.last_heard == broker.now
    else:
        assert P not in broker.workers()
    if cell.next_state is PeerState.UNKNOWN:
        assert P not in broker.silenced()
    if Action.UNREGISTER in cell.actions and scene.busy:
        assert broker.workers()[OTHER].client == CLIENT


def all_scenes() -> list[tuple[Callable[[], Scene], WorkerInput]]:
    return [
        (make, input_)
        for state, makers in SCENES.items()
        for make in makers
        for input_ in WorkerInput
        if (state, input_) in WORKER_TRANSITIONS
    ]


# --- message and feedback inputs --------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "input_"),
    [(m, i) for m, i in all_scenes() if i in MESSAGE_INPUTS or i in FEEDBACK_INPUTS],
    ids=_case_id,
)
def test_message_and_feedback_cells(make: Callable[[], Scene], input_: WorkerInput) -> None:
    """MDP-W-09 .. MDP-W-16, MDP-H-01/02, MDP-R-01, MDP-D-06/13/14/15: one cell each."""
    scene = make()
    now = scene.now + INTERVAL / 2
    if input_ in FEEDBACK_INPUTS:
        feedback = (
            scene.broker.peer_unreachable
            if input_ is WorkerInput.UNREACHABLE
            else scene.broker.peer_congested
        )
        events = feedback(P, now)
        check_outcome(scene, input_, events)
        return
    frames = MESSAGE_INPUTS[input_]()
    events = scene.send(P, frames, now)
    check_outcome(scene, input_, events, frames)


@pytest.mark.parametrize("make", [*SCENES[PeerState.IDLE], *SCENES[PeerState.BUSY]])
def test_invalid_without_header_from_a_worker(make: Callable[[], Scene]) -> None:
    """MDP-W-16: a registered worker that sends a message with no known header is invalid."""
    scene = make()
    events = scene.send(P, (b"GARBAGE", b"\x05"), scene.now + INTERVAL / 2)
    cell = WORKER_TRANSITIONS[scene.state, WorkerInput.INVALID]
    assert scene.broker.worker_state(P) is cell.next_state is PeerState.SILENCED
    violations = [e for e in events if isinstance(e, ProtocolViolation)]
    assert [(v.peer, v.rule, v.action) for v in violations] == [(P, "MDP-W-16", "dropped")]
    assert (P, DISCONNECT) not in scene.broker.take_outgoing()


def test_garbage_from_a_stranger_changes_nothing() -> None:
    """MDP-W-08: a message with no known header from an unknown peer is dropped; P stays
    UNKNOWN (it may be a client) and is sent nothing."""
    scene = unknown_fresh()
    events = scene.send(P, (b"GARBAGE", b"\x05"), 0.5)
    assert [(type(e), e.peer, e.rule) for e in events if isinstance(e, ProtocolViolation)] == [
        (ProtocolViolation, P, "MDP-W-08")
    ]
    assert scene.broker.worker_state(P) is PeerState.UNKNOWN
    assert scene.broker.take_outgoing() == []


# --- timer inputs: advance time to the exact boundary -----------------------------------------


def just_before(t: float) -> float:
    return math.nextafter(t, -math.inf)


def _tick_quietly(scene: Scene, now: float) -> None:
    """Tick at ``now``; nothing may happen to P."""
    events = scene.broker.tick(now)
    scene.now = now
    assert scene.broker.worker_state(P) is scene.state
    assert [e for e in events if event_peer(e) == P] == []
    assert [peer for peer, _ in scene.broker.take_outgoing()] == []


@pytest.mark.parametrize(
    ("make", "input_"),
    [(m, i) for m, i in all_scenes() if i in TIMER_INPUTS],
    ids=_case_id,
)
def test_timer_cells(make: Callable[[], Scene], input_: WorkerInput) -> None:
    """MDP-D-03/04/05/06, MDP-H-04/05: each timer at its exact boundary, and not a hair before."""
    scene = make()
    state = scene.state
    broker = scene.broker
    if state in (PeerState.IDLE, PeerState.BUSY):
        if input_ is WorkerInput.HEARTBEAT_DUE:
            # P was last sent something at 0 (READY's registration or the REQUEST), OTHER at 1/4.
            _tick_quietly(scene, just_before(INTERVAL))
            events = broker.tick(INTERVAL)
        elif input_ is WorkerInput.EXPIRED:
            # OTHER stays alive; the heartbeats due to both go out now, so none is due at SPAN.
            scene.send(OTHER, HEARTBEAT, SPAN - INTERVAL / 2)
            assert sorted(broker.take_outgoing()) == [(P, HEARTBEAT), (OTHER, HEARTBEAT)]
            _tick_quietly(scene, just_before(SPAN))
            events = broker.tick(SPAN)
        else:
            # A silence that ended with READY leaves a timer behind; it must do nothing.
            scene = Scene(Broker(CONFIG), 0.0, state, busy=scene.busy, other_idle=scene.other_idle)
            broker = scene.broker
            scene.send(P, READY, 0.0)
            scene.send(P, DISCONNECT, 0.0)
            scene.send(P, READY, SPAN - INTERVAL / 2)
            if scene.busy:
                _client_request(scene, SPAN - INTERVAL / 2)
            scene.send(OTHER, READY, SPAN - INTERVAL / 2)
            broker.take_outgoing()
            assert broker.worker_state(P) is state
            events = broker.tick(SPAN)  # when the old silence would have ended
        scene.now = broker.now
        check_outcome(scene, input_, events)
        return
    if state is PeerState.UNKNOWN:
        # No timer exists for P: the times a worker's would fall due pass without effect.
        start = scene.now
        boundary = {
            WorkerInput.EXPIRED: SPAN,
            WorkerInput.HEARTBEAT_DUE: INTERVAL,
            WorkerInput.SILENCE_OVER: SPAN,
        }[input_]
        events = broker.tick(start + boundary)
        scene.now = broker.now
        check_outcome(scene, input_, events)
        return
    assert scene.silenced_at is not None
    start = scene.silenced_at
    if input_ is WorkerInput.SILENCE_OVER:
        _tick_quietly(scene, just_before(start + SPAN))
        events = broker.tick(start + SPAN)
    elif input_ is WorkerInput.HEARTBEAT_DUE:
        events = broker.tick(start + INTERVAL)  # a worker would be due a heartbeat now
    else:
        # P speaks after its silence began, so its silence outlasts the moment a worker last
        # heard at ``start`` would expire: that moment must pass without effect.
        scene.send(P, HEARTBEAT, start + INTERVAL)
        assert broker.silenced()[P] == start + INTERVAL + SPAN
        events = broker.tick(start + SPAN)
    scene.now = broker.now
    check_outcome(scene, input_, events)
