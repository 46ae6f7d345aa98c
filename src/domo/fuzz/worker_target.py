"""Play the broker against an MDP/0.2 worker (``domo fuzz --target worker``), and check it.

domo binds ENDPOINT; the worker connects (started by ``--exec CMD`` or by hand) and sends READY.
The fuzzer heartbeats every live connection at the agreed interval and plays a scenario of
:data:`~domo.fuzz.scenario.WORKER_TARGET_KINDS` steps at the newest one: requests of every shape,
silence, DISCONNECT, valid but unexpected commands and malformed near-misses. Every message the
worker sends is parsed (MDP-W-08) and checked as it arrives; timing rules have the same
tolerance as the broker target (:class:`~domo.fuzz.broker_target.Timing`). The checks:

- the first command on a connection is READY (or DISCONNECT, MDP-W-12): MDP-W-09; no second
  READY on it: MDP-W-10; no REQUEST (a broker command): MDP-W-02;
- PARTIAL or FINAL only for a request it holds: MDP-R-01 (for the reply to a malformed REQUEST:
  MDP-W-08); to the client address of that request: MDP-R-03; a FINAL within ``reply_timeout``:
  MDP-R-01;
- while the fuzzer heartbeats it, the worker says something at least every ``dead_after``:
  MDP-H-04;
- after the broker's DISCONNECT, nothing more on that connection after ``slack``: MDP-W-17, and
  a new connection with READY within ``reconnect_timeout``: MDP-W-17;
- after broker silence of ``dead_after`` the worker stops using that connection (MDP-H-05) and
  opens a new one within ``reconnect_timeout`` (MDP-H-06); after a silence still ``slack`` short
  of ``liveness * interval`` it does not give the connection up: MDP-H-05;
- after the scenario a probe request must be answered (on a new connection if the worker
  reconnected): otherwise MDP-W-08 when the scenario sent malformed messages, MDP-D-17 when it sent
  unexpected commands, MDP-H-06 after silence or DISCONNECT, else MDP-R-01; a worker process that
  exited is reported with its exit code.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from domo.protocol import mdp
from domo.protocol.errors import MalformedMessage

from .bound import BoundRun
from .broker_target import TargetDied, Timing, Violation
from .scenario import (
    GARBAGE_ADDRESS,
    GARBAGE_TO_WORKER,
    REQUEST_ADDRESSES,
    REQUEST_SHAPES,
    Step,
)

__all__ = ["WorkerRun"]

_HEARTBEAT: Final = (mdp.WORKER_HEADER, mdp.W_HEARTBEAT)
_DISCONNECT: Final = (mdp.WORKER_HEADER, mdp.W_DISCONNECT)
_PROBE_BODY: Final = (b"domo-fuzz-probe",)
_PROBE_ATTEMPTS: Final = 3  # a probe abandoned with its connection is sent again, this often


@dataclass
class _Connection:
    """One worker connection, as the fuzzer's broker sees it."""

    identity: bytes
    name: str
    opened: float
    last_heard: float
    last_sent: float
    longest_gap: float = 0.0  # between two of the fuzzer's messages on it, since a silence began
    ready: bool = False
    closed: bool = False  # a send found it gone (ROUTER_MANDATORY)
    said_disconnect: bool = False
    told_disconnect_at: float | None = None  # the fuzzer sent DISCONNECT
    ended_when_told: int = 0  # connections ended by then (BoundRun.connections_ended)
    quiet_until: float = 0.0  # the fuzzer sends it nothing until then
    lost_at: float | None = None  # liveness x interval of broker silence ended then
    last_heartbeat: float | None = None  # its last HEARTBEAT, if nothing else came since
    holding: dict[bytes, float] = field(default_factory=dict)  # client address -> FINAL due by
    tolerated: set[bytes] = field(default_factory=set)  # addresses it may answer, no deadline
    flagged: set[str] = field(default_factory=set)

    @property
    def usable(self) -> bool:
        return (
            self.ready
            and not self.closed
            and not self.said_disconnect
            and self.told_disconnect_at is None
            and self.lost_at is None
        )


class WorkerRun(BoundRun):
    """A bound endpoint the worker under test connects to; :meth:`run` plays one scenario."""

    role = "worker"
    serving = "sent READY and answered a request"

    def __init__(
        self, endpoint: str, timing: Timing, command: str | Sequence[str] | None = None
    ) -> None:
        super().__init__(endpoint, command)
        self.t = timing
        self.connections: dict[bytes, _Connection] = {}
        self.names = itertools.count()
        self.expect_ready: tuple[float, str, str] | None = None  # by, rule, why
        self.short_silence: tuple[float, float] | None = None  # (from, until): no giving up
        self.addresses = itertools.count()
        self.not_back: Violation | None = None  # it did not come back after DISCONNECT/silence

    @property
    def reply_timeout(self) -> float:
        """How long a worker may take to answer one of the fuzzer's requests."""
        return max(2.0, 2 * self.t.dead_after)

    @property
    def patience(self) -> float:
        return self.reconnect_timeout

    @property
    def reconnect_timeout(self) -> float:
        """How long a worker may take to come back after DISCONNECT or broker silence.

        Generous: a worker backs off between reconnections (domo's doubles up to 8 s).
        """
        return max(10.0, 4 * self.t.dead_after)

    # --- connections and sending -------------------------------------------------------------

    def current(self) -> _Connection | None:
        """The newest usable connection: the one steps act on."""
        usable = [c for c in self.connections.values() if c.usable]
        return max(usable, key=lambda c: c.opened) if usable else None

    def wait_for_worker(self, timeout: float, *, first: bool = False) -> _Connection | None:
        deadline = time.monotonic() + timeout
        while (conn := self.current()) is None and time.monotonic() < deadline:
            self.keep_peer_running(first)
            self.pump(min(deadline, time.monotonic() + 0.05))
        return conn

    def to_worker(self, conn: _Connection, frames: Sequence[bytes]) -> None:
        if self.send(conn.identity, frames):
            now = time.monotonic()
            conn.longest_gap = max(conn.longest_gap, now - conn.last_sent)
            conn.last_sent = now
        else:
            conn.closed = True

    def flag(self, conn: _Connection | None, rule: str, explanation: str) -> None:
        if conn is not None:
            if rule in conn.flagged:
                return  # once per connection is enough
            conn.flagged.add(rule)
        self.violations.append(Violation(rule, explanation))

    # --- the probe and the scenario ----------------------------------------------------------

    def probe(self, timeout: float, *, first: bool = False) -> bool:
        """Is a worker connected, and does it answer a request within ``timeout``?

        A probe sent on a connection the worker then leaves for a new one (it may: a silence
        that began up to an interval after the fuzzer's last HEARTBEAT can reach its liveness,
        MDP-H-06) is abandoned with that connection, as MDP-D-17 says; it is sent again on the
        new connection, a bounded number of times, within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        for _attempt in range(_PROBE_ATTEMPTS):
            conn = self.wait_for_worker(deadline - time.monotonic(), first=first)
            if conn is None:
                return False
            address = b"probe-%d" % next(self.addresses)
            self.to_worker(conn, mdp.worker_request_frames(address, _PROBE_BODY))
            conn.holding[address] = time.monotonic() + self.reply_timeout
            replied_by = time.monotonic() + self.reply_timeout
            while address in conn.holding and time.monotonic() < replied_by and conn.usable:
                self.pump(min(replied_by, time.monotonic() + 0.05))
            answered = address not in conn.holding and conn.usable
            conn.holding.pop(address, None)
            if answered or conn.usable or time.monotonic() >= deadline:
                return answered
        return False

    def run(self, steps: list[Step]) -> list[Violation]:
        """Play ``steps``; the violations seen (``TargetDied`` if the worker stops serving)."""
        self.examples += 1
        self.violations = []
        self.not_back = None
        provoked: set[str] = set()
        for step in steps:
            self.do(step, provoked)
            self.pump(time.monotonic() + 0.005)
        # Let pending deadlines pass (late replies, DISCONNECT, reconnection).
        pending = self.expect_ready is not None or any(
            c.holding for c in self.connections.values() if c.usable
        )
        self.pump(time.monotonic() + (self.t.dead_after if pending else self.t.slack))
        if self.expect_ready is not None:
            self.wait_for_worker(self.expect_ready[0] - time.monotonic())
            self.pump(time.monotonic() + 0.005)
        exited = self.peer.exited() if self.peer is not None else None
        # A worker that did not come back within reconnect_timeout is not waited for again.
        if exited is not None or self.stayed_away() or not self.probe(self.reconnect_timeout):
            raise TargetDied(self.died(provoked, exited), self.violations)
        self.forget_closed()
        return self.violations

    def stayed_away(self) -> bool:
        """The worker did not come back within ``reconnect_timeout`` and is still away."""
        return self.not_back is not None and self.current() is None

    def died(self, provoked: set[str], exited: int | None) -> Violation:
        if self.not_back is not None and exited is None:
            return self.not_back
        how = (
            f"the worker process exited with code {exited}"
            if exited is not None
            else "the worker no longer answers a request"
        )
        if "garbage" in provoked:
            return Violation("MDP-W-08", f"after malformed messages {how}")
        if "unexpected" in provoked:
            return Violation("MDP-D-17", f"after valid but unexpected broker commands {how}")
        if provoked & {"silence", "disconnect"}:
            return Violation("MDP-H-06", f"after the broker went away {how}")
        return Violation("MDP-R-01", how)

    def forget_closed(self) -> None:
        """Forget connections the worker left, once they have been quiet a while."""
        now = time.monotonic()
        for identity, conn in list(self.connections.items()):
            if not conn.usable and now - conn.last_heard > self.t.dead_after:
                del self.connections[identity]

    def do(self, step: Step, provoked: set[str]) -> None:
        now = time.monotonic()
        if step.kind == "wait":
            self.pump(now + step.arg * self.t.interval / 2)
            return
        if self.stayed_away():
            return  # it did not come back within reconnect_timeout: waiting again adds nothing
        conn = self.wait_for_worker(self.reconnect_timeout)
        if conn is None:
            self.pump(time.monotonic() + 0.01)  # an expectation overdue now is flagged
            return
        match step.kind:
            case "request":
                if conn.holding:
                    return
                _, body = REQUEST_SHAPES[step.arg % len(REQUEST_SHAPES)]
                address = REQUEST_ADDRESSES[
                    step.arg // len(REQUEST_SHAPES) % len(REQUEST_ADDRESSES)
                ]
                self.to_worker(conn, mdp.worker_request_frames(address, body))
                conn.holding[address] = now + self.reply_timeout
            case "heartbeat":
                self.to_worker(conn, _HEARTBEAT)
            case "silence":
                provoked.add("silence")
                self.silence(conn, step.arg * self.t.interval / 2)
            case "disconnect":
                provoked.add("disconnect")
                self.to_worker(conn, _DISCONNECT)
                conn.told_disconnect_at = now
                conn.ended_when_told = self.connections_ended()
                conn.holding.clear()
                self.expect_ready = (
                    now + self.reconnect_timeout,
                    "MDP-W-17",
                    f"after the broker's DISCONNECT the worker did not reconnect with READY "
                    f"within {self.reconnect_timeout:.1f} s",
                )
                self.wait_for_worker(self.reconnect_timeout)
            case "unexpected":
                provoked.add("unexpected")
                self.unexpected(conn, step.arg % 4)
            case "garbage":
                provoked.add("garbage")
                _, frames = GARBAGE_TO_WORKER[step.arg % len(GARBAGE_TO_WORKER)]
                self.to_worker(conn, frames)
                conn.tolerated.add(GARBAGE_ADDRESS)  # answering it is W-08, checked on arrival

    def silence(self, conn: _Connection, seconds: float) -> None:
        start = time.monotonic()
        conn.quiet_until = start + seconds
        conn.longest_gap = 0.0
        lost_after = self.t.liveness * self.t.interval
        if seconds >= self.t.dead_after:
            conn.lost_at = start + lost_after
            self.expect_ready = (
                conn.lost_at + self.t.slack + self.reconnect_timeout,
                "MDP-H-06",
                f"after {seconds:.2f} s of broker silence the worker did not reconnect with READY "
                f"within {self.reconnect_timeout:.1f} s",
            )
            self.pump(conn.quiet_until)
            self.wait_for_worker(self.reconnect_timeout)
        else:
            if seconds <= lost_after - self.t.slack:
                self.short_silence = (start, start + seconds + self.t.slack)
            self.pump(conn.quiet_until)
            self.pump(time.monotonic() + self.t.slack)
            self.short_silence = None

    def unexpected(self, conn: _Connection, which: int) -> None:
        address = b"unexpected-%d" % next(self.addresses)
        if which == 0:
            frames = mdp.worker_ready_frames(b"echo")
        elif which == 1:
            frames = mdp.worker_partial_frames(address, (b"x",))
        elif which == 2:
            frames = mdp.worker_final_frames(address, (b"x",))
        else:
            if not conn.holding:
                self.to_worker(conn, mdp.worker_request_frames(address, (b"first",)))
                conn.holding[address] = time.monotonic() + self.reply_timeout
                address = b"unexpected-%d" % next(self.addresses)
            frames = mdp.worker_request_frames(address, (b"second",))
            conn.tolerated.update(conn.holding)
            conn.holding.clear()  # what the worker makes of this is not for the spec to say
        conn.tolerated.add(address)
        self.to_worker(conn, frames)

    # --- receiving and checking --------------------------------------------------------------

    def next_timer(self, now: float) -> float:
        due = [now + self.t.interval / 4]
        for conn in self.connections.values():
            if conn.usable:
                due.append(max(conn.last_sent + self.t.interval, conn.quiet_until))
        return min(due)

    def wake(self, planned: float, now: float) -> None:
        self.t.meter.wake(planned, now)

    def timers(self, now: float) -> None:
        for conn in list(self.connections.values()):
            if conn.usable and now >= conn.quiet_until:
                if now - conn.last_sent >= self.t.interval:
                    self.to_worker(conn, _HEARTBEAT)
                silent = now - conn.last_heard
                if silent > self.t.dead_after and now - conn.quiet_until > self.t.dead_after:
                    self.flag(
                        conn,
                        "MDP-H-04",
                        f"{conn.name} was heartbeated every {self.t.interval} s yet sent nothing "
                        f"for {silent:.2f} s",
                    )
            for address, due in list(conn.holding.items()):
                if now > due:
                    del conn.holding[address]
                    if conn.usable:
                        self.flag(
                            conn,
                            "MDP-R-01",
                            f"{conn.name} sent no FINAL within {self.reply_timeout:.1f} s of a "
                            "REQUEST",
                        )
        if self.expect_ready is not None and now > self.expect_ready[0]:
            _, rule, why = self.expect_ready
            self.expect_ready = None
            self.not_back = Violation(rule, why)
            self.flag(None, rule, why)

    def heard(self, identity: bytes, frames: list[bytes]) -> None:
        now = time.monotonic()
        conn = self.connections.get(identity)
        if conn is None or (
            frames[:2] == [mdp.WORKER_HEADER, mdp.W_READY] and self.is_new_socket(conn)
        ):
            # New, or a worker with a fixed routing id back on a new socket (ROUTER_HANDOVER).
            conn = _Connection(identity, f"connection {next(self.names)}", now, now, now)
            self.connections[identity] = conn
        conn.last_heard = now
        if conn.told_disconnect_at is not None:
            if now - conn.told_disconnect_at > self.t.slack:
                self.flag(
                    conn,
                    "MDP-W-17",
                    f"{conn.name} got DISCONNECT {now - conn.told_disconnect_at:.2f} s ago and "
                    "still sends on that connection",
                )
            return
        if conn.lost_at is not None:
            if now > conn.lost_at + self.t.slack:
                self.flag(
                    conn,
                    "MDP-H-05",
                    f"{conn.name} still sends on a connection whose broker has been silent for "
                    f"{now - conn.lost_at + self.t.liveness * self.t.interval:.2f} s",
                )
            return
        try:
            command = mdp.parse_worker(frames)
        except MalformedMessage as error:
            self.flag(conn, error.rule, f"{conn.name} sent a malformed message: {error.reason}")
            return
        if not isinstance(command, mdp.WorkerHeartbeat) or not conn.usable:
            conn.last_heartbeat = None
        else:
            if conn.last_heartbeat is not None:
                self.t.meter.heartbeat_gap(conn.identity, now - conn.last_heartbeat, now)
            conn.last_heartbeat = now
        match command:
            case mdp.WorkerReady():
                self.ready(conn, command, now)
            case mdp.WorkerHeartbeat():
                if not conn.ready:
                    self.flag(conn, "MDP-W-09", f"{conn.name} sent HEARTBEAT before READY")
            case mdp.WorkerPartial() | mdp.WorkerFinal():
                self.reply(conn, command)
            case mdp.WorkerRequest():
                self.flag(
                    conn, "MDP-W-02", f"{conn.name} sent REQUEST, a command only brokers send"
                )
            case mdp.WorkerDisconnect():
                conn.said_disconnect = True
                conn.holding.clear()
                self.gave_up(conn, now, "sent DISCONNECT")

    def is_new_socket(self, conn: _Connection) -> bool:
        """Is a READY from ``conn``'s routing id a new socket after it left the old one?

        After the fuzzer's DISCONNECT, only if some connection has ended since: a worker that
        sends READY again on the same socket breaks MDP-W-17.
        """
        if not conn.ready or conn.usable:
            return False
        if conn.told_disconnect_at is not None:
            return self.connections_ended() > conn.ended_when_told
        return True

    def ready(self, conn: _Connection, command: mdp.WorkerReady, now: float) -> None:
        if conn.ready:
            self.flag(conn, "MDP-W-10", f"{conn.name} sent READY again on the same connection")
            return
        conn.ready = True
        if self.expect_ready is not None:
            self.expect_ready = None
        others = [c for c in self.connections.values() if c is not conn and c.usable]
        for other in others:
            self.gave_up(other, now, "opened a new connection")

    def gave_up(self, conn: _Connection, now: float, how: str) -> None:
        """The worker left ``conn``: wrong only during a silence still short of liveness."""
        # Judged by the fuzzer's messages on that connection, not by the step's plan: a fuzzer
        # starved of CPU may have been silent longer than the step asked, and the silence ran
        # from its last message before the step, up to an interval earlier. The worker may have
        # decided before the fuzzer's first message after the silence reached it, so the
        # longest gap counts, not only the time since the last message.
        quiet = max(now - conn.last_sent, conn.longest_gap)
        if (
            self.short_silence is not None
            and self.short_silence[0] <= now
            and quiet < self.t.liveness * self.t.interval - self.t.slack
        ):
            self.flag(
                conn,
                "MDP-H-05",
                f"{conn.name}: the worker {how} after only {quiet:.2f} s "
                f"of broker silence, less than liveness x interval "
                f"({self.t.liveness * self.t.interval:.2f} s)",
            )

    def reply(self, conn: _Connection, command: mdp.WorkerPartial | mdp.WorkerFinal) -> None:
        kind = "FINAL" if isinstance(command, mdp.WorkerFinal) else "PARTIAL"
        if not conn.ready:
            self.flag(conn, "MDP-W-09", f"{conn.name} sent {kind} before READY")
        elif command.client in conn.holding:
            if kind == "FINAL":
                del conn.holding[command.client]
        elif command.client == GARBAGE_ADDRESS:
            self.flag(conn, "MDP-W-08", f"{conn.name} answered a malformed REQUEST with {kind}")
        elif command.client in conn.tolerated:
            pass
        elif conn.holding:
            self.flag(
                conn,
                "MDP-R-03",
                f"{conn.name} sent {kind} for client address {command.client!r}, not the "
                "address of the request it holds",
            )
        else:
            self.flag(conn, "MDP-R-01", f"{conn.name} sent {kind} without holding a REQUEST")
