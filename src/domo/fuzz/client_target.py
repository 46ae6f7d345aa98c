"""Play the broker against an MDP/0.2 client (``domo fuzz --target client``), and check it.

domo binds ENDPOINT; the client connects (started by ``--exec CMD`` or by hand) and must send
requests one after another, for ever: the next REQUEST after the FINAL of the previous one (any
service, any body; after a timeout it may resend on a new socket, MDP-C-08). The fuzzer answers
the newest outstanding request as a scenario of
:data:`~domo.fuzz.scenario.CLIENT_TARGET_KINDS` steps says: PARTIALs and a FINAL, a lone
PARTIAL, a reply naming another service, malformed near-misses, waiting. A client cannot be seen
deciding, only sending: a conforming one sends its next REQUEST only after a valid FINAL. So the
checks are on what it sends:

- every REQUEST parses (MDP-C-01, MDP-D-01); it sends no PARTIAL or FINAL: MDP-C-02, MDP-C-03;
- a new REQUEST on a connection whose request has had no valid FINAL breaks the synchronous
  dialog; the rule named is what the fuzzer last sent that connection in the ``blame_window``
  before: a PARTIAL (it was taken for the end: MDP-C-05), a reply naming another service (the
  service frame was ignored: MDP-D-20), a REQUEST (a client-to-broker command: MDP-D-20), a
  malformed message (MDP-W-08); with none of those: MDP-C-07 (say, a resend on the same socket);
- after the scenario, a probe: the outstanding request gets a valid FINAL and the client must
  send another REQUEST within ``peer_timeout``; if not, or if its process exited, the client has
  stopped working: the rule of the worst thing the scenario sent it, as above.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from domo.protocol import mdp
from domo.protocol.errors import MalformedMessage

from .bound import BoundRun
from .broker_target import TargetDied, Timing, Violation
from .scenario import GARBAGE_TO_CLIENT, Step

__all__ = ["ClientRun"]

# What each provocation means when the client answers it with a new REQUEST, worst first.
_PROVOCATIONS: Final[dict[str, tuple[str, str]]] = {
    "garbage": ("MDP-W-08", "took a malformed message for the reply"),
    "broker-request": ("MDP-D-20", "took a REQUEST (a command only clients send) for the reply"),
    "wrong-service": ("MDP-D-20", "took a reply naming another service for its own"),
    "partial": ("MDP-C-05", "took a PARTIAL for the end of its request"),
}


@dataclass
class _Connection:
    """One client connection, as the fuzzer's broker sees it."""

    identity: bytes
    name: str
    service: bytes = b""
    body: tuple[bytes, ...] = ()
    outstanding: bool = False
    asked_at: float = 0.0
    provoked: tuple[float, str] | None = None  # when, what (a key of _PROVOCATIONS)
    closed: bool = False
    answered_at: float | None = None  # when its last request got a valid FINAL


class ClientRun(BoundRun):
    """A bound endpoint the client under test connects to; :meth:`run` plays one scenario."""

    role = "client"
    serving = "sent two requests one after the other"

    def __init__(
        self, endpoint: str, timing: Timing, command: str | Sequence[str] | None = None
    ) -> None:
        super().__init__(endpoint, command)
        self.t = timing
        self.connections: dict[bytes, _Connection] = {}
        self.names = itertools.count()
        self.latest: _Connection | None = None  # the connection of the newest REQUEST
        # The client's turnarounds: how long after a valid FINAL its next REQUEST came, the
        # time it takes to act on a reply (recent ones, newest last).
        self.turnarounds: list[float] = []

    @property
    def patience(self) -> float:
        return self.peer_timeout

    @property
    def peer_timeout(self) -> float:
        """How long the client may take to send its next request (it may be backing off)."""
        return max(10.0, 4 * self.t.dead_after)

    @property
    def blame_window(self) -> float:
        """A REQUEST out of turn this soon after a provocation is blamed on it: a client that
        takes something for the end of its request acts on it as it acts on a FINAL, so within
        twice its longest measured turnaround plus ``4 * slack``; 1 s before any is measured.
        Later than that, the REQUEST is not a reaction (a resend on the same socket after a
        timeout, say): MDP-C-07."""
        if not self.turnarounds:
            return max(1.0, 4 * self.t.slack)
        return min(max(1.0, 4 * self.t.slack), 2 * max(self.turnarounds) + 4 * self.t.slack)

    @property
    def lose_timeout(self) -> float:
        """How long a "lose" step waits for the client to give up on a request nobody answers
        and ask again (MDP-C-08: it may, on a new socket)."""
        return max(2.0, 2 * self.t.dead_after)

    def flag(self, rule: str, explanation: str) -> None:
        self.violations.append(Violation(rule, explanation))

    def current(self) -> _Connection | None:
        conn = self.latest
        return conn if conn is not None and conn.outstanding and not conn.closed else None

    def wait_for_request(self, timeout: float, *, first: bool = False) -> _Connection | None:
        deadline = time.monotonic() + timeout
        while (conn := self.current()) is None and time.monotonic() < deadline:
            self.keep_peer_running(first)
            self.pump(min(deadline, time.monotonic() + 0.05))
        return conn

    def to_client(self, conn: _Connection, frames: Sequence[bytes]) -> None:
        if not self.send(conn.identity, frames):
            conn.closed = True

    def answer(self, conn: _Connection, partials: int = 0) -> None:
        for i in range(partials):
            self.to_client(conn, mdp.client_partial_frames(conn.service, (b"partial %d" % i,)))
        if partials:
            conn.provoked = (time.monotonic(), "partial")
        conn.outstanding = False
        self.to_client(conn, mdp.client_final_frames(conn.service, conn.body))
        conn.answered_at = time.monotonic()

    # --- the probe and the scenario ----------------------------------------------------------

    def probe(self, timeout: float, *, first: bool = False) -> bool:
        """Answer the outstanding request; does the client then send another in time?"""
        conn = self.wait_for_request(timeout, first=first)
        if conn is None:
            return False
        self.answer(conn)
        return self.wait_for_request(timeout, first=first) is not None

    def run(self, steps: list[Step]) -> list[Violation]:
        """Play ``steps``; the violations seen (``TargetDied`` if the client stops)."""
        self.examples += 1
        self.violations = []
        provoked: set[str] = set()
        for step in steps:
            self.do(step, provoked)
            self.pump(time.monotonic() + 0.005)
        self.pump(time.monotonic() + self.t.slack)
        exited = self.peer.exited() if self.peer is not None else None
        if exited is not None or not self.probe(self.peer_timeout):
            raise TargetDied(self.died(provoked, exited), self.violations)
        for identity, conn in list(self.connections.items()):
            if conn is not self.latest:
                del self.connections[identity]
        return self.violations

    def died(self, provoked: set[str], exited: int | None) -> Violation:
        how = (
            f"the client process exited with code {exited}"
            if exited is not None
            else f"the client sent no further request within {self.peer_timeout:.1f} s of a FINAL"
        )
        for what, (rule, _) in _PROVOCATIONS.items():
            if what in provoked:
                return Violation(rule, f"after the broker sent it {what.replace('-', ' ')}, {how}")
        return Violation("MDP-C-07", how)

    def do(self, step: Step, provoked: set[str]) -> None:
        if step.kind == "wait":
            self.pump(time.monotonic() + step.arg * self.t.interval / 2)
            return
        conn = self.wait_for_request(self.peer_timeout)
        if conn is None:
            return
        what = ""
        match step.kind:
            case "answer":
                self.answer(conn, step.arg)
            case "lose":
                # The broker lost the request: no answer at all, until the client asks again
                # (on a new socket, MDP-C-08 recommends) or lose_timeout passes. What it then
                # sends is judged as any REQUEST (MDP-C-01; MDP-C-07 on the same socket).
                deadline = time.monotonic() + self.lose_timeout
                while self.latest is conn and conn.outstanding and time.monotonic() < deadline:
                    self.pump(min(deadline, time.monotonic() + 0.05))
            case "partial":
                what = "partial"
                self.to_client(conn, mdp.client_partial_frames(conn.service, (b"partial",)))
            case "wrong-service":
                what = "wrong-service"
                other = b"not-" + conn.service[:250]
                body = (b"for another service",)
                if step.arg % 2 == 0:
                    self.to_client(conn, mdp.client_final_frames(other, body))
                else:
                    self.to_client(conn, mdp.client_partial_frames(other, body))
            case "garbage":
                index = step.arg % len(GARBAGE_TO_CLIENT)
                _, template = GARBAGE_TO_CLIENT[index]
                what = "broker-request" if template[:2] == (b"MDPC02", b"\x01") else "garbage"
                self.to_client(conn, [conn.service if f == b"{svc}" else f for f in template])
        if what:
            provoked.add(what)
            conn.provoked = (time.monotonic(), what)
            # Give the client time to show whether it took that for the reply.
            self.pump(time.monotonic() + self.t.slack)

    # --- receiving and checking --------------------------------------------------------------

    def wake(self, planned: float, now: float) -> None:
        self.t.meter.wake(planned, now)

    def timers(self, now: float) -> None:
        pass  # MDP/Client has no heartbeats; the checks happen as requests arrive

    def heard(self, identity: bytes, frames: list[bytes]) -> None:
        now = time.monotonic()
        conn = self.connections.get(identity)
        if conn is None:
            conn = _Connection(identity, f"connection {next(self.names)}")
            self.connections[identity] = conn
        try:
            command = mdp.parse_client(frames)
        except MalformedMessage as error:
            self.flag(error.rule, f"{conn.name} sent a malformed message: {error.reason}")
            return
        if isinstance(command, mdp.ClientPartial):
            self.flag("MDP-C-02", f"{conn.name} sent PARTIAL, a command only brokers send")
            return
        if isinstance(command, mdp.ClientFinal):
            self.flag("MDP-C-03", f"{conn.name} sent FINAL, a command only brokers send")
            return
        if conn.outstanding:
            self.too_soon(conn, now)
        elif conn.answered_at is not None:
            self.turnarounds = [*self.turnarounds[-9:], now - conn.answered_at]
            conn.answered_at = None
        conn.service, conn.body = command.service, command.body
        conn.outstanding, conn.asked_at = True, now
        self.latest = conn

    def too_soon(self, conn: _Connection, now: float) -> None:
        """A REQUEST while the previous one on ``conn`` has had no valid FINAL."""
        if conn.provoked is not None and now - conn.provoked[0] <= self.blame_window:
            rule, what = _PROVOCATIONS[conn.provoked[1]]
            self.flag(rule, f"{conn.name} {what}: it sent its next REQUEST")
        else:
            self.flag(
                "MDP-C-07",
                f"{conn.name} sent a new REQUEST {now - conn.asked_at:.2f} s after the previous "
                "one, which had no FINAL yet (on the same connection)",
            )
