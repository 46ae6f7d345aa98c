"""The broker's outbox on several sockets (``domo.runtime.pumping.RoutedOutbox``).

A client on connection 1 asks for a service whose worker is on connection 0. Without ``shared``
the REQUEST waits for connection 0's pump, which is woken; with it (Trio: every pump on one
thread) connection 1's pump sends it on connection 0's socket at once and wakes that pump only
if a message now waits there to be read. Each message is checked where it goes and when.
"""

from __future__ import annotations

from collections.abc import Sequence

from domo.protocol.events import BrokerEvent, RequestCompleted, WorkerDisconnected
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame
from domo.runtime.pumping import EHOSTUNREACH, SENT, RoutedOutbox

WORKER, CLIENT = b"\x00worker", b"\x00client"
READY = [b"", b"MDPW02", b"\x01", b"echo"]
REQUEST = [b"", b"MDPC02", b"\x01", b"echo", b"hello"]


def forwarded(sent: list[list[bytes]], worker: bytes = WORKER) -> bool:
    """Is ``sent`` the client's REQUEST, once, to ``worker``? (The client's address is the
    core's token for a peer on another connection, not its routing id.)"""
    return (
        len(sent) == 1
        and sent[0][:4] == [worker, b"", b"MDPW02", b"\x02"]
        and CLIENT in sent[0][4]
        and sent[0][5:] == [b"", b"hello"]
    )


class Socket:
    """One socket as a pump sees it: what was sent on it, and whether a message waits."""

    def __init__(self, answer: int = SENT) -> None:
        self.sent: list[list[bytes]] = []
        self.waiting = False
        self.answer = answer

    def send(self, frames: Sequence[BodyFrame], /) -> int:
        if self.answer == SENT:
            self.sent.append([bytes(frame) for frame in frames])
        return self.answer

    def readable(self) -> bool:
        return self.waiting


def _setup(shared: bool, zero: Socket) -> tuple[FamilyBroker, RoutedOutbox, Socket, list[int]]:
    broker, one, woken = FamilyBroker(), Socket(), list[int]()
    outbox = RoutedOutbox(broker, 2, woken.append, shared=[zero, one] if shared else None)
    broker.receive(WORKER, READY, 0.0, 0)
    outbox.flush(0, zero, 0.0, lambda events: None)
    broker.receive(CLIENT, REQUEST, 0.1, 1)
    return broker, outbox, one, woken


def test_without_shared_a_message_for_another_socket_waits_for_its_pump() -> None:
    zero, events = Socket(), list[BrokerEvent]()
    _, outbox, one, woken = _setup(False, zero)
    outbox.flush(1, one, 0.1, events.extend)
    assert (zero.sent, one.sent, woken, outbox.queued(0)) == ([], [], [0], 1)
    outbox.flush(0, zero, 0.1, events.extend)
    assert forwarded(zero.sent)
    assert outbox.queued(0) == 0


def test_with_shared_a_message_for_another_socket_leaves_at_once_without_a_wake() -> None:
    zero = Socket()
    _, outbox, one, woken = _setup(True, zero)
    outbox.flush(1, one, 0.1, lambda events: None)
    assert forwarded(zero.sent)
    assert (one.sent, woken, outbox.queued(0)) == ([], [], 0)


def test_with_shared_the_other_pump_is_woken_when_its_socket_has_a_message() -> None:
    zero = Socket()
    _, outbox, one, woken = _setup(True, zero)
    zero.waiting = True  # the send took the wake-up of a message that came meanwhile
    outbox.flush(1, one, 0.1, lambda events: None)
    assert forwarded(zero.sent)
    assert woken == [0]


def test_with_shared_a_failed_send_is_reported_for_the_socket_it_was_for() -> None:
    zero = Socket()
    broker, outbox, one, _ = _setup(True, zero)
    zero.answer = EHOSTUNREACH
    events: list[BrokerEvent] = []
    outbox.flush(1, one, 0.1, events.extend)
    gone = [event for event in events if isinstance(event, WorkerDisconnected)]
    assert [(event.service, event.reason) for event in gone] == [(b"echo", "unreachable")]
    assert not any(isinstance(event, RequestCompleted) for event in events)
    # The request waits for another worker; one on connection 0 gets it.
    zero.answer = SENT
    broker.receive(b"\x00other", READY, 0.2, 0)
    outbox.flush(0, zero, 0.2, events.extend)
    assert forwarded(zero.sent, b"\x00other")
