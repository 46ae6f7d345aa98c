"""Run one scenario against a running MDP/0.2 broker over real ZeroMQ sockets, and check it.

The fuzzer plays up to three workers and two clients, each a DEALER socket with a routing id of
its own, and models what a conforming broker may send each of them. Every message the broker
sends is parsed (MDP-W-08, MDP-C-02/03) and checked against that model as it arrives; timing rules
are checked with a tolerance (``slack``, see :class:`Timing`), so that a conforming broker on a
loaded machine is never flagged. The checks and the rule each one reports:

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
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import zmq

from domo.protocol import mdp
from domo.protocol.errors import MalformedMessage

from .scenario import CLIENTS, GARBAGE, SERVICES, WORKERS, Step

__all__ = ["BrokerRun", "NeverServed", "TargetDied", "Timing", "Unreachable", "Violation"]

_RUN_IDS: Final = itertools.count()
_HEARTBEAT: Final = (mdp.WORKER_HEADER, mdp.W_HEARTBEAT)
_DISCONNECT: Final = (mdp.WORKER_HEADER, mdp.W_DISCONNECT)


@dataclass(frozen=True, slots=True)
class Timing:
    """The heartbeat interval and liveness agreed with the target, and the tolerance used.

    ``slack`` (default ``0.05 s + interval / 2``) is added to every deadline the fuzzer enforces
    and subtracted from every silence it treats as "certainly still alive".
    """

    interval: float
    liveness: int

    @property
    def slack(self) -> float:
        return 0.05 + self.interval / 2

    @property
    def dead_after(self) -> float:
        """Silence after which a conforming broker has certainly expired a worker."""
        return self.liveness * self.interval + self.slack

    @property
    def probe_timeout(self) -> float:
        return max(2.0, 2 * self.dead_after)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: its id in specs/mdp-0.2.md and what the broker did."""

    rule: str
    explanation: str


class Unreachable(Exception):
    """The target never answered the first probe."""


class NeverServed(Unreachable):
    """The peer connected but never served, and broke rules on the way: ``violations``."""

    def __init__(self, message: str, violations: list[Violation]) -> None:
        super().__init__(message)
        self.violations = violations


class TargetDied(Exception):
    """The target stopped serving during a scenario; ``violation`` says which rule that breaks."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.explanation)
        self.violation = violation


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
    expect_disconnect_by: float | None = None
    muted_until: float = 0.0
    gap_reported: bool = False


@dataclass
class _Client:
    address: bytes
    sock: zmq.Socket[bytes]
    seq: int = 0
    outstanding: tuple[bytes, int] | None = None  # (service, seq)


@dataclass
class BrokerRun:
    """A connection to one broker; :meth:`run` plays one scenario against it."""

    endpoint: str
    timing: Timing
    context: zmq.Context[zmq.Socket[bytes]] = field(default_factory=zmq.Context)
    run_id: int = field(default_factory=lambda: next(_RUN_IDS))
    examples: int = 0

    def close(self) -> None:
        self.context.destroy(linger=0)

    def _socket(self, identity: bytes) -> zmq.Socket[bytes]:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, identity)
        sock.connect(self.endpoint)
        return sock

    def first_probe(self) -> list[Violation]:
        """``Unreachable`` unless the broker serves a fresh worker and client in time."""
        if not self.probe("start", self.timing.probe_timeout):
            raise Unreachable(
                f"no MDP/0.2 broker answered at {self.endpoint} within "
                f"{self.timing.probe_timeout:.1f} s"
            )
        return []  # the probe checks only that the broker serves

    def probe(self, tag: str, timeout: float) -> bool:
        """A fresh worker and client: is a request dispatched and its FINAL forwarded in time?"""
        service = f"fz.{self.run_id}.{tag}.probe".encode()
        worker = self._socket(f"fz{self.run_id}-{tag}-pw".encode())
        client = self._socket(f"fz{self.run_id}-{tag}-pc".encode())
        try:
            worker.send_multipart(mdp.worker_ready_frames(service))
            client.send_multipart(mdp.client_request_frames(service, [b"probe"]))
            deadline = time.monotonic() + timeout
            got = _recv_until(worker, deadline, lambda f: len(f) >= 5 and f[1] == mdp.W_REQUEST)
            if got is None:
                return False
            worker.send_multipart(mdp.worker_final_frames(got[2], [b"probe-ok"]))
            reply = _recv_until(client, deadline, lambda f: len(f) >= 4 and f[1] == mdp.C_FINAL)
            worker.send_multipart(_DISCONNECT)
            return reply is not None
        finally:
            worker.close(linger=100)
            client.close(linger=0)

    def run(self, steps: list[Step]) -> list[Violation]:
        """Play ``steps``; the violations seen, in order (``TargetDied`` if the probe fails)."""
        self.examples += 1
        return _Scenario(self, f"e{self.examples}").play(steps)


def _recv_until(
    sock: zmq.Socket[bytes], deadline: float, wanted: Callable[[list[bytes]], bool]
) -> list[bytes] | None:
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1, zmq.POLLIN):
            frames = sock.recv_multipart()
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
        self.violations: list[Violation] = []
        self.tokens: dict[bytes, tuple[bytes, int, bool]] = {}  # body -> client, seq, late
        self.requests: dict[tuple[bytes, int], tuple[bytes, bytes]] = {}  # -> service, body
        self.abandoned: list[zmq.Socket[bytes]] = []
        self.had_garbage = False

    # --- bookkeeping -----------------------------------------------------------------------

    def flag(self, rule: str, explanation: str) -> None:
        self.violations.append(Violation(rule, explanation))

    def send(self, w: _Worker, frames: Sequence[bytes]) -> None:
        assert w.sock is not None
        w.sock.send_multipart(frames)
        w.last_sent = time.monotonic()
        w.said_something = True

    def fresh_socket(self, w: _Worker) -> zmq.Socket[bytes]:
        self.retire(w)
        self.sockets_made += 1
        w.sock = self.run._socket(f"{self.prefix}-{w.name}-{self.sockets_made}".encode())
        now = time.monotonic()
        w.registered = w.said_something = w.dead = False
        w.holding = w.disconnected_at = w.expect_disconnect_by = None
        w.last_heard = w.last_sent = now
        w.heartbeats_heard = 0
        w.gap_reported = False
        return w.sock

    def retire(self, w: _Worker) -> None:
        if w.sock is not None:
            self.abandoned.append(w.sock)
            w.sock = None
        w.registered = False
        w.holding = None
        w.expect_disconnect_by = None
        w.disconnected_at = None

    # --- playing ---------------------------------------------------------------------------

    def play(self, steps: list[Step]) -> list[Violation]:
        try:
            for step in steps:
                self.do(step)
                self.pump(time.monotonic() + 0.005)
            # Let every pending deadline pass, so that late messages, missing DISCONNECTs and
            # missing heartbeats show: any worker still connected has one.
            pending = any(w.sock is not None for w in self.workers)
            self.pump(time.monotonic() + (self.t.dead_after if pending else self.t.slack))
            if not self.run.probe(self.tag, self.t.probe_timeout):
                rule = "MDP-W-16" if self.had_garbage else "MDP-A-01"
                why = (
                    "after malformed messages the broker no longer serves a fresh worker and client"
                    if self.had_garbage
                    else "the broker no longer serves a fresh worker and client"
                )
                raise TargetDied(Violation(rule, why))
            return self.violations
        finally:
            for w in self.workers:
                if w.sock is not None and w.registered:
                    w.sock.send_multipart(_DISCONNECT)
                self.retire(w)
            for sock in [*self.abandoned, *(c.sock for c in self.clients)]:
                sock.close(linger=0)

    def do(self, step: Step) -> None:
        now = time.monotonic()
        if step.kind == "wait":
            self.pump(now + step.arg * self.t.interval / 2)
            return
        if step.kind == "request":
            c = self.clients[step.actor % len(self.clients)]
            if c.outstanding is not None:
                # It gives up waiting and asks again on a new socket, as MDP-C-08 recommends;
                # the old request may still be served, to the old address, which is gone.
                self.abandoned.append(c.sock)
                self.sockets_made += 1
                c.address = f"{self.prefix}-c{step.actor}-{self.sockets_made}".encode()
                c.sock = self.run._socket(c.address)
                c.outstanding = None
            c.seq += 1
            service = self.services[step.arg % SERVICES]
            body = c.address + b":" + str(c.seq).encode()
            c.outstanding = (service, c.seq)
            self.requests[(c.address, c.seq)] = (service, body)
            c.sock.send_multipart(mdp.client_request_frames(service, [body]))
            return
        w = self.workers[step.actor % len(self.workers)]
        live = w.sock is not None and not w.dead and w.disconnected_at is None
        needs_ready = (
            step.kind in ("heartbeat", "disconnect", "die", "pause")
            or (step.kind == "unexpected" and step.arg % 4 != 3)
            or (step.kind == "late-final" and not w.dead)
        )
        if needs_ready and not (live and w.registered):
            # A step that needs a registered worker registers it first (on s0), so that
            # random scenarios rarely waste a step and shrinking keeps them short.
            self.do(Step("ready", step.actor, 0))
            self.pump(time.monotonic() + 0.005)
            live = True
        match step.kind:
            case "ready":
                if not w.registered or not live:
                    self.fresh_socket(w)
                    w.service = self.services[step.arg % SERVICES]
                    self.send(w, mdp.worker_ready_frames(w.service))
                    w.registered = True
            case "reply":
                if live and w.registered and w.holding is not None:
                    for _ in range(step.arg):
                        self.send_reply(w, mdp.W_PARTIAL, late=False)
                    self.send_reply(w, mdp.W_FINAL, late=False)
                    w.holding = None
            case "heartbeat":
                if live and w.registered:
                    self.send(w, _HEARTBEAT)
            case "disconnect":
                if live and w.said_something:
                    self.send(w, _DISCONNECT)
                    w.registered = False
                    w.holding = None
                    w.disconnected_at = time.monotonic()
            case "die":
                if live and w.registered:
                    w.dead = True
            case "late-final":
                # Die first if alive; send the FINAL once the broker has certainly expired the
                # worker, so that a random scenario needs no exact run of waits for MDP-D-10.
                if live and w.registered:
                    w.dead = True
                if w.dead and w.sock is not None:
                    self.pump(w.last_sent + self.t.dead_after + 0.01)
                if w.dead and w.holding is not None and w.sock is not None:
                    now = time.monotonic()
                    late = now - w.last_sent >= self.t.dead_after
                    self.send_reply(w, mdp.W_FINAL, late=late)
                    self.retire(w)  # a zombie: whatever the broker says to it now is allowed
            case "pause":
                if live and w.registered:
                    longest = self.t.liveness * self.t.interval - self.t.slack
                    w.muted_until = now + max(0.0, min(step.arg * self.t.interval / 2, longest))
            case "unexpected":
                self.unexpected(w, live, step.arg % 4)
            case "garbage":
                sock = w.sock if live and w.sock is not None else self.fresh_socket(w)
                _, template = GARBAGE[step.arg % len(GARBAGE)]
                svc = w.service or self.services[0]
                sock.send_multipart([svc if f == b"{svc}" else f for f in template])
                self.had_garbage = True
                self.retire(w)  # the broker may treat this peer as invalid from now on

    def unexpected(self, w: _Worker, live: bool, which: int) -> None:
        if which == 3:  # HEARTBEAT before READY, on a fresh socket
            self.fresh_socket(w)
            self.send(w, _HEARTBEAT)
        elif not (live and w.registered):
            return
        elif which == 0:
            self.send(w, mdp.worker_ready_frames(w.service))
        elif which == 1:
            if w.holding is not None:
                return
            self.send(w, mdp.worker_final_frames(self.clients[0].address, [b"unasked"]))
        else:
            self.send(w, [mdp.WORKER_HEADER, mdp.W_REQUEST, self.clients[0].address, b"", b"x"])
        w.expect_disconnect_by = time.monotonic() + self.t.dead_after
        w.registered = False
        w.holding = None

    def send_reply(self, w: _Worker, code: bytes, *, late: bool) -> None:
        assert w.holding is not None
        client, seq = w.holding
        token = f"tok:{self.prefix}:{len(self.tokens)}".encode()
        self.tokens[token] = (client, seq, late)
        frames = [mdp.WORKER_HEADER, code, client, b"", token]
        self.send(w, frames)

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
        while True:
            now = time.monotonic()
            self.timers(now)
            due = [until]
            for w in self.workers:
                if self.beats(w):
                    due.append(max(w.last_sent + self.t.interval, w.muted_until))
            wait = min(due) - now
            if now >= until:
                return
            for sock, _ in poller.poll(max(0, int(wait * 1000)) + 1):
                owner = socks[sock]
                while owner_sock_has(sock):
                    frames = sock.recv_multipart()
                    if owner.sock is not sock:
                        continue  # a socket the actor has left; what comes to it is allowed
                    if isinstance(owner, _Worker):
                        self.to_worker(owner, frames)
                    else:
                        self.to_client(owner, frames)

    def beats(self, w: _Worker) -> bool:
        return (
            w.sock is not None
            and w.registered
            and not w.dead
            and w.disconnected_at is None
            and w.expect_disconnect_by is None
        )

    def timers(self, now: float) -> None:
        for w in self.workers:
            if self.beats(w) and now >= w.muted_until and now - w.last_sent >= self.t.interval:
                self.send(w, _HEARTBEAT)
            if w.expect_disconnect_by is not None and now > w.expect_disconnect_by:
                self.flag(
                    "MDP-W-15",
                    f"{w.name} sent a valid but unexpected command and got no DISCONNECT within "
                    f"{self.t.dead_after:.2f} s",
                )
                self.retire(w)
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
                        self.flag(
                            "MDP-H-05",
                            f"{w.name} kept heartbeating yet the broker stopped sending it "
                            f"anything for {silent:.2f} s: it treated a live worker as gone",
                        )

    def to_worker(self, w: _Worker, frames: list[bytes]) -> None:
        now = time.monotonic()
        try:
            command = mdp.parse_worker(frames)
        except MalformedMessage as error:
            self.flag(error.rule, f"{w.name} received a malformed message: {error.reason}")
            return
        if w.disconnected_at is not None and now - w.disconnected_at > self.t.slack:
            self.flag(
                "MDP-W-13",
                f"{w.name} sent DISCONNECT {now - w.disconnected_at:.2f} s ago and still received "
                f"{type(command).__name__}",
            )
            w.disconnected_at = None  # once is enough
            return
        if w.dead and now - w.last_sent > self.t.dead_after:
            self.flag(
                "MDP-H-07",
                f"{w.name} has been silent for {now - w.last_sent:.2f} s (dead) and still "
                f"received {type(command).__name__}",
            )
            w.dead = False
            self.retire(w)
            return
        w.last_heard = now
        if isinstance(command, mdp.WorkerHeartbeat):
            w.heartbeats_heard += 1
        elif isinstance(command, mdp.WorkerDisconnect):
            if not w.said_something:
                self.flag("MDP-W-14", f"{w.name} got DISCONNECT before it sent anything")
            self.retire(w)  # MDP-W-17: it closes this socket
        elif isinstance(command, mdp.WorkerRequest):
            self.check_request(w, command)
        elif w.expect_disconnect_by is None:
            self.flag(
                "MDP-W-08",
                f"{w.name} received {type(command).__name__}, a command only workers send",
            )

    def check_request(self, w: _Worker, command: mdp.WorkerRequest) -> None:
        if w.holding is not None:
            self.flag(
                "MDP-A-06",
                f"{w.name} was sent a second REQUEST before it sent the FINAL of its first",
            )
        known = [(key, value) for key, value in self.requests.items() if key[0] == command.client]
        match = [(k, v) for k, v in known if tuple(command.body) == (v[1],)]
        if not known:
            self.flag("MDP-R-03", f"{w.name} got a REQUEST for unknown client {command.client!r}")
        elif not match:
            self.flag("MDP-S-03", f"{w.name} got a REQUEST whose body no client sent")
        elif match[-1][1][0] != w.service and w.expect_disconnect_by is None:
            self.flag(
                "MDP-C-09",
                f"{w.name} serves {w.service!r} but got a request for {match[-1][1][0]!r}",
            )
        if match:
            w.holding = match[-1][0]

    def to_client(self, c: _Client, frames: list[bytes]) -> None:
        try:
            command = mdp.parse_client(frames)
        except MalformedMessage as error:
            self.flag(error.rule, f"client received a malformed message: {error.reason}")
            return
        if isinstance(command, mdp.ClientRequest):
            self.flag("MDP-D-20", "client received REQUEST, a command only clients send")
            return
        kind = "FINAL" if isinstance(command, mdp.ClientFinal) else "PARTIAL"
        token = command.body[0] if len(command.body) == 1 else b""
        origin = self.tokens.get(token)
        if origin is None:
            self.flag("MDP-S-03", f"client got a {kind} whose body no worker sent")
            return
        if origin[2] and kind == "FINAL":
            self.flag(
                "MDP-D-10",
                f"client got a FINAL that a worker sent after {self.t.dead_after:.2f} s of "
                "silence, when it was already expired",
            )
        elif c.outstanding is None or c.outstanding[1] != origin[1]:
            self.flag("MDP-C-06", f"client got a {kind} with no request outstanding")
            return
        elif command.service != c.outstanding[0]:
            self.flag(
                "MDP-R-01",
                f"client got a {kind} naming service {command.service!r}, not {c.outstanding[0]!r}",
            )
        if kind == "FINAL":
            c.outstanding = None


def owner_sock_has(sock: zmq.Socket[bytes]) -> bool:
    events = sock.getsockopt(zmq.EVENTS)
    return isinstance(events, int) and bool(events & zmq.POLLIN)
