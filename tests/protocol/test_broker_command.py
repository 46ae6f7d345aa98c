"""``Broker.command``: the routing core driven by neutral commands, with no frames to parse.

Two brokers are fed the same conversation, one as MDP/0.2 frames (``receive``) and one as the
``CoreCommand`` each message means (``command``); they must agree on every event and every
message sent, step by step, including the refusals (MDP-D-01, MDP-D-02, MDP-C-01, MDP-W-15,
MDP-D-16, MDP-D-13). A violation's reason is prose that names frames on one side, so violations
are compared by rule, peer and action. Bodies have a frame at least there, since MDP/0.2's do;
a neutral body may be empty (FAM-10), tested on its own below.
"""

from __future__ import annotations

from dataclasses import astuple

from hypothesis import given, settings
from hypothesis import strategies as st

from domo.protocol import Broker, BrokerConfig
from domo.protocol.broker import PeerTraits
from domo.protocol.dialects import CORE_CODES, MDPC02, MDPW02, Command, CoreCommand, Role
from domo.protocol.events import BrokerEvent, ProtocolViolation
from domo.protocol.mdp import BodyFrame

from .mdp_strategies import plain

CONFIG = BrokerConfig(heartbeat_interval=1.0, liveness=3, request_expiry=5.0)
WORKERS, CLIENTS = [b"W1", b"W2"], [b"C1", b"C2"]
SERVICES = [b"echo", b"other", b"mmi.service", b"mmi.nope", b"", b"bad\n"]
BODIES = st.lists(st.sampled_from([b"x", b"", b"yz"]), min_size=1, max_size=2).map(tuple)


def frames_of(message: CoreCommand) -> list[BodyFrame]:
    """The MDP/0.2 frames of ``message`` (specs/mdp-0.2.md), written here independently."""
    header = MDPW02 if message.role is Role.WORKER else MDPC02
    code = CORE_CODES[message.role, message.command]
    command = message.command
    if message.role is Role.WORKER:
        if command is Command.REGISTER:
            return [header, code, message.service]
        if command in (Command.HEARTBEAT, Command.LEAVE):
            return [header, code]
        return [header, code, message.address, b"", *message.body]
    return [header, code, message.service, *message.body]


worker_messages = st.builds(
    CoreCommand,
    role=st.just(Role.WORKER),
    command=st.sampled_from(list(Command)),
    service=st.sampled_from(SERVICES),
    address=st.sampled_from([*CLIENTS, b"someone", b""]),
    body=BODIES,
)
client_messages = st.builds(
    CoreCommand,
    role=st.just(Role.CLIENT),
    command=st.sampled_from([Command.REQUEST, Command.PARTIAL, Command.FINAL]),
    service=st.sampled_from(SERVICES),
    body=BODIES,
)
steps = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(WORKERS), worker_messages, st.floats(0, 2)),
        st.tuples(st.sampled_from(CLIENTS), client_messages, st.floats(0, 2)),
    ),
    max_size=40,
)


def comparable(events: list[BrokerEvent]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for event in events:
        if isinstance(event, ProtocolViolation):
            out.append(("violation", event.peer, event.rule, event.action, event.at))
        else:
            out.append((type(event).__name__, *astuple(event)))
    return out


@settings(max_examples=150, deadline=None)
@given(steps)
def test_commands_and_frames_drive_the_core_alike(
    conversation: list[tuple[bytes, CoreCommand, float]],
) -> None:
    by_frames, by_commands = Broker(CONFIG), Broker(CONFIG)
    now = 0.0
    for peer, message, pause in conversation:
        now += pause
        expected = by_frames.receive(peer, frames_of(message), now)
        got = by_commands.command(peer, message, now)
        assert comparable(got) == comparable(expected), message
        sent = [(p, plain(f)) for p, f in by_frames.take_outgoing()]
        assert [(p, plain(f)) for p, f in by_commands.take_outgoing()] == sent
        assert comparable(list(by_commands.flushed())) == comparable(list(by_frames.flushed()))
    now += 10.0
    assert comparable(by_commands.tick(now)) == comparable(by_frames.tick(now))
    assert by_commands.requests() == by_frames.requests()
    assert by_commands.workers() == by_frames.workers()


def test_a_client_cannot_register_heartbeat_or_leave() -> None:
    """MDP-C-01: no such client command; MDP-D-16: PARTIAL/FINAL are the broker's to a client,
    with a body or without (FAM-10: a body's layout is its codec's to check)."""
    broker = Broker(CONFIG)
    rules = []
    for command in Command:
        if command is Command.REQUEST:
            continue
        message = CoreCommand(Role.CLIENT, command, b"echo", body=(b"x",))
        [event] = broker.command(b"C", message, 0.0)
        assert isinstance(event, ProtocolViolation)
        assert event.action == "dropped"
        rules.append(event.rule)
    assert rules == ["MDP-C-01", "MDP-D-16", "MDP-D-16", "MDP-C-01", "MDP-C-01"]
    [event] = broker.command(b"C", CoreCommand(Role.CLIENT, Command.PARTIAL, b"echo"), 0.0)
    assert isinstance(event, ProtocolViolation)
    assert event.rule == "MDP-D-16"
    assert broker.take_outgoing() == []


def test_fam_10_an_empty_body_is_carried_and_padded_only_for_mdp02() -> None:
    """FAM-10: a neutral request with no body frame is accepted and held; a worker given
    neutral traits gets it with no body, an MDP/0.2 worker as one empty frame (RFC 18's body
    has a frame at least); a reply with no body goes back alike, each way."""
    broker = Broker(CONFIG)
    broker.set_traits(b"N", PeerTraits(neutral=True))
    broker.command(b"N", CoreCommand(Role.WORKER, Command.REGISTER, service=b"neutral"), 0.0)
    broker.command(b"W", CoreCommand(Role.WORKER, Command.REGISTER, service=b"mdp02"), 0.0)
    broker.set_traits(b"D", PeerTraits(neutral=True))
    broker.command(b"D", CoreCommand(Role.CLIENT, Command.REQUEST, b"neutral"), 0.1)
    broker.command(b"C", CoreCommand(Role.CLIENT, Command.REQUEST, b"mdp02"), 0.1)
    assert [r.size for r in broker.requests()] == [0, 0]
    assert broker.take_outbox() == [
        (b"N", CoreCommand(Role.WORKER, Command.REQUEST, b"neutral", b"D", ())),
        (b"W", (MDPW02, b"\x02", b"C", b"", b"")),
    ]
    broker.command(b"N", CoreCommand(Role.WORKER, Command.FINAL, address=b"D"), 0.2)
    broker.command(b"W", CoreCommand(Role.WORKER, Command.FINAL, address=b"C", body=()), 0.2)
    assert broker.take_outbox() == [
        (b"D", CoreCommand(Role.CLIENT, Command.FINAL, b"neutral", b"", ())),
        (b"C", (MDPC02, b"\x03", b"mdp02", b"")),
    ]
    assert len(broker.flushed()) == 2


def test_a_neutral_request_is_served_by_a_worker_registered_neutrally() -> None:
    """MDP-W-09, MDP-R-01 through commands alone; the body frames cross as they came
    (MDP-S-03)."""
    broker = Broker(CONFIG)
    broker.command(b"W", CoreCommand(Role.WORKER, Command.REGISTER, service=b"echo"), 0.0)
    body = (b"hello", memoryview(b"x" * 70_000).toreadonly())
    broker.command(b"C", CoreCommand(Role.CLIENT, Command.REQUEST, b"echo", body=body), 0.1)
    [(to, frames)] = broker.take_outgoing()
    assert to == b"W"
    assert frames[-1] is body[-1]
    final = CoreCommand(Role.WORKER, Command.FINAL, address=b"C", body=(b"bye",))
    broker.command(b"W", final, 0.2)
    assert [(p, plain(f)) for p, f in broker.take_outgoing()] == [
        (b"C", (MDPC02, b"\x03", b"echo", b"bye"))
    ]
    assert len(broker.flushed()) == 1
