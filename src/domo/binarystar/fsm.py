"""The Binary Star pair's state machine (the ZeroMQ Guide, chapter 4), sans-IO.

Two brokers, a *primary* and a *backup*, decide between them which one serves: the *active*
one; the other is *passive* and serves nobody. Each tells the other its state every
``heartbeat`` seconds; a peer not heard for ``2 x heartbeat`` is *silent*. The rule that keeps
them from both serving (split brain): a passive broker becomes active only when its peer is
silent **and** a client request has come to it (BSTAR-10); the client request is the vote of
the network that the peer is really gone for the clients too.

This module is the decisions only: no socket, no clock. Inputs: ``peer_state(state, now)`` (a
state message from the peer), ``client_request(now)`` (a client's request arrived: serve it?),
``tick(now)``; outputs: the answer to ``client_request``, ``serving`` (whether this broker may
take messages from clients and workers now), ``state``, the ``Transition`` events, and
``next_deadline()`` (when to publish the state again). ``TRANSITIONS`` is the table the spec
(specs/binary-star.md) shows and the tests check cell by cell.

One addition to the Guide (BSTAR-12): a broker whose own state message went unsent for as long
as its peer waits (SIGSTOP, a stalled VM) may have been declared silent and replaced meanwhile,
and what it knows of its peer is as old. On the first input after such a gap it gives its peer
a fresh expiry, believes nothing the peer said until a heartbeat after waking, and, if it was
active, serves nobody until it hears its peer again or its peer stays silent a full expiry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Final

from domo.protocol.errors import LocalProtocolError

__all__ = [
    "TRANSITIONS",
    "Event",
    "PairConfig",
    "PairMachine",
    "Role",
    "State",
    "Transition",
    "decode_state",
    "encode_state",
]

WIRE_HEADER: Final = b"domo-bstar/1"  # BSTAR-03: one frame, "domo-bstar/1 ROLE STATE", per beat


class Role(Enum):
    """Which broker of the pair this is, fixed at start (BSTAR-01)."""

    PRIMARY = "primary"
    BACKUP = "backup"


class State(Enum):
    """The four states of the Guide's machine (BSTAR-02)."""

    PRIMARY = "primary"  # a primary waiting to hear its peer
    BACKUP = "backup"  # a backup waiting to hear its peer
    ACTIVE = "active"  # serving clients and workers
    PASSIVE = "passive"  # serving nobody; the peer is active


class Event(Enum):
    """What the peer says it is (its state message), or a client request."""

    PEER_PRIMARY = "peer-primary"
    PEER_BACKUP = "peer-backup"
    PEER_ACTIVE = "peer-active"
    PEER_PASSIVE = "peer-passive"
    CLIENT_REQUEST = "client-request"


PEER_EVENTS: Final = {
    State.PRIMARY: Event.PEER_PRIMARY,
    State.BACKUP: Event.PEER_BACKUP,
    State.ACTIVE: Event.PEER_ACTIVE,
    State.PASSIVE: Event.PEER_PASSIVE,
}

# What each peer state message does in each state: (next state, rule). A missing cell keeps the
# state. CLIENT_REQUEST is decided by ``client_request`` (it depends on the peer's silence).
TRANSITIONS: Final[dict[tuple[State, Event], tuple[State, str]]] = {
    (State.PRIMARY, Event.PEER_PRIMARY): (State.PRIMARY, "BSTAR-14"),
    (State.PRIMARY, Event.PEER_BACKUP): (State.ACTIVE, "BSTAR-05"),
    (State.PRIMARY, Event.PEER_ACTIVE): (State.PASSIVE, "BSTAR-06"),
    (State.PRIMARY, Event.PEER_PASSIVE): (State.PRIMARY, "BSTAR-15"),
    (State.BACKUP, Event.PEER_PRIMARY): (State.BACKUP, "BSTAR-15"),
    (State.BACKUP, Event.PEER_BACKUP): (State.BACKUP, "BSTAR-14"),
    (State.BACKUP, Event.PEER_ACTIVE): (State.PASSIVE, "BSTAR-07"),
    (State.BACKUP, Event.PEER_PASSIVE): (State.BACKUP, "BSTAR-15"),
    (State.ACTIVE, Event.PEER_PRIMARY): (State.ACTIVE, "BSTAR-15"),
    (State.ACTIVE, Event.PEER_BACKUP): (State.ACTIVE, "BSTAR-15"),
    (State.ACTIVE, Event.PEER_ACTIVE): (State.ACTIVE, "BSTAR-11"),  # the primary yields: below
    (State.ACTIVE, Event.PEER_PASSIVE): (State.ACTIVE, "BSTAR-15"),
    (State.PASSIVE, Event.PEER_PRIMARY): (State.ACTIVE, "BSTAR-08"),
    (State.PASSIVE, Event.PEER_BACKUP): (State.ACTIVE, "BSTAR-08"),
    (State.PASSIVE, Event.PEER_ACTIVE): (State.PASSIVE, "BSTAR-15"),
    (State.PASSIVE, Event.PEER_PASSIVE): (State.PASSIVE, "BSTAR-13"),  # the primary acts: below
}


@dataclass(frozen=True, slots=True)
class Transition:
    """The pair machine changed state, or whether it serves (``serving``), at ``now``."""

    old: State
    new: State
    serving: bool
    rule: str
    reason: str
    now: float


@dataclass(frozen=True)
class PairConfig:
    """``heartbeat``: seconds between two state messages; the peer is silent after twice that
    without one (BSTAR-04)."""

    role: Role
    heartbeat: float = 1.0

    def __post_init__(self) -> None:
        if not self.heartbeat > 0:
            raise ValueError(f"heartbeat must be > 0, got {self.heartbeat}")

    @property
    def peer_expiry(self) -> float:
        return 2 * self.heartbeat


def encode_state(role: Role, state: State) -> list[bytes]:
    """The state message a broker publishes each heartbeat (BSTAR-03): one frame, so that the
    subscriber can keep only the newest (ZeroMQ's CONFLATE takes single-frame messages)."""
    return [b" ".join((WIRE_HEADER, role.value.encode(), state.value.encode()))]


def decode_state(frames: list[bytes]) -> tuple[Role, State] | None:
    """The peer's role and state from its message, or None if it is not one (BSTAR-16)."""
    if len(frames) != 1:
        return None
    words = bytes(frames[0]).split(b" ")
    if len(words) != 3 or words[0] != WIRE_HEADER:
        return None
    try:
        return Role(words[1].decode()), State(words[2].decode())
    except (UnicodeDecodeError, ValueError):
        return None


class PairMachine:
    """One broker's side of a Binary Star pair; see the module docstring."""

    def __init__(self, config: PairConfig, now: float) -> None:
        self.config = config
        self.role = config.role
        self.state = State.PRIMARY if config.role is Role.PRIMARY else State.BACKUP
        self.now = now
        # A primary alone waits one peer expiry before it serves (BSTAR-09): the backup may
        # be active after a failover, and this primary just restarted.
        self.peer_expiry = now + config.peer_expiry
        self.heard_peer = False
        self.unsure = False  # after a gap in our own run: serve nobody until sure (BSTAR-12)
        self.published_at = now  # the last state message sent (the first goes at once)
        self.woke_at = -math.inf  # when the last gap was found
        self.in_gap = False  # a gap was found and no state message has gone out since
        self.next_beat = now  # publish at once
        self.events: list[Transition] = []

    # --- views --------------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Whether this broker takes messages from clients and workers now."""
        return self.state is State.ACTIVE and not self.unsure

    def peer_silent(self, now: float) -> bool:
        return now >= self.peer_expiry

    def next_deadline(self) -> float:
        """When to publish the state next (``tick``); early calls are harmless."""
        return self.next_beat

    def message(self) -> list[bytes]:
        """This broker's state message."""
        return encode_state(self.role, self.state)

    def take_events(self) -> list[Transition]:
        events, self.events = self.events, []
        return events

    # --- inputs -------------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if now < self.now:
            raise LocalProtocolError(f"now went backwards: {now} < {self.now}")
        self.now = now
        unsent = now - self.published_at
        if unsent >= self.config.peer_expiry and not self.in_gap:
            # Our state went unsent as long as the peer waits: it may have found us silent and
            # taken over, and what we know of it is as old (BSTAR-12). Give it a fresh expiry.
            self.in_gap = True
            self.peer_expiry = now + self.config.peer_expiry
            self.woke_at = now
            if self.state in (State.ACTIVE, State.PRIMARY) and not self.unsure:
                was_serving = self.serving
                self.unsure = True
                reason = f"not run: its state unsent for {unsent:.3g} s"
                self._note(self.state, "BSTAR-12", reason, was_serving)

    def observe(self, now: float) -> None:
        """Advance time only (a message from a worker, say): what ``serving`` depends on."""
        self._advance(now)
        self._settle(now)

    def tick(self, now: float) -> bool:
        """Advance time; True if the state message is due (then publish ``message()``)."""
        self._advance(now)
        self._settle(now)
        if now >= self.next_beat:
            self.next_beat = now + self.config.heartbeat
            self.published_at = now  # the runtime publishes it now
            self.in_gap = False
            return True
        return False

    def peer_state(self, role: Role, state: State, now: float) -> None:
        """The peer says it is ``state`` (its message arrived at ``now``)."""
        self._advance(now)
        self.peer_expiry = now + self.config.peer_expiry
        self.heard_peer = True
        if now < self.woke_at + self.config.heartbeat:
            # Sent before our gap, maybe: what the peer said while we were away is stale. Only
            # what comes a full heartbeat after waking is sure to be news (BSTAR-12).
            return
        was_serving = self.serving
        if role is self.role:  # BSTAR-14: two primaries or two backups: never serve
            self.unsure = False
            self._move(
                State.PASSIVE if self.state is State.ACTIVE else self.state,
                "BSTAR-14",
                f"the peer is a {role.value} too: fix the configuration",
                was_serving,
            )
            return
        self.unsure = False  # heard: the table decides
        event = PEER_EVENTS[state]
        new, rule = TRANSITIONS[(self.state, event)]
        reason = f"peer is {state.value}"
        if (self.state, event) == (State.ACTIVE, Event.PEER_ACTIVE) and self.role is Role.PRIMARY:
            new = State.PASSIVE  # BSTAR-11: of two actives, the primary yields
        if (self.state, event) == (State.PASSIVE, Event.PEER_PASSIVE) and (
            self.role is Role.PRIMARY
        ):
            new = State.ACTIVE  # BSTAR-13: of two passives, the primary serves
        self._move(new, rule, reason, was_serving)

    def client_request(self, now: float) -> bool:
        """A client's request arrived: True to serve it, False to drop it (BSTAR-09, BSTAR-10)."""
        self._advance(now)
        was_serving = self.serving
        if self.unsure:
            if not self.peer_silent(now):
                return False
            self.unsure = False  # a full expiry with nothing from the peer: it is gone
        if self.state is State.ACTIVE:
            if not was_serving:
                self._note(self.state, "BSTAR-12", "the peer stayed silent", was_serving)
            return True
        if self.state is State.BACKUP:
            return False  # BSTAR-07: a backup serves only after it has seen the primary
        if self.peer_silent(now):  # PRIMARY after its wait, or PASSIVE with a silent peer
            rule = "BSTAR-09" if self.state is State.PRIMARY else "BSTAR-10"
            self._move(State.ACTIVE, rule, "a client came and the peer is silent", was_serving)
            return True
        return False

    def _settle(self, now: float) -> None:
        """An unsure broker whose peer stayed silent a full expiry serves again (BSTAR-12)."""
        if self.unsure and self.peer_silent(now) and self.state is State.ACTIVE:
            self.unsure = False
            self._note(self.state, "BSTAR-12", "the peer stayed silent", False)

    def _move(self, new: State, rule: str, reason: str, was_serving: bool) -> None:
        old, self.state = self.state, new
        if old is not new or was_serving != self.serving:
            self.events.append(Transition(old, new, self.serving, rule, reason, self.now))

    def _note(self, state: State, rule: str, reason: str, was_serving: bool) -> None:
        if was_serving != self.serving:
            self.events.append(Transition(state, state, self.serving, rule, reason, self.now))
