"""Run one scenario against a running MDP/0.2 broker over real ZeroMQ sockets, and check it.

The fuzzer plays up to three workers and two clients, each a DEALER socket with a routing id of
its own, and models what a conforming broker may send each of them. Every message the broker
sends is parsed (MDP-W-08, MDP-C-02/03) and checked against that model as it arrives; timing rules
are checked with a tolerance (``slack``, see :class:`Timing`) made of the jitter measured during
the run, so that a conforming broker on a loaded machine is not flagged. The checks and the rule
each one reports:

- a REQUEST to a worker that has not sent its FINAL yet: MDP-A-06;
- a REQUEST whose client or body the fuzzer never sent for that worker's service: MDP-R-03,
  MDP-S-03 or MDP-C-09;
- anything to a worker more than ``slack`` after it sent DISCONNECT: MDP-W-13;
- anything to a worker silent for ``liveness * interval + slack``: MDP-H-07;
- no DISCONNECT within ``liveness * interval + slack`` after a valid but unexpected command:
  MDP-W-15; a DISCONNECT to a worker that never sent anything: MDP-W-14;
- a live registered worker that hears nothing for ``liveness * interval + slack``: MDP-H-04 if the
  broker never sent it a HEARTBEAT, else MDP-H-05 (the broker stopped treating it as alive);
- a reply to a client with nothing outstanding, or a second FINAL: MDP-C-06; naming another
  service: MDP-R-01; a body no worker sent: MDP-S-03; a FINAL a worker sent after it was dead for
  ``liveness * interval + slack``: MDP-D-10;
- after the scenario, a fresh worker and client must still be served (a probe); if not, the
  target has stopped working: MDP-W-16 when the scenario sent malformed messages, else MDP-A-01.

What must arrive, not only what may (each within ``forward_window``, from the agreed interval and
the jitter measured during the run, :mod:`domo.fuzz.jitter`): a PARTIAL or FINAL a worker sent for
a client still waiting (MDP-R-01); a queued request while a live worker of its service is idle
(MDP-S-01 when its worker was lost, else by the event that made it owed: MDP-C-10 when that
worker registered after it was queued, MDP-A-05 when it sent a FINAL or was already idle); an MMI
answer with the right code (MDP-M-01, MDP-M-02, unless ``mmi`` is off). Heartbeats at the interval:
a broker whose mean gap between messages to a live worker exceeds ``heartbeat_gap_limit`` breaks
MDP-H-04; the first probe measures the broker's interval and stops with "the intervals differ" when
it is not the agreed one. Where the spec leaves a choice, a check runs only when the target says
which it made (``dispatch="lru"``: MDP-A-04).
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import zmq

from . import frames as mdp
from .dialect import Wire
from .engine import Outcome, Violation
from .frames import FrameError
from .jitter import JitterMeter
from .scenario import (
    BODIES,
    CLIENTS,
    GARBAGE,
    MMI_QUERIES,
    REPLY_BODIES,
    SERVICES,
    STRAY_REPLIES,
    WORKERS,
    Step,
)

__all__ = ["BrokerRun", "NeverServed", "TargetDied", "Timing", "Unreachable", "Violation"]

_RUN_IDS: Final = itertools.count()
_HEARTBEAT: Final = (mdp.WORKER_HEADER, mdp.W_HEARTBEAT)
_DISCONNECT: Final = (mdp.WORKER_HEADER, mdp.W_DISCONNECT)
# The frame rules a message the broker sends is judged by, per command (MDP-W-08 for every one).
_FRAME_RULES: Final = {
    "REQUEST": ("MDP-W-02", "MDP-R-02"),
    "HEARTBEAT": ("MDP-W-05",),
    "DISCONNECT": ("MDP-W-06",),
    "client PARTIAL": ("MDP-C-02",),
    "client FINAL": ("MDP-C-03",),
}
_NOTHING_ASKED: Final = b"nothing-asked"  # the service of a majortomo reply to a client not waiting


@dataclass(frozen=True, slots=True)
class Timing:
    """The heartbeat interval and liveness agreed with the target, and the windows derived.

    Every window is the agreed interval (times the liveness where a rule counts intervals) plus
    ``slack``, which is made of the jitter measured during the run (:class:`JitterMeter`): the
    machine's scheduling delays and the spread of the target's heartbeats. ``slack`` is added to
    every deadline the fuzzer enforces and subtracted from every silence it treats as "certainly
    still alive". The windows are read when a check judges, so a stall just seen widens them.
    """

    interval: float
    liveness: int
    meter: JitterMeter = field(default_factory=JitterMeter, compare=False)

    @property
    def jitter(self) -> float:
        """The jitter measured so far (the largest recent sample, at least 5 ms)."""
        return self.meter.value

    @property
    def slack(self) -> float:
        """The margin of every window: 20 ms (a message's way through two sockets and the
        target's loop) plus four times the measured jitter (the sender's and the receiver's
        delay, each at both ends of the window)."""
        return 0.02 + 4 * self.jitter

    @property
    def forward_window(self) -> float:
        """How long a conforming broker may take to forward a reply or dispatch a request: one
        interval (a broker may do its work on its heartbeat tick) plus twice ``slack``."""
        return self.interval + 2 * self.slack

    @property
    def heartbeat_gap_limit(self) -> float:
        """The longest mean gap between messages to a live worker that still counts as
        heartbeating at the interval (MDP-H-04)."""
        return 1.4 * self.interval + 2 * self.jitter

    @property
    def dead_after(self) -> float:
        """Silence after which a conforming peer has certainly given the other up (MDP-H-05)."""
        return self.liveness * self.interval + self.slack

    @property
    def keep_alive_limit(self) -> float:
        """The longest the fuzzer may go without a message to a peer and still count it
        certainly alive to the target: ``liveness * interval`` less the way there (20 ms) and
        twice the jitter. A fuzzer later than that with a heartbeat (starved of CPU) may
        rightly have been given up."""
        return self.liveness * self.interval - 0.02 - 2 * self.jitter

    @property
    def probe_timeout(self) -> float:
        return max(2.0, 2 * self.dead_after)


class Unreachable(Exception):
    """The target never answered the first probe."""


class NeverServed(Unreachable):
    """The peer connected but never served, and broke rules on the way: ``violations``."""

    def __init__(self, message: str, violations: list[Violation]) -> None:
        super().__init__(message)
        self.violations = violations


class TargetDied(Exception):
    """The target stopped serving during a scenario; ``violation`` says which rule that breaks,
    ``seen`` what the scenario found before."""

    def __init__(self, violation: Violation, seen: Sequence[Violation] = ()) -> None:
        super().__init__(violation.explanation)
        self.violation = violation
        self.seen = list(seen)


@dataclass
class _Worker:
    name: str
    sock: zmq.Socket[bytes] | None = None
    service: bytes = b""
    registered: bool = False
    said_something: bool = False
    last_sent: float = 0.0
    last_heard: float = 0.0
    heartbeats_heard: int = 0
    holding: tuple[bytes, int] | None = None  # (client address, request seq)
    dead: bool = False
    disconnected_at: float | None = None
    expect_disconnect_since: float | None = None
    muted_until: float = 0.0
    gap_reported: bool = False
    idle_since: float = 0.0  # when it last became idle (READY or FINAL sent)
    ready_at: float = 0.0  # when it sent READY
    # When the broker first sent it something after its READY: the READY has certainly arrived
    # (a fresh socket's first message waits for its connection, which a loaded machine delays).
    registered_seen: float | None = None
    last_beat: float | None = None  # the last message from the broker while it was live
    disconnect_rule: str = "MDP-W-15"  # the rule a missing DISCONNECT breaks
    lost_request: tuple[bytes, int] | None = None  # what it held when it was lost (a zombie's)
    # The broker went silent to it for dead_after while it heartbeated: which rule that breaks
    # (MDP-H-04, no heartbeats; MDP-H-05, given up early) waits for what the broker does next.
    suspect_since: float | None = None
    suspect_busy: bool = False  # it held a request when the silence was seen
    suspect_silence: float = 0.0
    reg: _Registration | None = None  # its registration, for the MMI answers owed
    provoked: bool = False  # it sent something that a DISCONNECT may rightly answer
    kept: bool = False  # died busy in a dialect whose broker keeps busy workers (MDP01-12)
    sock_no: int = 0  # which of the scenario's sockets it uses now
    requests_got: int = 0  # REQUESTs that socket has received


@dataclass
class _Registration:
    """One READY the broker took: until when it may still count for its service (MDP-M-01)."""

    service: bytes
    ready_at: float
    gone_by: float = float("inf")  # the broker has certainly unregistered it by then
    # Its worker went silent idle in a dialect whose busy workers do not heartbeat: a request
    # of its service at the broker before this time may be given to it, and a busy worker is
    # never expired there (MDP01-12, MAJ-08), so it stays registered for good.
    kept_if_queued_before: float = float("-inf")


@dataclass
class _Client:
    address: bytes
    sock: zmq.Socket[bytes]
    seq: int = 0
    outstanding: tuple[bytes, int] | None = None  # (service, seq)
    mmi: tuple[frozenset[bytes], float, str] | None = None  # answers allowed, asked at, rule
    # What the MMI answer was judged by: live workers' READY times, registrations' "gone by"
    # times, the window then (judged again with a wider window if the broker ran late).
    mmi_basis: tuple[list[float], list[float], float] | None = None
    mmi_name: bytes = b""  # the service an mmi.service request asked about
    other_seq: int | None = None  # a second REQUEST on this socket: its reply may come instead
    created: float = field(default_factory=time.monotonic)  # when its socket was made


@dataclass
class _Request:
    """A request a client sent, as the broker should see it."""

    service: bytes
    body: tuple[bytes, ...]
    queued_since: float
    required: bool = True  # must be dispatched while a live worker of its service is idle
    state: str = "queued"  # queued, held, done
    losses: int = 0
    partial_sent: bool = False
    sibling: tuple[bytes, int] | None = None  # the other of two REQUESTs on one socket
    dispatched: bool = False
    sent_at: float = 0.0  # when the client sent it (its window may start later)
    arrived_by: float = 0.0  # the broker certainly has it by then (for the queue order)
    drop: bool = False  # a second REQUEST on one socket while the first stands: not queued
    partial_forwarded: bool = False  # its client got a PARTIAL of it
    dispatched_at: float = 0.0  # when its first REQUEST reached a worker
    # Where its first REQUEST came: (the worker's socket, how many REQUESTs that socket had
    # got before): two dispatches on one connection arrive in the order the broker sent them.
    dispatched_via: tuple[int, int] | None = None
    unseen: bool = False  # it may have gone to a socket the fuzzer left, unseen


@dataclass
class _Token:
    """A reply a worker sent, known by its first body frame."""

    client: bytes
    seq: int
    late: bool
    body: tuple[bytes, ...]
    forbidden: str = ""  # the rule broken if it is forwarded at all
    kind: str = "FINAL"  # or PARTIAL
    sent_at: float = field(default_factory=time.monotonic)
    # A stray reply sent before the broker had answered its worker's socket (its connection
    # not certainly up): the service of that worker, whose requests sent later may come first.
    unsure_for: bytes | None = None


class _Pacemaker:
    """An idle worker of a service of its own that the fuzzer keeps registered while a scenario
    runs, only to time the broker: the spread of the broker's heartbeats to it is a jitter
    sample, and a heartbeat overdue now says the broker is stalled now (judge nothing yet).
    Nothing it receives is judged: its findings would be the scenario's anyway."""

    def __init__(self, run: BrokerRun) -> None:
        self.run = run
        self.sock: zmq.Socket[bytes] | None = None
        self.sockets = 0
        self.last_sent = 0.0
        self.last_heard: float | None = None  # the broker's last message, while registered
        self.last_heartbeat: float | None = None
        self.long_stalls = 0  # gaps long enough for the broker to expire anyone, meanwhile
        self.last_drained: float | None = None
        self.registered_at = 0.0
        self.ever_heard = False  # the broker has heartbeated a pacemaker in this run
        self.heard_at = 0.0  # when a pacemaker last heard the broker (kept across registrations)
        self.late_beats: list[tuple[float, float]] = []  # a late heartbeat: began, how late
        # Not read from then until then, and the heartbeats missing in what was read after.
        self.blind: list[tuple[float, float, float]] = []

    def register(self) -> None:
        self.close()
        self.sockets += 1
        self.sock = self.run._socket(f"fz{self.run.run_id}-pace-{self.sockets}".encode())
        self.run.put(self.sock, mdp.worker_ready(f"fz.{self.run.run_id}.pace".encode()))
        self.last_sent = self.registered_at = time.monotonic()
        self.last_heard = self.last_heartbeat = self.last_drained = None

    def close(self) -> None:
        if self.sock is not None:
            self.run.put(self.sock, _DISCONNECT)
            self.sock.close(linger=0)
            self.sock = None

    def tick(self, now: float) -> None:
        """Heartbeat the broker; register again if the fuzzer itself was too late for that."""
        t = self.run.timing
        heard = self.last_sent if self.last_heard is None else self.last_heard
        # Two intervals at least: with a jitter past 90 ms at a 0.1 s interval and a liveness
        # of 3 the keep-alive limit falls under one interval, and a pacemaker heartbeating every
        # interval registered anew at every tick (20 sockets a second a lane: 271 in 10 s under
        # load, the broker flooded with registrations, a probe's worker found unreachable).
        if (
            self.sock is None
            or now - self.last_sent > max(t.keep_alive_limit, 2 * t.interval)
            or now - heard > t.dead_after + t.interval
        ):
            # The fuzzer was too late to keep it alive, or the broker has stopped talking to
            # it (expired while stalled, or it never heartbeats): start afresh.
            self.register()
        elif now - self.last_sent >= t.interval:
            self.run.put(self.sock, _HEARTBEAT)
            self.last_sent = now

    def drain(self) -> None:
        start = time.monotonic()
        blind_since = heard_before = None
        if self.last_drained is not None and start - self.last_drained > self.run.timing.interval:
            # Not read for a while (between scenarios, or the fuzzer stalled): a gap measured
            # across that would be the fuzzer's, not the broker's. What the broker sent
            # meanwhile is read next, so when it last spoke stays known.
            self.last_heartbeat = None
            blind_since, heard_before = self.last_drained, self.last_heard
        self.last_drained = start
        beats = 0
        while self.sock is not None and owner_sock_has(self.sock):
            frames = self.run.worker_in(self.sock.recv_multipart())
            now = time.monotonic()
            if list(frames[:2]) == list(_HEARTBEAT):
                beats += 1
                if self.last_heartbeat is not None:
                    gap = now - self.last_heartbeat
                    self.run.timing.meter.heartbeat_gap(self, gap, now)
                    t = self.run.timing
                    # The broker did not run for about gap - interval: long enough to expire a
                    # worker that heartbeats every interval once that reaches (liveness - 1) x
                    # interval.
                    if gap > t.liveness * t.interval:
                        self.long_stalls += 1
                    if gap > t.interval + t.slack:
                        # The broker was late from then on, by this much.
                        self.late_beats.append((now - gap, gap - t.interval))
                        del self.late_beats[:-50]
                self.last_heartbeat = now
                self.last_heard = self.heard_at = now
                self.ever_heard = True
            elif list(frames[:2]) == list(_DISCONNECT):
                self.register()
            else:
                self.last_heard, self.last_heartbeat, self.heard_at = now, None, now
        if blind_since is not None and heard_before is not None:
            # Whether the broker ran while the fuzzer did not read is not seen in the gaps: a
            # machine that starves the fuzzer starves the broker too, and what is read now in
            # a burst hides a stall of the broker (a FINAL sent after a worker's expiry, read
            # by a broker that woke late before it ran its timers, was judged MDP-D-10 under
            # load, issue 28). The heartbeats in the burst tell: a broker on time sent one an
            # interval; those missing are how late it may have run.
            t = self.run.timing
            missing = int((start - heard_before) / t.interval) - beats
            if missing > 1:
                self.blind.append((blind_since, start, missing * t.interval))
                del self.blind[:-50]

    def lag_since(self, since: float) -> float:
        """How late the broker ran (its heartbeats to the pacemaker overdue) at worst since
        ``since``; infinite if it is late now. What it sent after ``since`` may have been
        decided up to that much before it read what came at ``since``."""
        if self.stalled(time.monotonic()):
            return float("inf")
        t = self.run.timing
        late = [late for began, late in self.late_beats if began >= since - t.interval]
        # A time the pacemaker was not read that reaches past ``since``: the broker may have
        # been stalled all along, unseen.
        late += [lag for _, ended, lag in self.blind if ended >= since - t.interval]
        return max(late, default=0.0)

    def stalled(self, now: float) -> bool:
        """Is the broker's heartbeat to the pacemaker overdue now (the broker not running)?

        Overdue: more than ``interval + slack`` after its last message, or after the pacemaker
        registered if it has heard nothing since (its first registration: for the probe's
        timeout at most). A broker silent for ``dead_after`` after a registration anew is taken
        for one that does not heartbeat, and judged as it is.
        """
        t = self.run.timing
        if self.last_heard is not None:
            return now - self.last_heard > t.interval + t.slack
        if not self.ever_heard:
            # This run's first registration (a lane's first scenario): the broker's first
            # heartbeat to it overdue says the broker is not running now, as a later one does
            # (a broker not running then had its silence judged: MDP-W-10 under load, issue
            # 28). For the probe's timeout at most: a broker that never heartbeats is the first
            # probe's finding (MDP-H-04), and is judged as it is after that.
            waited = now - self.registered_at
            return t.interval + t.slack < waited < t.probe_timeout
        # Registered anew: overdue counted from when the broker last spoke to a pacemaker, not
        # from the registration, which the broker's silence may have caused (a broker that did
        # not run for 2.5 s under two CPU hogs made it register again, and the next interval
        # plus slack was judged as if the broker ran).
        waited = now - self.registered_at
        silent = now - max(self.heard_at, self.registered_at - t.dead_after - t.interval)
        return (
            self.ever_heard and t.interval + t.slack < silent and waited < t.dead_after + t.interval
        )


@dataclass
class BrokerRun:
    """A connection to one broker; :meth:`run` plays one scenario against it."""

    endpoint: str
    timing: Timing
    context: zmq.Context[zmq.Socket[bytes]] = field(default_factory=zmq.Context)
    owns_context: bool = True  # False: the lanes of a search share one, closed by the search
    # Unique across processes too: two runs against one broker must not share a routing id or
    # a service name, or the second would meet the first's leftover requests.
    run_id: str = field(default_factory=lambda: f"{secrets.token_hex(3)}{next(_RUN_IDS)}")
    examples: int = 0
    dispatch: str | None = None  # "lru": the target says it follows MDP-A-04's LRU choice
    mmi: bool = True  # judge MMI answers (MDP-M-01, MDP-M-02)
    coverage: Counter[str] = field(default_factory=Counter)
    measured_interval: float | None = None
    wire: Wire = field(default_factory=Wire)  # the dialect of the peers the fuzzer plays
    misframed: Violation | None = None  # the last probe message not in the dialect's framing
    _probe_request_sent: float = 0.0  # when the last probe's REQUEST left (its round trip)
    # The last probe's worker heard a HEARTBEAT after its REQUEST was sent: it was registered.
    probe_registered: bool = False
    probe_void: bool = False  # the last probe was not judged: the fuzzer itself stalled
    pacemaker: _Pacemaker = field(init=False)

    def __post_init__(self) -> None:
        self.pacemaker = _Pacemaker(self)

    def close(self) -> None:
        self.pacemaker.close()
        if self.owns_context:
            self.context.destroy(linger=0)

    def put(self, sock: zmq.Socket[bytes], frames: Sequence[bytes]) -> None:
        """Send a valid MDP/0.2 client or worker message, in the dialect's framing."""
        sock.send_multipart(self.wire.out(frames))

    def worker_in(self, frames: list[bytes]) -> list[bytes]:
        """A message to a worker as MDP/0.2 frames; an empty list if it is not framed as the
        dialect's (the scenario's checks report that; the probes just ignore it)."""
        try:
            return self.wire.worker_in(frames)
        except FrameError as error:
            self.misframed = Violation(error.rule, f"a worker received {error.reason}")
            return []

    def client_in(self, frames: list[bytes], service: bytes) -> list[bytes]:
        """A message to a client as MDP/0.2 frames, or an empty list (as :meth:`worker_in`)."""
        try:
            return self.wire.client_in(frames, service)
        except FrameError as error:
            self.misframed = Violation(error.rule, f"a client received {error.reason}")
            return []

    def _socket(self, identity: bytes) -> zmq.Socket[bytes]:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, identity)
        sock.connect(self.endpoint)
        return sock

    def first_probe(self) -> list[Violation]:
        """``Unreachable`` unless the broker serves a fresh worker and client in time.

        Then measure the broker's heartbeat interval and the jitter: ``NeverServed`` ("the
        intervals differ") when the broker heartbeats at another interval than the agreed one,
        so that a mismatch is named as such before any scenario is judged by it.
        """
        started = time.monotonic()
        # A broker just started on a loaded machine may take a while to answer at all.
        patience = max(5.0, self.timing.probe_timeout)
        if not self.probe("start", patience, registered_first=True):
            if self.misframed is not None:  # it answered, in another framing than the dialect's
                raise NeverServed(
                    f"the broker at {self.endpoint} did not answer in {self.wire.name}'s framing: "
                    f"{self.misframed.explanation}",
                    [self.misframed],
                )
            raise Unreachable(
                f"no MDP/0.2 broker answered at {self.endpoint} within {patience:.1f} s"
            )
        # From the REQUEST on: the probe's wait for the worker's registration is not a trip.
        round_trip = time.monotonic() - max(started, self._probe_request_sent)
        gaps = self.measure_heartbeats()
        beats = gaps[1:]  # the first gap is from the READY: not a heartbeat-to-heartbeat one
        spread = max(beats) - min(beats) if len(beats) > 1 else 0.0
        self.timing.meter.round_trip(round_trip)
        self.timing.meter.add(spread / 2, "heartbeat")
        interval = self.timing.interval
        if not gaps and self.misframed is not None:
            return [self.misframed]  # its heartbeats came, in another framing
        if not gaps:
            return [
                Violation(
                    "MDP-H-04",
                    f"a registered, heartbeating worker got no HEARTBEAT in "
                    f"{self.heartbeat_patience:.1f} s (interval {interval} s)",
                )
            ]
        measured = sum(gaps) / len(gaps)
        if measured > self.timing.heartbeat_gap_limit:
            # Measured again before the verdict: a broker starved of CPU for a moment on a
            # loaded machine heartbeats late, one at a different interval does so each time.
            again = self.measure_heartbeats()
            if again:
                measured = min(measured, sum(again) / len(again))
            # A broker heartbeats an idle worker an interval after its last heartbeat, never
            # sooner: two heartbeats closer than the limit show an interval within it, and a
            # mean above it the broker's lateness (starved of CPU for a while: 0.22 s at
            # 0.1 s under two CPU hogs). A broker at a longer interval has no such gap.
            shortest = min([*beats, *again[1:]], default=measured)
            measured = min(measured, shortest)
        self.measured_interval = measured
        if measured > self.timing.heartbeat_gap_limit or measured < interval / 2:
            message = (
                f"the intervals differ: broker {measured:.2f} s, fuzzer {interval} s "
                f"(give both the same --heartbeat-interval; MDP-H-04 asks for agreed intervals)"
            )
            raise NeverServed(message, [Violation("MDP-H-04", message)])
        return []

    @property
    def heartbeat_patience(self) -> float:
        # Generous: a broker starved of CPU on a loaded machine is late, not silent.
        return max(6.0, 6 * self.timing.interval)

    def measure_heartbeats(self) -> list[float]:
        """A fresh idle worker heartbeats at the agreed interval; the gaps between the broker's
        heartbeats to it (the first measured from its READY), up to four of them."""
        service = f"fz.{self.run_id}.hb".encode()
        worker = self._socket(f"fz{self.run_id}-hb".encode())
        try:
            self.put(worker, mdp.worker_ready(service))
            sent = last = time.monotonic()
            deadline = sent + self.heartbeat_patience
            gaps: list[float] = []
            while len(gaps) < 4 and (now := time.monotonic()) < deadline:
                if now - sent >= self.timing.interval:
                    self.put(worker, _HEARTBEAT)
                    sent = now
                wait = min(deadline, sent + self.timing.interval) - now
                if worker.poll(max(0, int(wait * 1000)) + 1, zmq.POLLIN):
                    frames = self.worker_in(worker.recv_multipart())
                    if list(frames[:2]) == list(_HEARTBEAT):
                        arrived = time.monotonic()
                        gaps.append(arrived - last)
                        last = arrived
            self.put(worker, _DISCONNECT)
            return gaps
        finally:
            worker.close(linger=100)

    def probe(self, tag: str, timeout: float, *, registered_first: bool = False) -> bool:
        """A fresh worker and client: is a request dispatched and its FINAL forwarded in time?

        ``registered_first`` (the first probe): the REQUEST waits for the broker's first
        HEARTBEAT to the worker, so that reaching the broker does not hang on dispatch-on-READY.
        """
        service = f"fz.{self.run_id}.{tag}.probe".encode()
        worker = self._socket(f"fz{self.run_id}-{tag}-pw".encode())
        client = self._socket(f"fz{self.run_id}-{tag}-pc".encode())
        last_sent = [time.monotonic()]
        t = self.timing

        def beat() -> float:
            # The probe's worker heartbeats while it waits, as any live worker does.
            now = time.monotonic()
            if now - last_sent[0] >= t.interval:
                self.put(worker, _HEARTBEAT)
                last_sent[0] = now
            return last_sent[0] + t.interval

        try:
            self.put(worker, mdp.worker_ready(service))
            deadline = time.monotonic() + timeout
            # The two sockets are two connections: a REQUEST sent now may reach the broker
            # before the READY, and then only dispatch-on-READY (MDP-C-10) would serve it; the
            # first probe asks whether the broker serves at all. So its REQUEST waits for the
            # broker's first HEARTBEAT to the worker, the sign it registered it, for at most 1.5
            # intervals (a broker that does not heartbeat is another rule's finding).
            if registered_first:
                _recv_until(
                    worker,
                    min(deadline, time.monotonic() + 1.5 * self.timing.interval),
                    self.worker_in,
                    lambda f: list(f[:2]) == list(_HEARTBEAT),
                    beat,
                )
            self.put(client, mdp.client_request(service, [b"probe"]))
            self._probe_request_sent = time.monotonic()
            self.probe_registered = self.probe_void = False

            def dispatched(frames: list[bytes]) -> bool:
                if list(frames[:2]) == list(_HEARTBEAT):
                    self.probe_registered = True  # the broker has the worker's READY
                return len(frames) >= 5 and frames[1] == mdp.W_REQUEST

            got = _recv_until(worker, deadline, self.worker_in, dispatched, beat)
            if got is None:
                return False
            if time.monotonic() - last_sent[0] > t.keep_alive_limit:
                # This process was too late to keep its worker alive (a stalled machine): the
                # broker may rightly have expired it. Not judged: probe again.
                self.probe_void = True
                return False
            # A token of the fuzzer's replies (tok:...), so that a scenario's client that gets it
            # knows it for another client's reply (MDP-R-03).
            self.put(worker, mdp.worker_reply(mdp.W_FINAL, got[2], [b"tok:probe-ok"]))
            reply = _recv_until(
                client,
                deadline,
                lambda f: self.client_in(f, service),
                lambda f: len(f) >= 4 and f[1] == mdp.C_FINAL,
            )
            self.put(worker, _DISCONNECT)
            return reply is not None
        finally:
            worker.close(linger=100)
            client.close(linger=0)

    def run(self, steps: list[Step]) -> list[Violation]:
        """Play ``steps``; the violations seen, in order (``TargetDied`` if the probe fails)."""
        self.examples += 1
        return _Scenario(self, f"e{self.examples}").play(steps)

    def play(self, plan: Sequence[object]) -> Outcome:
        """Play one plan of :class:`Step` for the search (:mod:`domo.fuzz.engine`)."""
        self.examples += 1
        scenario = _Scenario(self, f"e{self.examples}")
        steps = [step for step in plan if isinstance(step, Step)]
        try:
            seen = scenario.play(steps)
        except TargetDied as dead:
            return Outcome(dead.seen, frozenset(scenario.exercised), fatal=dead.violation)
        return Outcome(list(seen), frozenset(scenario.exercised))


def _recv_until(
    sock: zmq.Socket[bytes],
    deadline: float,
    translate: Callable[[list[bytes]], list[bytes]],
    wanted: Callable[[list[bytes]], bool],
    keep_alive: Callable[[], float] | None = None,
) -> list[bytes] | None:
    """The first message on ``sock`` that is ``wanted``, or None at ``deadline``;
    ``keep_alive`` (a probe's worker heartbeating) runs meanwhile, and says when next."""
    while (left := deadline - time.monotonic()) > 0:
        if keep_alive is not None:
            left = min(left, max(0.0, keep_alive() - time.monotonic()))
        if sock.poll(int(left * 1000) + 1, zmq.POLLIN):
            frames = translate(sock.recv_multipart())
            if wanted(frames):
                return frames
    return None


class _Scenario:
    def __init__(self, run: BrokerRun, tag: str) -> None:
        self.run = run
        self.t = run.timing
        self.tag = tag
        self.prefix = f"fz{run.run_id}-{tag}"
        self.services = [f"fz.{run.run_id}.{tag}.s{i}".encode() for i in range(SERVICES)]
        self.workers = [_Worker(f"w{i}") for i in range(WORKERS)]
        self.clients = [
            _Client(f"{self.prefix}-c{i}".encode(), run._socket(f"{self.prefix}-c{i}".encode()))
            for i in range(CLIENTS)
        ]
        self.sockets_made = 0
        self.token_prefix = f"tok:{self.prefix}:".encode()  # of this scenario's replies
        self.violations: list[Violation] = []
        self.tokens: dict[bytes, _Token] = {}
        # A client of another dialect is named to workers by a key the broker makes: both ways.
        self.aliases: dict[bytes, bytes] = {}  # the broker's key -> the fuzzer's client address
        self.address_for: dict[bytes, bytes] = {}
        self.requests: dict[tuple[bytes, int], _Request] = {}  # (client address, seq)
        self.due: dict[bytes, tuple[float, str, str]] = {}  # token -> sent when, rule, what
        self.abandoned: list[zmq.Socket[bytes]] = []
        self.had_garbage = False
        self.long_stalls_seen = run.pacemaker.long_stalls
        self.deferred_at: float | None = None  # when judging was last put off (broker stalled)
        self.ever_served: set[bytes] = set()  # services some worker sent READY for
        self.exercised: set[str] = set()
        self.beat_gaps: list[float] = []
        # service -> until when the broker may still hold a worker of it that the fuzzer has
        # left without a certain unregistration (after malformed messages, MDP-W-16 is only a
        # SHOULD): a request may go to it unseen, so no dispatch is required until then.
        self.unsure: dict[bytes, float] = {}
        self.registrations: list[_Registration] = []  # every READY the broker took
        self.senders: dict[bytes, _Worker] = {}  # a reply's token -> the worker that sent it
        self.strays: dict[bytes, _Worker] = {}  # the same, for stray replies sent unsure
        # Findings about something that came too late, judged again an interval later with
        # the windows then: a broker that stalled a moment ago shows it in the pacemaker's
        # next heartbeat, which may be read after the late message itself.
        self.confirms: list[tuple[float, Callable[[], bool], str, str]] = []
        # MDP-A-03: (the request overtaken, the one dispatched before it, judged when).
        self.overtakes: list[tuple[tuple[bytes, int], tuple[bytes, int], float, float]] = []
        # service -> until when a socket the fuzzer left may still get its requests unseen.
        self.unseen_until: dict[bytes, float] = {}

    # --- bookkeeping -----------------------------------------------------------------------

    def ready_after(self, service: bytes, since: float) -> bool:
        """Did a worker send READY for ``service`` after ``since``?"""
        return any(r.service == service and r.ready_at > since for r in self.registrations)

    def flag(self, rule: str, explanation: str) -> None:
        self.violations.append(Violation(rule, explanation))

    def confirm(self, check: Callable[[], bool], rule: str, explanation: str) -> None:
        """Flag ``rule`` an interval and a slack from now if ``check()`` still holds then."""
        due = time.monotonic() + self.t.interval + self.t.slack
        self.confirms.append((due, check, rule, explanation))

    def arm(self, *rules: str) -> None:
        """These rules' checks have something to judge in this scenario (rule coverage)."""
        self.exercised.update(rules)

    def send(self, w: _Worker, frames: Sequence[bytes]) -> None:
        assert w.sock is not None
        self.run.put(w.sock, frames)
        w.last_sent = time.monotonic()
        w.said_something = True

    def fresh_socket(self, w: _Worker) -> zmq.Socket[bytes]:
        self.retire(w)
        self.sockets_made += 1
        w.sock = self.run._socket(f"{self.prefix}-{w.name}-{self.sockets_made}".encode())
        w.sock_no, w.requests_got = self.sockets_made, 0
        now = time.monotonic()
        w.registered = w.said_something = w.dead = False
        w.holding = w.disconnected_at = w.expect_disconnect_since = None
        w.last_heard = w.last_sent = w.idle_since = now
        w.heartbeats_heard = 0
        w.gap_reported = False
        w.last_beat = None
        w.lost_request = None
        w.disconnect_rule = "MDP-W-15"
        w.suspect_since = None
        w.provoked = w.kept = False
        self.arm("MDP-W-14")
        return w.sock

    def unregistered_by(self, w: _Worker, when: float) -> None:
        """The broker has certainly unregistered ``w`` by ``when`` (for MMI, MDP-M-01), if its
        connection was up for what it last sent (else not certainly: never)."""
        if w.reg is not None:
            up = self.connected_at(w)
            if up is not None:
                w.reg.gone_by = min(w.reg.gone_by, when + max(0.0, up - w.last_sent))
            w.reg = None

    def silent_idle(self, w: _Worker) -> None:
        """``w`` went silent while idle and registered: where busy workers do not heartbeat,
        the broker may hand it a request before it expires it, and then never expire it."""
        if w.reg is not None and not self.run.wire.busy_workers_heartbeat:
            w.reg.kept_if_queued_before = self.expired_by(w)
            if self.queued_for(w.service):
                w.reg.gone_by = float("inf")

    def queued(self, service: bytes, at: float) -> None:
        """A request of ``service`` waits at the broker from ``at``: a silent worker of it not
        yet expired by then may be given it and so stay registered (``silent_idle``)."""
        for reg in self.registrations:
            if reg.service == service and at < reg.kept_if_queued_before:
                reg.gone_by = float("inf")

    def connected_at(self, w: _Worker) -> float | None:
        """By when ``w``'s connection was certainly up: when the broker first sent its socket
        something (None: not yet). A message ``w`` sent at ``t`` reached the broker by
        ``max(t, connected_at) + slack``: a fresh socket's first messages wait for the
        connection, which a loaded machine can delay for long."""
        return w.registered_seen

    def retire(self, w: _Worker) -> None:
        if w.sock is not None:
            if (
                w.registered
                and w.disconnected_at is None
                and w.service
                and time.monotonic() < self.expired_by(w)
            ):
                # The broker may still count it registered (idle, or dead and not yet expired):
                # until it has certainly expired it, a request of its service may be sent to
                # this socket, which goes unread, and come back later as lost. How often such
                # a request was lost is then not known (a broker may drop it after a number of
                # losses, MDP-D-08), nor when it was first dispatched: it is required no more,
                # nor its order judged (the README's fuzz block named MDP-S-01 on domo's broker:
                # a request dispatched unseen to a dead worker's socket, then twice more).
                until = max(self.unseen_until.get(w.service, 0.0), self.expired_by(w))
                self.unseen_until[w.service] = until
                for r in self.requests.values():
                    if r.service == w.service and r.state == "queued":
                        r.required, r.unseen = False, True
                self.silent_idle(w)
            self.abandoned.append(w.sock)
            w.sock = None
        # It sends nothing more: certainly expired one interval after dead_after at the latest.
        self.unregistered_by(w, self.expired_by(w))
        self.resolve_silence(w, at_end=True)
        self.lose(w, time.monotonic())
        w.registered = False
        w.expect_disconnect_since = None
        w.disconnected_at = None

    def lose(self, w: _Worker, at: float) -> None:
        """``w`` is lost to the broker by ``at``: the request it held goes back to its queue."""
        if w.holding is None:
            return
        r = self.requests.get(w.holding)
        w.lost_request, w.holding = w.holding, None
        if r is None or r.state != "held":
            return
        r.state = "queued"
        r.losses += 1
        r.queued_since = at
        self.queued(r.service, at)
        if at < self.unseen_until.get(r.service, 0.0):
            r.required, r.unseen = False, True
        if r.partial_forwarded:
            self.arm("MDP-D-09")  # it must not be dispatched again
        # MDP-S-01: resent to another worker, at least once; after a PARTIAL a broker may drop
        # it instead (MDP-D-09), and after that one resend it may give up (MDP-D-08).
        r.required = r.required and r.losses == 1 and not r.partial_sent
        if r.required:
            self.arm("MDP-S-01")

    def kept(self, w: _Worker) -> bool:
        """Is ``w`` kept busy by the broker however silent (see ``keeps_busy``)? A call, so
        that it is read afresh after a pump (which may dispatch to ``w``)."""
        return w.kept

    def keeps_busy(self, w: _Worker) -> bool:
        """Is ``w`` busy in a dialect whose busy workers the broker never expires within the
        liveness span (they do not heartbeat while busy)?"""
        return w.holding is not None and not self.run.wire.busy_workers_heartbeat

    def expired_by(self, w: _Worker) -> float:
        """When the broker has certainly expired the silent ``w``: ``dead_after`` after its last
        message, plus one interval, since a broker may check expiry on its heartbeat tick."""
        return w.last_sent + self.t.dead_after + self.t.interval

    def queued_for(self, service: bytes) -> bool:
        return any(r.state == "queued" and r.service == service for r in self.requests.values())

    def leave(self, w: _Worker) -> None:
        """``w`` may or may not have been expired by the broker (its silence came near the
        expiry): both outcomes are allowed, so the fuzzer stops judging it, as after garbage."""
        self.lose(w, self.expired_by(w))
        self.unsure[w.service] = w.last_sent + self.t.dead_after
        self.retire(w)

    def live_workers_of(self, service: bytes) -> list[_Worker]:
        return [w for w in self.workers if self.beats(w) and not w.dead and w.service == service]

    # --- playing ---------------------------------------------------------------------------

    def play(self, steps: list[Step]) -> list[Violation]:
        try:
            for step in steps:
                self.do(step)
                self.pump(time.monotonic() + 0.005)
            # Let every pending deadline pass, so that late messages, missing DISCONNECTs and
            # missing heartbeats show: any worker still connected has one.
            pending = any(w.sock is not None for w in self.workers) or bool(self.due)
            settle = time.monotonic()
            self.pump(settle + (self.t.dead_after if pending else self.t.slack))
            # And until every window the scenario opened has closed (a request lost with its
            # worker is due forward_window after that worker's expiry, which dead_after from
            # the last step does not cover): what must arrive is judged, not cut short. Bounded.
            open_until = min(self.open_windows(), settle + 2 * self.t.dead_after)
            if open_until > time.monotonic():
                self.pump(open_until + 0.005)
            if self.deferred_at is not None and self.deferred_at >= settle:
                # Judging was put off while the broker stalled: give it the time it lost.
                self.pump(time.monotonic() + self.t.dead_after)
            for w in self.workers:
                self.resolve_silence(w, at_end=True)
            self.judge_heartbeat_rate()
            self.arm("MDP-W-16" if self.had_garbage else "MDP-A-01")
            served = self.run.probe(self.tag, self.t.probe_timeout)
            for again in range(2):  # a probe this process was too slow to keep alive
                if served or not self.run.probe_void:
                    break
                served = self.run.probe(f"{self.tag}v{again}", self.t.probe_timeout)
            if not served and self.run.probe_void:
                return self.violations  # every probe stalled in this process: not judged
            if not served:
                if self.run.probe_registered and self.run.probe(
                    f"{self.tag}r", self.t.probe_timeout, registered_first=True
                ):
                    # It serves a REQUEST sent after its worker registered, but the probe's,
                    # which may have come just before the READY, still waited while that worker
                    # was registered and idle: not dispatched when the worker came.
                    self.arm("MDP-C-10")
                    self.flag(
                        "MDP-C-10",
                        "a request queued as a fresh worker of its service registered was not "
                        f"dispatched to it within {self.t.probe_timeout:.1f} s (the broker "
                        "serves one sent after the registration)",
                    )
                    return self.violations
                # Once more after the liveness span, and once the broker heartbeats the
                # pacemaker again (at most 10 s): a broker starved of CPU for a while is slow,
                # not stopped (a stopped one costs this wait once, at the end).
                give_up = time.monotonic() + 10.0
                self.pump(time.monotonic() + self.t.dead_after)
                while (now := time.monotonic()) < give_up and self.run.pacemaker.stalled(now):
                    self.pump(now + self.t.interval)
                if self.run.probe(f"{self.tag}w", self.t.probe_timeout, registered_first=True):
                    return self.violations
                rule = "MDP-W-16" if self.had_garbage else "MDP-A-01"
                why = (
                    "after malformed messages the broker no longer serves a fresh worker and client"
                    if self.had_garbage
                    else "the broker no longer serves a fresh worker and client"
                )
                raise TargetDied(Violation(rule, why), self.violations)
            return self.violations
        finally:
            self.run.coverage.update(self.exercised)
            for w in self.workers:
                if w.sock is not None and w.registered:
                    self.run.put(w.sock, _DISCONNECT)
                self.retire(w)
            for sock in [*self.abandoned, *(c.sock for c in self.clients)]:
                sock.close(linger=0)

    def open_windows(self) -> float:
        """When the last window still open closes: a reply due, an MMI answer due, a DISCONNECT
        due, or a queued request that must be dispatched to a live idle worker of its service."""
        t = self.t
        ends = [since + t.forward_window for since, _, _ in self.due.values()]
        ends += [c.mmi[1] + t.forward_window for c in self.clients if c.mmi is not None]
        ends += [when for _, _, _, when in self.overtakes]
        ends += [due for due, _, _, _ in self.confirms]
        ends += [
            w.expect_disconnect_since + t.dead_after
            for w in self.workers
            if w.expect_disconnect_since is not None
        ]
        for r in self.requests.values():
            if r.state != "queued" or not r.required:
                continue
            idle = [w.idle_since for w in self.live_workers_of(r.service) if w.holding is None]
            if idle:
                ends.append(max(r.queued_since, min(idle)) + t.forward_window)
        return max(ends, default=0.0)

    def judge_heartbeat_rate(self) -> None:
        # MDP-H-04 asks for heartbeats at the agreed interval: judged on the mean gap, so that
        # one late message on a loaded machine is not a finding, but a slow broker is.
        if len(self.beat_gaps) < 6:
            return
        self.arm("MDP-H-04")
        mean = sum(self.beat_gaps) / len(self.beat_gaps)
        if mean > self.t.heartbeat_gap_limit:
            self.flag(
                "MDP-H-04",
                f"the broker sent live workers a message every {mean:.3f} s on average "
                f"({len(self.beat_gaps)} gaps), not every {self.t.interval} s",
            )

    def new_client_socket(self, c: _Client, actor: int) -> None:
        # It gives up waiting and asks again on a new socket, as MDP-C-08 recommends; the old
        # request may still be served, to the old address, which is gone.
        self.abandoned.append(c.sock)
        self.sockets_made += 1
        c.address = f"{self.prefix}-c{actor}-{self.sockets_made}".encode()
        c.sock = self.run._socket(c.address)
        c.created = time.monotonic()
        c.outstanding = c.other_seq = None
        c.mmi = None
        for token, (_, rule, _) in list(self.due.items()):
            if rule == "MDP-R-01" and self.tokens[token].client != c.address:
                origin = self.tokens[token]
                if not any(cl.address == origin.client for cl in self.clients):
                    del self.due[token]  # its client has gone: nothing can be seen

    def client_request(self, c: _Client, actor: int, service: bytes, body_index: int) -> None:
        if c.outstanding is not None or c.mmi is not None:
            self.new_client_socket(c, actor)
        c.seq += 1
        ident = c.address + b":" + str(c.seq).encode()
        _, template = BODIES[body_index % len(BODIES)]
        body = tuple(ident if f == b"{id}" else f for f in template)
        if self.run.wire.name != "mdp02" and body[0] != ident:
            # A client of another dialect is named to workers by a key the broker makes,
            # learnt from the body of its first request: each body must tell whose it is.
            body = (ident, *body)
        now = time.monotonic()
        nobody = not self.live_workers_of(service)
        # On a socket made a moment ago the REQUEST leaves only once the connection is up (a
        # round trip through both ends): its window starts one forward_window after the socket.
        since = max(now, c.created + self.t.forward_window)
        unseen = now < self.unseen_until.get(service, 0.0)
        self.requests[(c.address, c.seq)] = _Request(
            service, body, since, sent_at=now, arrived_by=since, required=not unseen, unseen=unseen
        )
        c.outstanding = (service, c.seq)
        self.run.put(c.sock, mdp.client_request(service, list(body)))
        self.queued(service, now)
        self.arm("MDP-S-03", "MDP-C-10" if nobody else "MDP-A-05")

    def second_request(self, c: _Client, actor: int, service: bytes) -> None:
        if not self.run.wire.one_outstanding:
            # An MDP/0.1 client may keep several requests outstanding, each served
            # (MDP01-09): not judged as MDP-S-02 there; the second goes as a request anew.
            self.client_request(c, actor, service, 0)
            return
        if c.outstanding is None:
            self.client_request(c, actor, self.services[0], 0)
        assert c.outstanding is not None
        first = (c.address, c.outstanding[1])
        c.seq += 1
        body = (c.address + b":second:" + str(c.seq).encode(),)
        now = time.monotonic()
        second = _Request(service, body, now, required=False, sibling=first, sent_at=now)
        self.requests[(c.address, c.seq)] = second
        r1 = self.requests.get(first)
        if r1 is not None and r1.state in ("queued", "held") and r1.losses == 0:
            # The first is outstanding for certain (its worker has not answered, nor been
            # lost), and both come on one socket, in order: the second is dropped and the
            # first stands (MDP-S-02, MDP-D-12).
            second.drop = True
            r1.sibling = (c.address, c.seq)
            self.arm("MDP-D-12")
        else:
            # The first may have ended meanwhile: at most one of the two is served, either.
            c.other_seq = c.seq
            if r1 is not None:
                r1.required = False
                r1.sibling = (c.address, c.seq)
        self.run.put(c.sock, mdp.client_request(service, list(body)))
        self.queued(service, now)
        self.arm("MDP-S-02")

    def mmi(self, c: _Client, actor: int, which: int) -> None:
        if not self.run.mmi:
            return
        if c.outstanding is not None or c.mmi is not None:
            self.new_client_socket(c, actor)
        now = time.monotonic()
        due = now  # answered within forward_window of this
        if which == 3:
            self.run.put(c.sock, mdp.client_request(b"mmi.nosuch", [b"x"]))
            c.mmi = (frozenset({b"501"}), due, "MDP-M-02")
            self.arm("MDP-M-02")
            return
        if which == 2:
            name, allowed = f"fz.{self.run.run_id}.{self.tag}.nobody".encode(), {b"404"}
        else:
            # A busy worker's service (MDP-M-01: a worker serves it, idle or busy).
            busy = [w.service for w in self.workers if w.holding is not None and self.beats(w)]
            name = self.services[which] if which < SERVICES else (busy or self.services)[0]
            # A READY that may not have reached the broker yet, or a registration the broker
            # is about to drop for certain (after a DISCONNECT, or the liveness span of a
            # worker gone silent), leaves the answer open (200 or 404): let them settle first,
            # so that the answer is judged.
            window = self.t.forward_window
            ahead = self.t.dead_after + self.t.interval + window
            regs = [r for r in self.registrations if r.service == name]
            settle = [w.ready_at + window for w in self.live_workers_of(name)]
            settle += [r.gone_by for r in regs if now < r.gone_by < now + ahead]
            if settle and max(settle) > now:
                self.pump(max(settle) + 0.001)
                now = due = time.monotonic()
            settled = [
                w
                for w in self.live_workers_of(name)
                if now - w.ready_at > window and now - w.last_heard < self.t.dead_after
            ]
            if settled:
                allowed = {b"200"}  # a live worker serves it (idle or busy)
            elif all(r.gone_by < now for r in regs):
                allowed = {b"404"}  # never served, or every worker it had is gone for certain
            else:
                allowed = {b"200", b"404"}  # a worker came or went just now
            c.mmi_basis = ([w.ready_at for w in settled], [r.gone_by for r in regs], window)
        if which == 2:
            c.mmi_basis = None
        self.run.put(c.sock, mdp.client_request(b"mmi.service", [name]))
        c.mmi, c.mmi_name = (frozenset(allowed), due, "MDP-M-01"), name
        self.arm("MDP-M-01")

    def do(self, step: Step) -> None:
        now = time.monotonic()
        if step.kind == "wait":
            self.pump(now + step.arg * self.t.interval / 2)
            return
        if step.kind == "settle":
            self.settle()
            return
        if step.kind in ("request", "second-request", "mmi"):
            c = self.clients[step.actor % len(self.clients)]
            if step.kind == "request":
                service = self.services[step.arg % SERVICES]
                self.client_request(c, step.actor, service, step.arg // SERVICES)
            elif step.kind == "second-request":
                self.second_request(c, step.actor, self.services[step.arg % SERVICES])
            else:
                self.mmi(c, step.actor, step.arg % len(MMI_QUERIES))
            return
        w = self.workers[step.actor % len(self.workers)]
        if step.kind in ("reply", "partial"):
            self.await_dispatch()
        holders = [x for x in self.workers if x.holding is not None and self.beats(x)]
        if holders and (
            (step.kind in ("die", "disconnect") and step.arg == 1)
            or step.kind in ("reply", "partial")
        ):
            # The holder dies, or replies: a reply from a worker that holds nothing would do
            # nothing, and which worker got the request is the broker's choice.
            w = w if w in holders else holders[0]
        actor = self.workers.index(w)
        if self.beats(w) and now - w.last_sent > self.t.keep_alive_limit:
            # The silence the fuzzer actually produced (a stall, or a pause that began well
            # after its last heartbeat) is near the expiry: the broker may have expired it or
            # not, and what this step sends would be judged as one of the two. Leave it.
            self.leave(w)
        live = w.sock is not None and not w.dead and w.disconnected_at is None
        needs_ready = (
            step.kind in ("heartbeat", "disconnect", "die", "pause")
            or (step.kind == "unexpected" and step.arg % 4 != 3)
            or (step.kind == "late-final" and not w.dead)
            or (step.kind == "stray-reply" and step.arg % len(STRAY_REPLIES) == 4)
        )
        if needs_ready and not (live and w.registered):
            # A step that needs a registered worker registers it first (on s0), so that
            # random scenarios rarely waste a step and shrinking keeps them short.
            self.do(Step("ready", actor, 0))
            self.pump(time.monotonic() + 0.005)
            live = w.sock is not None and not w.dead and w.disconnected_at is None
            if not (live and w.registered):
                return  # left meanwhile (the broker or the fuzzer stalled): nothing to do
        match step.kind:
            case "ready" if step.arg == SERVICES:
                # READY for a name the broker reserves for MMI (MDP-D-14): refused with DISCONNECT.
                if self.run.mmi:
                    self.fresh_socket(w)
                    w.service = f"mmi.fz.{self.run.run_id}.{self.tag}".encode()
                    self.send(w, mdp.worker_ready(w.service))
                    self.expect_disconnect(w, "MDP-D-14")
            case "ready":
                if not w.registered or not live:
                    self.fresh_socket(w)
                    w.service = self.services[step.arg % SERVICES]
                    self.send(w, mdp.worker_ready(w.service))
                    w.registered = True
                    w.idle_since = w.ready_at = time.monotonic()
                    w.registered_seen = None
                    w.reg = _Registration(w.service, w.ready_at)
                    self.registrations.append(w.reg)
                    self.ever_served.add(w.service)
                    self.arm("MDP-H-04", "MDP-H-05")
                    if self.queued_for(w.service):
                        self.arm("MDP-C-10")  # a queued request is owed to it now
            case "reply":
                if live and w.registered and w.holding is not None:
                    extra = REPLY_BODIES[step.arg // 3 % len(REPLY_BODIES)][1]
                    # An MDP/0.1 worker has one REPLY, no PARTIAL (MDP01-04).
                    partials = step.arg % 3 if self.run.wire.worker_partials else 0
                    for _ in range(partials):
                        self.send_reply(w, mdp.W_PARTIAL, late=False, extra=extra)
                    self.send_reply(w, mdp.W_FINAL, late=False, extra=extra)
                    r = self.requests.get(w.holding)
                    if r is not None:
                        r.state = "done"
                    w.holding = w.lost_request = None
                    w.idle_since = time.monotonic()
                    if self.queued_for(w.service):
                        self.arm("MDP-A-05")  # the next queued request is owed to it now
            case "partial":
                # MDP/0.1's worker has no PARTIAL (MDP01-04).
                if (
                    live
                    and w.registered
                    and w.holding is not None
                    and self.run.wire.worker_partials
                ):
                    self.send_reply(w, mdp.W_PARTIAL, late=False)
            case "heartbeat":
                if live and w.registered:
                    self.send(w, _HEARTBEAT)
            case "disconnect":
                if live and w.said_something:
                    self.send(w, _DISCONNECT)
                    w.registered = False
                    self.lose(w, time.monotonic())
                    w.disconnected_at = time.monotonic()
                    self.unregistered_by(w, w.disconnected_at + self.t.forward_window)
                    self.arm("MDP-W-13")
            case "die":
                if live and w.registered and self.keeps_busy(w):
                    # A busy worker of a dialect whose workers do not heartbeat while busy
                    # stays registered and busy however silent (MDP01-12, MAJ-08): nothing
                    # about it is judged from here on.
                    w.dead = w.kept = True
                    self.unsure[w.service] = float("inf")
                elif live and w.registered:
                    w.dead = True
                    self.lose(w, self.expired_by(w))
                    self.silent_idle(w)
                    self.unregistered_by(w, self.expired_by(w))
                    self.arm("MDP-H-07")
                    if not self.run.wire.busy_workers_heartbeat:
                        # Until the broker expires it, it may hand the dead worker a request
                        # of its service, which then stays with it however silent (MDP01-12,
                        # MAJ-08); the socket may be abandoned unread, so the fuzzer may not
                        # see it: that service's dispatch is not judged from here on.
                        self.unsure[w.service] = float("inf")
            case "late-final":
                # Die first if alive; send the FINAL once the broker has certainly expired the
                # worker, so that a random scenario needs no exact run of waits for MDP-D-10.
                if w.kept or (live and w.registered and self.keeps_busy(w)):
                    return  # never expired while busy in this dialect: no late FINAL to send
                if live and w.registered:
                    w.dead = True
                if w.dead and w.sock is not None:
                    self.lose(w, self.expired_by(w))
                    # Until the broker has certainly expired it: the window is read afresh
                    # (it widens with the jitter), and a stalled broker has not run its timers.
                    give_up = time.monotonic() + 4 * self.t.dead_after
                    while (now := time.monotonic()) < give_up and (
                        now < self.expired_by(w) or self.run.pacemaker.stalled(now)
                    ):
                        self.pump(min(give_up, max(self.expired_by(w), now + 0.01)) + 0.001)
                if self.kept(w):
                    return  # a request reached it while it waited: busy, so never expired
                held = w.holding or w.lost_request
                now = time.monotonic()
                if w.dead and held is not None and w.sock is not None and now >= self.expired_by(w):
                    w.holding = held  # the reply names the request it held
                    self.send_reply(w, mdp.W_FINAL, late=True)
                    w.holding = None
                    self.arm("MDP-D-10")
                    self.unsure[w.service] = time.monotonic() + self.t.dead_after
                    self.retire(w)  # a zombie: whatever the broker says to it now is allowed
            case "pause":
                if live and w.registered:
                    # The silence is counted from the worker's last message, not from this step
                    # (up to an interval later): the broker counts from what it last heard.
                    longest = self.t.liveness * self.t.interval - self.t.slack
                    until = min(now + step.arg * self.t.interval / 2, w.last_sent + longest)
                    w.muted_until = max(now, until)
                    self.arm("MDP-H-05")
            case "unexpected":
                self.unexpected(w, live, step.arg % 4)
            case "stray-reply":
                self.stray_reply(w, live, step.arg % len(STRAY_REPLIES))
            case "garbage":
                sock = w.sock if live and w.sock is not None else self.fresh_socket(w)
                _, template = GARBAGE[step.arg % len(GARBAGE)]
                svc = w.service or self.services[0]
                garbage = self.run.wire.garbage([svc if f == b"{svc}" else f for f in template])
                if garbage is None:
                    return  # valid in some dialect once framed: no near-miss here
                sock.send_multipart(garbage)
                self.had_garbage = True
                self.arm("MDP-W-16")
                # The broker may treat this peer as invalid from now on; its request certainly
                # goes back once the broker has expired it.
                self.lose(w, self.expired_by(w))
                if w.service:
                    self.unsure[w.service] = w.last_sent + self.t.dead_after
                self.retire(w)

    def settle(self) -> None:
        """Wait until every request still queued has certainly reached the broker: its
        ``arrived_by`` and half again the slack are past (the slack read afresh: it widens with
        the jitter), and the broker runs (its heartbeat to the pacemaker is not overdue). What
        is sent next then certainly comes after them, on a loaded machine too, where a fixed
        wait falls short of the slack (MDP-A-03 judges only requests in a certain order). At
        most 2 s (ten intervals if longer): a machine that stalls for seconds widens the slack
        past what any wait is worth, and the order is then left unjudged."""
        give_up = time.monotonic() + max(2.0, 10 * self.t.interval)
        while (now := time.monotonic()) < give_up:
            pending = [
                r.arrived_by
                for r in self.requests.values()
                if r.state == "queued" and not r.dispatched and not r.drop
            ]
            if not self.run.pacemaker.stalled(now) and all(
                now > arrived + 1.5 * self.t.slack for arrived in pending
            ):
                return
            self.pump(min(give_up, now + 0.01))

    def await_dispatch(self) -> None:
        """A reply needs a request held: if none is held but one is owed to an idle worker
        (queued, a live worker of its service idle), wait for it, at most ``forward_window``."""
        deadline = time.monotonic() + self.t.forward_window
        while time.monotonic() < deadline:
            if any(x.holding is not None and self.beats(x) for x in self.workers):
                return
            owed = any(
                r.state == "queued"
                and any(x.holding is None for x in self.live_workers_of(r.service))
                for r in self.requests.values()
            )
            if not owed:
                return
            self.pump(min(deadline, time.monotonic() + 0.01))

    def unexpected(self, w: _Worker, live: bool, which: int) -> None:
        # Each cell's rule is the one the transition table gives (specs/mdp-0.2.md section 10).
        if which == 3:  # HEARTBEAT before READY, on a fresh socket: UNKNOWN, HEARTBEAT
            self.fresh_socket(w)
            self.send(w, _HEARTBEAT)
            self.expect_disconnect(w, "MDP-H-01")
            return
        if not (live and w.registered):
            return
        if which == 0:  # IDLE or BUSY, READY
            self.send(w, mdp.worker_ready(w.service))
            self.expect_disconnect(w, "MDP-W-10")
            return
        if which == 1:
            if w.holding is not None or self.queued_for(w.service):
                return  # a request on its way to it would make the FINAL expected
            # IDLE, FINAL: DISCONNECT, never forwarded (MDP-W-15).
            self.send_stray(w, mdp.W_FINAL, self.waiting_client(), "MDP-W-15")
        elif self.run.wire.worker_sends_request:
            self.send(w, [mdp.WORKER_HEADER, mdp.W_REQUEST, self.clients[0].address, b"", b"x"])
        else:
            return
        self.expect_disconnect(w, "MDP-W-15")

    def expect_disconnect(self, w: _Worker, rule: str) -> None:
        w.expect_disconnect_since = time.monotonic()
        w.disconnect_rule = rule
        w.provoked = True
        w.registered = False
        self.unregistered_by(w, self.expired_by(w))
        self.lose(w, time.monotonic())
        self.arm(rule)

    def waiting_client(self) -> _Client:
        waiting = [c for c in self.clients if c.outstanding is not None]
        return waiting[0] if waiting else self.clients[0]

    def stray_reply(self, w: _Worker, live: bool, which: int) -> None:
        code = mdp.W_FINAL if which in (0, 2, 4) else mdp.W_PARTIAL
        if not self.run.wire.worker_partials:
            code = mdp.W_FINAL  # an MDP/0.1 worker's only reply (MDP01-04)
        if which in (0, 1):
            self.fresh_socket(w)
            c = self.waiting_client()
            # UNKNOWN, PARTIAL or FINAL: DISCONNECT, never forwarded (MDP-W-15).
            self.send_stray(w, code, c, "MDP-W-15")
            self.expect_disconnect(w, "MDP-W-15")
        elif which in (2, 3):
            if not (live and w.registered and w.holding is not None):
                return
            others = [c for c in self.clients if c.address != w.holding[0]]
            self.send_stray(w, code, others[0], "MDP-D-13")
            self.expect_disconnect(w, "MDP-D-13")
        else:
            if not (live and w.registered):
                return
            held = w.holding[0] if w.holding else None
            holder = next((c for c in self.clients if c.address == held), None)
            self.send(w, _DISCONNECT)
            w.registered = False
            self.lose(w, time.monotonic())
            w.disconnected_at = time.monotonic()
            self.unregistered_by(w, w.disconnected_at + self.t.forward_window)
            self.send_stray(w, code, holder or self.waiting_client(), "MDP-D-10")
            self.arm("MDP-W-13")

    def send_stray(self, w: _Worker, code: bytes, c: _Client, rule: str) -> None:
        token = self.token_prefix + str(len(self.tokens)).encode()
        seq = c.outstanding[1] if c.outstanding is not None else 0
        # Only a registered worker's (its READY on this socket): the broker may dispatch to it.
        unsure = w.service if w.registered and self.connected_at(w) is None else None
        self.tokens[token] = _Token(
            c.address, seq, False, (token,), forbidden=rule, unsure_for=unsure
        )
        if unsure is not None:
            self.strays[token] = w
        self.send(w, [mdp.WORKER_HEADER, code, self.opaque(c.address), b"", token])
        self.arm(rule)

    def send_reply(
        self, w: _Worker, code: bytes, *, late: bool, extra: tuple[bytes, ...] = ()
    ) -> None:
        assert w.holding is not None
        client, seq = w.holding
        token = self.token_prefix + str(len(self.tokens)).encode()
        body = (token, *extra)
        kind = "FINAL" if code == mdp.W_FINAL else "PARTIAL"
        self.tokens[token] = _Token(client, seq, late, body, kind=kind)
        self.senders[token] = w
        self.send(w, [mdp.WORKER_HEADER, code, self.opaque(client), b"", *body])
        r = self.requests.get((client, seq))
        if r is not None and code == mdp.W_PARTIAL:
            r.partial_sent = True
        waiting = any(c.address == client and c.outstanding is not None for c in self.clients)
        if not late and waiting and (kind == "FINAL" or self.run.wire.client_partials):
            self.due[token] = (
                time.monotonic(),
                "MDP-R-01",
                f"{w.name}'s {kind}",
            )
            self.arm("MDP-R-01", "MDP-C-06")

    # --- receiving and checking --------------------------------------------------------------

    def pump(self, until: float) -> None:
        poller = zmq.Poller()
        socks: dict[zmq.Socket[bytes], _Worker | _Client] = {}
        for w in self.workers:
            if w.sock is not None:
                socks[w.sock] = w
        for c in self.clients:
            socks[c.sock] = c
        for s in socks:
            poller.register(s, zmq.POLLIN)
        pace = self.run.pacemaker
        pace.tick(time.monotonic())
        pace_sock = pace.sock
        if pace_sock is not None:
            poller.register(pace_sock, zmq.POLLIN)
        ready: list[zmq.Socket[bytes]] = list(socks)
        while True:
            pace.drain()
            # Read everything that has arrived before judging any silence: after a stall of the
            # fuzzer's own process the target's messages are waiting here, not missing.
            for sock in ready:
                if sock not in socks:
                    continue  # the pacemaker's, drained above
                owner = socks[sock]
                while owner_sock_has(sock):
                    frames = sock.recv_multipart()
                    if owner.sock is not sock:
                        continue  # a socket the actor has left; what comes to it is allowed
                    if isinstance(owner, _Worker):
                        self.to_worker(owner, frames)
                    else:
                        self.to_client(owner, frames)
            now = time.monotonic()
            pace.tick(now)
            if pace.sock is not pace_sock:  # registered again on a new socket
                if pace_sock is not None:
                    poller.unregister(pace_sock)
                pace_sock = pace.sock
                if pace_sock is not None:
                    poller.register(pace_sock, zmq.POLLIN)
            self.timers(now)
            due = [until, pace.last_sent + self.t.interval]
            for w in self.workers:
                if self.beats(w):
                    due.append(max(w.last_sent + self.t.interval, w.muted_until))
            if now >= until:
                return
            wake = now + max(0.0, min(min(due) - now, 0.05))
            ready = [sock for sock, _ in poller.poll(int((wake - now) * 1000) + 1)]
            self.t.meter.wake(wake + 0.001, time.monotonic())

    def beats(self, w: _Worker) -> bool:
        return (
            w.sock is not None
            and w.registered
            and not w.dead
            and w.disconnected_at is None
            and w.expect_disconnect_since is None
        )

    def timers(self, now: float) -> None:
        for w in self.workers:
            if self.beats(w) and now >= w.muted_until and now - w.last_sent >= self.t.interval:
                if now - w.last_sent > self.t.keep_alive_limit:
                    # The fuzzer itself was late with this worker's heartbeat (starved of CPU):
                    # the broker may rightly have expired it. Leave it, as after garbage.
                    self.leave(w)
                    continue
                self.send(w, _HEARTBEAT)
        pace = self.run.pacemaker
        if pace.long_stalls > self.long_stalls_seen:
            # The broker did not run for about liveness x interval: it may rightly have expired
            # any worker meanwhile. Leave every live one, as after garbage.
            self.long_stalls_seen = pace.long_stalls
            for w in self.workers:
                if self.beats(w):
                    self.lose(w, now)
                    self.unsure[w.service] = now + self.t.dead_after
                    self.retire(w)
        if pace.stalled(now):
            self.deferred_at = now
            return  # the broker is not running now: judge when it is, with the stall measured
        for w in self.workers:
            if (
                w.expect_disconnect_since is not None
                and now > w.expect_disconnect_since + self.t.dead_after
            ):
                self.flag(
                    w.disconnect_rule,
                    f"{w.name} sent a valid but unexpected command and got no DISCONNECT within "
                    f"{self.t.dead_after:.2f} s",
                )
                self.retire(w)
            if not self.beats(w):
                w.last_beat = None
            if self.beats(w) and not w.gap_reported:
                silent = now - w.last_heard
                if silent > self.t.dead_after and now - w.muted_until > self.t.dead_after:
                    w.gap_reported = True
                    if w.heartbeats_heard == 0:
                        self.flag(
                            "MDP-H-04",
                            f"{w.name} is registered and heartbeating but the broker sent it no "
                            f"HEARTBEAT in {silent:.2f} s (interval {self.t.interval} s)",
                        )
                    else:
                        # No heartbeat due was sent (MDP-H-04), or the broker gave a live
                        # worker up (MDP-H-05): what it does next says which.
                        w.suspect_since, w.suspect_silence = now, silent
                        w.suspect_busy = w.holding is not None
        self.judge_order(now)
        for entry in [e for e in self.confirms if now >= e[0]]:
            self.confirms.remove(entry)
            _, check, rule, explanation = entry
            if check():
                self.flag(rule, explanation)
        for token, (since, rule, what) in list(self.due.items()):
            if now > since + self.t.forward_window:
                del self.due[token]
                sender = self.senders.get(token)
                if sender is not None and self.resolve_silence(
                    sender, dropped=f"{what} was not forwarded to its waiting client"
                ):
                    continue
                self.flag(
                    rule,
                    f"{what} was not forwarded to its waiting client within "
                    f"{self.t.forward_window:.2f} s",
                )
        for c in self.clients:
            if c.mmi is not None and now > c.mmi[1] + self.t.forward_window:
                self.flag(
                    c.mmi[2],
                    f"no answer to an MMI request within {self.t.forward_window:.2f} s",
                )
                c.mmi = None
        self.check_dispatch(now)

    def resolve_silence(
        self, w: _Worker, *, alive: bool = False, dropped: str = "", at_end: bool = False
    ) -> bool:
        """Name the rule a silence of the broker to the heartbeating ``w`` broke, now that the
        broker showed whether it still counts ``w`` registered: it sent it something again
        (``alive``: the heartbeats were missing, MDP-H-04, as the table's IDLE and BUSY rows
        require them), or treated it as gone (``dropped`` says how: MDP-H-05). At the end
        with no sign either way, a busy worker's silence is MDP-H-04 (a broker that gives a
        busy worker up re-dispatches its request, which is judged), an idle one's MDP-H-05."""
        if w.suspect_since is None or not (alive or dropped or at_end):
            return False
        state = "busy" if w.suspect_busy else "idle"
        what = (
            f"{w.name} ({state}) kept heartbeating yet the broker sent it nothing for "
            f"{w.suspect_silence:.2f} s (interval {self.t.interval} s)"
        )
        w.suspect_since = None
        if alive:
            self.flag("MDP-H-04", f"{what}, then went on with it: heartbeats were missing")
        elif dropped:
            self.flag("MDP-H-05", f"{what}, and {dropped}: it gave a live worker up")
        elif w.suspect_busy:
            self.flag("MDP-H-04", f"{what}: no HEARTBEAT to a busy worker")
        else:
            self.flag("MDP-H-05", f"{what}: it treated a live worker as gone")
        return True

    def check_dispatch(self, now: float) -> None:
        """A queued request must not wait while a live worker of its service sits idle."""
        window = self.t.forward_window
        for key, r in self.requests.items():
            if r.state != "queued" or not r.required or now < r.queued_since + window:
                continue
            if now < self.unsure.get(r.service, 0.0) + window:
                continue
            # Idle for the broker too: since its READY or FINAL, and since the broker showed
            # it has the READY (it sent the worker something).
            idle = [
                w
                for w in self.live_workers_of(r.service)
                if w.holding is None
                and w.registered_seen is not None
                and now - max(w.idle_since, w.registered_seen) > window
                and now - w.last_heard < self.t.dead_after
            ]
            if not idle:
                continue
            # The rule is the one whose promise fell due: the event that made the dispatch
            # owed, the later of the request's queueing and the worker's becoming idle.
            w = min(idle, key=lambda x: x.idle_since)
            waited = now - max(r.queued_since, w.idle_since)
            gone = [x for x in idle if x.suspect_since is not None]
            if len(gone) == len(idle):
                # Its only idle workers are those the broker fell silent to: it gave them up.
                r.required = False
                for x in gone:
                    self.resolve_silence(
                        x,
                        dropped=f"a request of its service waited {waited:.2f} s while it was idle",
                    )
                continue
            if r.losses:
                rule, why = "MDP-S-01", "after its worker was lost it was not resent"
            elif w.idle_since > r.sent_at and w.idle_since == w.ready_at:
                rule, why = "MDP-C-10", f"it was queued when {w.name} registered (READY)"
            elif w.idle_since > r.sent_at:
                rule, why = "MDP-A-05", f"it was queued when {w.name} sent its FINAL"
            else:
                rule, why = "MDP-A-05", f"it came while {w.name} was idle"
            r.required = False  # once is enough
            self.flag(
                rule,
                f"a request of {key[0]!r} waited {waited:.2f} s while {w.name} was idle "
                f"for its service ({why})",
            )

    def to_worker(self, w: _Worker, frames: list[bytes]) -> None:
        now = time.monotonic()
        try:
            command = mdp.parse_worker(self.run.wire.worker_in(frames))
        except FrameError as error:
            self.flag(error.rule, f"{w.name} received a malformed message: {error.reason}")
            return
        self.arm("MDP-W-08", self.run.wire.worker_rule, *_FRAME_RULES.get(command.name, ()))
        if w.registered and w.registered_seen is None:
            w.registered_seen = now
        if command.name != "DISCONNECT":
            self.resolve_silence(w, alive=True)
        if w.disconnected_at is not None and command.name == "DISCONNECT" and not w.provoked:
            # Nothing the worker sent asks for one: the broker answered its DISCONNECT.
            self.flag(
                "MDP-W-13",
                f"{w.name} sent DISCONNECT and was sent DISCONNECT "
                f"{now - w.disconnected_at:.3f} s later (no further command after it)",
            )
            w.disconnected_at = None
            return
        # A DISCONNECT sent before the broker had ever answered this socket may still be on
        # its way (a fresh connection): what comes after it is then not judged.
        up = self.connected_at(w)
        sent = None if w.disconnected_at is None or up is None else max(w.disconnected_at, up)
        if sent is not None and now - sent > self.t.slack:
            since = sent
            self.confirm(
                lambda: now - since > self.t.slack + self.run.pacemaker.lag_since(since),
                "MDP-W-13",
                f"{w.name} sent DISCONNECT {now - since:.2f} s ago and still received "
                f"{command.name}",
            )
            w.disconnected_at = None  # once is enough
            return
        last = None if up is None else max(w.last_sent, up)
        # A broker may find a silent worker dead on its heartbeat tick: one interval more.
        late_for = self.t.dead_after + self.t.interval
        if w.dead and not w.kept and last is not None and now - last > late_for:
            quiet = last
            self.confirm(
                lambda: (
                    now - quiet
                    > self.t.dead_after + self.t.interval + self.run.pacemaker.lag_since(quiet)
                ),
                "MDP-H-07",
                f"{w.name} has been silent for {now - quiet:.2f} s (dead) and still "
                f"received {command.name}",
            )
            w.dead = False
            self.retire(w)
            return
        if self.beats(w):
            if w.last_beat is not None:
                self.beat_gaps.append(now - w.last_beat)
            w.last_beat = now
        w.last_heard = now
        # No jitter sample from a scenario's workers: what the scenario (or a flaw) does to them
        # shifts the broker's heartbeats; the pacemaker's are taken instead.
        if command.name == "HEARTBEAT":
            w.heartbeats_heard += 1
        elif command.name == "DISCONNECT":
            if not w.said_something:
                self.flag("MDP-W-14", f"{w.name} got DISCONNECT before it sent anything")
            self.retire(w)  # MDP-W-17: it closes this socket
        elif command.name == "REQUEST":
            self.check_request(w, command)
        elif w.expect_disconnect_since is None:
            self.flag(
                "MDP-W-08",
                f"{w.name} received {command.name}, a command only workers send",
            )

    def check_request(self, w: _Worker, command: mdp.WorkerMessage) -> None:
        now = time.monotonic()
        self.arm("MDP-A-06", "MDP-R-03", "MDP-C-09")
        if w.holding is not None and self.stray_may_end(w, w.holding):
            # Its stray FINAL, on a connection not yet certainly up, may have reached the broker
            # after the request it holds and ended it as its reply: this REQUEST is the next
            # one, not a second at once. That request stays held until the FINAL reaches its
            # client (taken there as its reply, and the worker left: :meth:`to_client`).
            w.holding = None
        if w.holding is not None:
            self.flag(
                "MDP-A-06",
                f"{w.name} was sent a second REQUEST before it sent the FINAL of its first",
            )
        client = self.learn_address(command)
        known = [(key, r) for key, r in self.requests.items() if key[0] == client]
        match = [(k, r) for k, r in known if tuple(command.body) == r.body]
        if not known:
            self.flag("MDP-R-03", f"{w.name} got a REQUEST for unknown client {client!r}")
            return
        if not match:
            sizes = [len(f) for f in command.body]
            self.flag(
                "MDP-S-03",
                f"{w.name} got a REQUEST whose body (frames of {sizes} bytes) no client sent",
            )
        key, r = (match or known)[-1]  # altered, it is still that client's request
        if r.service != w.service and w.expect_disconnect_since is None:
            self.flag(
                "MDP-C-09", f"{w.name} serves {w.service!r} but got a request for {r.service!r}"
            )
        sibling = self.requests.get(r.sibling) if r.sibling is not None else None
        if r.drop and sibling is not None and not r.dispatched:
            # Which: judged a moment later, since the first's own REQUEST to another worker
            # may be read after this one.
            first = sibling
            self.confirm(
                lambda: first.dispatched,
                "MDP-S-02",
                "both REQUESTs a client sent on one socket were dispatched (at most one of "
                "a client's requests is queued)",
            )
            self.confirm(
                lambda: not first.dispatched,
                "MDP-D-12",
                "a client's second REQUEST on one socket was dispatched while its first, "
                "still outstanding, waited (the first stands)",
            )
        elif (
            sibling is not None
            and sibling.dispatched
            and not r.dispatched
            # A first request whose worker was lost after its PARTIAL is over: the broker drops
            # it (MDP-D-09), and the second is then a request of its own, to be served.
            and not (sibling.partial_sent and sibling.losses)
        ):
            self.flag(
                "MDP-S-02",
                "both REQUESTs a client sent on one socket were dispatched (at most one of a "
                "client's requests is queued)",
            )
        holder = next((x for x in self.workers if x is not w and x.holding == key), None)
        if r.state == "held" and holder is not None and self.beats(holder) and not self.beats(w):
            # ``w`` has told the broker it is gone (DISCONNECT, an unexpected command) or died:
            # this REQUEST is one the broker sent it before it read that, and the request went
            # to ``holder`` after. Two sockets read in one pass: the fuzzer may read the later
            # dispatch first. What reaches ``w`` this late is judged above (MDP-W-13, MDP-H-07).
            return
        if r.state == "held" and holder is not None and self.beats(holder):
            # Dispatched again while the worker holding it is alive (heartbeating, within
            # its liveness): the broker gave that worker up.
            if not self.resolve_silence(holder, dropped=f"its request was dispatched to {w.name}"):
                self.flag(
                    "MDP-H-05",
                    f"a request {holder.name} holds and is alive for was dispatched to {w.name} "
                    "too: the broker gave a live worker up",
                )
            holder.holding = None
        if r.losses and r.partial_forwarded:
            self.flag(
                "MDP-D-09",
                f"{w.name} got a request again whose PARTIAL had reached its client before its "
                "worker was lost (the broker never splices two executions)",
            )
        if r.losses == 0 and not r.dispatched and r.sibling is None:
            self.note_order(key, r, now)
        if self.run.dispatch == "lru" and w.holding is None and not w.dead:
            self.judge_lru(w, r, now)
        if not r.dispatched:
            r.dispatched_at = now
            r.dispatched_via = (w.sock_no, w.requests_got)
        w.requests_got += 1
        r.dispatched = True
        r.state = "held"
        w.holding = key
        if w.dead and not self.run.wire.busy_workers_heartbeat:
            # Dispatched to after it died, in a dialect whose busy workers the broker keeps
            # however silent (MDP01-12, MAJ-08): it is busy now, so kept as on dying busy.
            w.kept = True
            self.unsure[w.service] = float("inf")
        elif w.dead:
            self.lose(w, self.expired_by(w))

    def note_order(self, key: tuple[bytes, int], r: _Request, now: float) -> None:
        """MDP-A-03: ``r`` is dispatched; a request of its service that certainly reached the
        broker before ``r`` was even sent, and still waits, was overtaken. Each client has one
        request queued at most (MDP-S-02), so every fair order (first come first served,
        round robin over clients) serves these two in the order they came; a request that
        went back to its queue after a loss (MDP-D-08) is left out. Judged ``slack`` later:
        the earlier one's own REQUEST may be on its way to another worker."""
        for other, q in self.requests.items():
            if q is r or q.service != r.service or q.state != "queued" or q.dispatched:
                continue
            if q.losses or q.sibling is not None or q.drop or q.unseen or r.unseen:
                continue
            if r.arrived_by + self.t.slack < q.sent_at:
                self.arm("MDP-A-03")  # two requests queued in a certain order: judged
            elif q.arrived_by + self.t.slack < r.sent_at:
                self.arm("MDP-A-03")  # two requests in the order they came: judged
                self.overtakes.append((other, key, now, now + self.t.forward_window))

    def judge_order(self, now: float) -> None:
        for entry in list(self.overtakes):
            other, key, overtaken_at, when = entry
            if now < when:
                continue
            self.overtakes.remove(entry)
            q = self.requests[other]
            # Still waiting, or dispatched only after the later one was: on the same worker
            # connection after it (one connection keeps the broker's order), or to another
            # worker past the slack (its own REQUEST, sent first, may have arrived up to the
            # slack after the later one's).
            r = self.requests[key]
            via, r_via = q.dispatched_via, r.dispatched_via
            after_on_one = (
                via is not None and r_via is not None and via[0] == r_via[0] and via[1] > r_via[1]
            )
            later = q.dispatched and (after_on_one or q.dispatched_at > overtaken_at + self.t.slack)
            if q.losses == 0 and (later or (q.state == "queued" and not q.dispatched)):
                self.flag(
                    "MDP-A-03",
                    f"a request of {key[0]!r} sent {r.sent_at - q.sent_at:.2f} s after one of "
                    f"{other[0]!r} for the same service was dispatched first, while that one "
                    "waited (not served in the order they came)",
                )
                self.overtakes = [e for e in self.overtakes if e[0] != other]

    def opaque(self, client: bytes) -> bytes:
        """The address the broker gave workers for the fuzzer's client ``client``."""
        return self.address_for.get(client, client)

    def learn_address(self, command: mdp.WorkerMessage) -> bytes:
        """The fuzzer's client that a REQUEST's client address stands for.

        An MDP/0.2 broker names a client by its routing id. For a client of another dialect
        the address is a key the broker makes (MDP01-11, MAJ-07: opaque to the worker, which
        returns it as it came), so it is learnt from the first REQUEST that carries it: the
        oldest queued request with that body whose client has no key yet.
        """
        if command.client in self.aliases or self.run.wire.name == "mdp02":
            return self.aliases.get(command.client, command.client)
        if any(key[0] == command.client for key in self.requests):
            return command.client  # a routing id the broker kept as it was
        body = tuple(command.body)
        for (client, _), r in self.requests.items():
            if r.state == "queued" and r.body == body and client not in self.address_for:
                self.aliases[command.client] = client
                self.address_for[client] = command.client
                return client
        return command.client

    def stray_may_end(self, w: _Worker, held: tuple[bytes, int]) -> bool:
        """Did ``w`` send a stray FINAL, unsure of its connection, to the client of ``held``
        before that request was sent? The broker may have read it after the request, as its
        reply (see :meth:`to_client`)."""
        r = self.requests.get(held)
        if r is None:
            return False
        return any(
            sender is w
            and (origin := self.tokens[token]).kind == "FINAL"
            and origin.client == held[0]
            and origin.unsure_for == r.service
            and origin.sent_at < r.sent_at
            for token, sender in self.strays.items()
        )

    def judge_lru(self, w: _Worker, r: _Request, now: float) -> None:
        # MDP-A-04, as the target declared it: the worker idle the longest gets the request.
        others = [
            x
            for x in self.live_workers_of(r.service)
            if x is not w and x.holding is None and now - x.last_heard < self.t.dead_after
        ]
        if not others:
            return
        self.arm("MDP-A-04")
        older = [x for x in others if x.idle_since < w.idle_since - self.t.forward_window]
        if older:
            self.flag(
                "MDP-A-04",
                f"{w.name} got a request though {older[0].name} had been idle "
                f"{w.idle_since - older[0].idle_since:.2f} s longer (least recently used)",
            )

    def to_client(self, c: _Client, frames: list[bytes]) -> None:
        # A majortomo reply names no service (MAJ-05): the one the client asked is put in, or,
        # with nothing asked, a name that says so (its service is not judged in that dialect).
        if c.mmi is not None:
            asked = b"mmi.service"
        else:
            asked = c.outstanding[0] if c.outstanding is not None else _NOTHING_ASKED
        try:
            command = mdp.parse_client(self.run.wire.client_in(frames, asked))
        except FrameError as error:
            self.flag(error.rule, f"client received a malformed message: {error.reason}")
            return
        self.arm(self.run.wire.client_rule, *_FRAME_RULES.get("client " + command.name, ()))
        if command.name == "REQUEST":
            self.flag("MDP-D-20", "client received REQUEST, a command only clients send")
            return
        kind = command.name
        if c.mmi is not None and command.service.startswith(b"mmi."):
            allowed, asked_at, rule = c.mmi
            basis, c.mmi, c.mmi_basis = c.mmi_basis, None, None
            answer = command.body[0] if command.body else b""
            why = (
                f"an MMI request was answered with {kind} {answer[:20]!r}, not "
                f"{' or '.join(repr(a) for a in sorted(allowed))}"
            )
            if kind == "FINAL" and answer == b"200" and self.ready_after(c.mmi_name, asked_at):
                # A READY for that service sent after the question may have reached the broker
                # first: the two come on two connections, and a fresh one (a new client socket)
                # waits for its handshake, which a loaded machine delays. Either answer holds.
                pass
            elif kind != "FINAL" or (answer not in allowed and basis is None):
                self.flag(rule, why)
            elif answer not in allowed and basis is not None:
                # Judged again with the windows of a moment later, and not at all if the
                # broker ran late meanwhile: a late broker may not have read the READY or
                # run the expiry that decided the answer when it answered.
                readies, gone, then = basis

                def still_wrong() -> bool:
                    # The window of a moment later, and what the broker ran late meanwhile.
                    lag = self.run.pacemaker.lag_since(min([asked_at, *readies, *gone]) - then)
                    wider = self.t.forward_window - then + lag
                    if any(asked_at - r > then + wider for r in readies):
                        return answer != b"200"
                    if all(g + wider < asked_at for g in gone):
                        return answer != b"404"
                    return False

                self.confirm(still_wrong, rule, why)
            return
        token = command.body[0] if command.body else b""
        if (
            not self.run.wire.replies_name_service
            and token not in self.tokens
            and command.body[1:2]
            and command.body[1] in self.tokens
            and token == self.service_asked(command.body[1])
        ):
            # A majortomo reply has no service frame (MAJ-03, MAJ-04): this one has.
            self.flag(
                "MAJ-03" if kind == "PARTIAL" else "MAJ-04",
                f"a majortomo client got a {kind} with a service frame ({token!r}) before its body",
            )
            return
        origin = self.tokens.get(token)
        if origin is None and token.startswith(b"tok:") and not token.startswith(self.token_prefix):
            # A reply a worker of another scenario sent for its own client (MDP-R-03).
            self.flag(
                "MDP-R-03",
                f"client {c.address!r} got a {kind} a worker sent for another client "
                f"({token[:40]!r}, of another scenario)",
            )
            return
        if origin is None:
            self.flag("MDP-S-03", f"client got a {kind} whose body no worker sent")
            return
        self.due.pop(token, None)
        sender = self.senders.get(token)
        if sender is not None:
            self.resolve_silence(sender, alive=True)  # the broker still took its replies
        if origin.forbidden and origin.unsure_for is not None:
            # A request of this client for that worker's service, sent after the stray reply
            # on another connection, may have reached the broker first (the worker's fresh
            # connection the slower, seen under two CPU hogs): then the worker was busy with
            # it and its FINAL is that request's reply.
            later = [
                (key, q)
                for key, q in self.requests.items()
                if key[0] == c.address
                and q.service == origin.unsure_for
                and q.sent_at > origin.sent_at
                and q.state != "done"
            ]
            if later:
                key, taken = later[0]
                taken.state = "done"
                if c.outstanding is not None and c.outstanding[1] == key[1]:
                    c.outstanding = None
                stray = self.strays.get(token)
                if stray is not None and stray.expect_disconnect_since is not None:
                    # No DISCONNECT is owed for a reply taken as expected: left, not judged.
                    self.unsure[stray.service] = time.monotonic() + self.t.dead_after
                    self.retire(stray)
                return
        if origin.forbidden:
            self.flag(
                origin.forbidden,
                f"client got a {kind} from a worker that held no request of that client",
            )
            return
        if kind == "PARTIAL" and self.run.wire.name == "majortomo":
            self.arm("MAJ-03")
        if origin.client != c.address:
            self.flag(
                "MDP-R-03",
                f"client {c.address!r} got a {kind} a worker sent for client {origin.client!r} "
                "(a reply goes to the client its address names)",
            )
            return
        r = self.requests.get((origin.client, origin.seq))
        if r is not None and kind == "PARTIAL":
            r.partial_forwarded = True
        if origin.kind == "PARTIAL" and not self.run.wire.client_partials:
            self.flag(
                "MDP01-05",
                "an MDP/0.1 client got a PARTIAL a worker sent (as its one reply): a REQ client "
                "takes one reply per request, the FINAL",
            )
            return
        if kind != origin.kind:
            self.flag(
                "MDP-R-01",
                f"client got a {kind} for a {origin.kind} its worker sent (PARTIALs, then one "
                "FINAL, as the worker sent them)",
            )
            return
        if tuple(command.body) != origin.body:
            sizes = [len(f) for f in command.body]
            self.flag("MDP-S-03", f"client got a {kind} whose body (frames of {sizes}) was altered")
        if origin.late and kind == "FINAL":
            expired = origin.sent_at - self.t.dead_after - self.t.interval
            self.confirm(
                # The extra interval of "certainly expired" covers a lag that small.
                lambda: self.run.pacemaker.lag_since(expired) <= self.t.interval,
                "MDP-D-10",
                f"client got a FINAL that a worker sent after {self.t.dead_after:.2f} s of "
                "silence, when it was already expired",
            )
        elif c.outstanding is None or origin.seq not in (c.outstanding[1], c.other_seq):
            self.flag("MDP-C-06", f"client got a {kind} with no request outstanding")
            return
        elif self.run.wire.replies_name_service and command.service != (
            expected := self.service_of(origin, c.outstanding[0])
        ):
            self.flag(
                "MDP-R-01",
                f"client got a {kind} naming service {command.service!r}, not {expected!r}",
            )
        if kind == "FINAL":
            c.outstanding = c.other_seq = None

    def service_asked(self, token: bytes) -> bytes:
        """The service of the request a reply's token answers."""
        origin = self.tokens[token]
        r = self.requests.get((origin.client, origin.seq))
        return b"" if r is None else r.service

    def service_of(self, origin: _Token, default: bytes) -> bytes:
        r = self.requests.get((origin.client, origin.seq))
        return default if r is None else r.service


def owner_sock_has(sock: zmq.Socket[bytes]) -> bool:
    events = sock.getsockopt(zmq.EVENTS)
    return isinstance(events, int) and bool(events & zmq.POLLIN)
