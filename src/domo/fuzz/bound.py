"""What the worker and client targets share: domo binds a ROUTER and plays the broker.

:class:`BoundRun` owns the ROUTER socket (``ROUTER_MANDATORY``, so a send to a peer that left
raises instead of vanishing, and ``ROUTER_HANDOVER``, so a peer that reconnects with a fixed
routing id is heard again), optionally the peer's process (``--exec CMD``, restarted when it
exits), and the receive loop (:meth:`BoundRun.pump`) that hands each message to the target's
check and runs its timers. It knows nothing of MDP; :mod:`domo.fuzz.worker_target` and
:mod:`domo.fuzz.client_target` do.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from typing import Final

import zmq

from .broker_target import NeverServed, Unreachable, Violation

__all__ = ["BoundRun", "PeerExited", "PeerProcess", "command_line"]

_ENDPOINT_MARK: Final = "{endpoint}"


def command_line(command: str | Sequence[str], endpoint: str) -> list[str]:
    """``command`` split as a shell would (not run by one), ``{endpoint}`` replaced."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise ValueError("--exec: empty command")
    return [arg.replace(_ENDPOINT_MARK, endpoint) for arg in argv]


class PeerExited(Exception):
    """The peer process started by ``--exec`` exited before it ever served."""


class PeerProcess:
    """The peer under test, started by the fuzzer (and only ever killed by its own PID)."""

    def __init__(self, argv: list[str], endpoint: str) -> None:
        self.argv = argv
        self.endpoint = endpoint
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.exits: list[int] = []

    def start(self) -> None:
        env = dict(os.environ, DOMO_FUZZ_ENDPOINT=self.endpoint)
        try:
            self.process = subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
        except OSError as error:
            raise ValueError(f"--exec: cannot start {self.argv[0]!r}: {error}") from error
        self.starts += 1

    def exited(self) -> int | None:
        """The exit code if the process has ended since it was (re)started, else ``None``."""
        if self.process is None:
            return None
        return self.process.poll()

    def ensure_running(self) -> int | None:
        """Restart the process if it ended; the exit code it ended with, if it did."""
        code = self.exited()
        if self.process is None or code is not None:
            if code is not None:
                self.exits.append(code)
            self.start()
        return code

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


class BoundRun:
    """A bound ROUTER and the peer process; subclasses check what the peer sends.

    Subclasses implement :meth:`heard` (one message from one connection, already split into
    its routing id and frames), :meth:`timers` (called before every wait) and :meth:`probe`, and
    say what they are (``role``), how long the peer may take (``patience``) and what a peer that
    serves does first (``serving``).
    """

    role = "peer"
    serving = "served"

    def __init__(self, endpoint: str, command: str | Sequence[str] | None = None) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            self.router.bind(endpoint)
        except zmq.ZMQError as error:
            self.context.destroy(linger=0)
            raise ValueError(f"cannot bind {endpoint}: {error.strerror}") from error
        # Connections that end: a message from a routing id after our DISCONNECT comes from a new
        # socket only if some connection ended in between (see ``connections_ended``).
        self.monitor = self.router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.ended = 0
        # A tcp port of 0 is chosen by the system: the peer needs the real one.
        last = self.router.getsockopt(zmq.LAST_ENDPOINT)
        self.endpoint = last.decode() if isinstance(last, bytes) else endpoint
        self.peer = (
            PeerProcess(command_line(command, self.endpoint), self.endpoint)
            if command is not None
            else None
        )
        self.examples = 0
        self.coverage: Counter[str] = Counter()  # rule id -> scenarios that exercised it
        self.violations: list[Violation] = []

    def close(self) -> None:
        if self.peer is not None:
            self.peer.stop()
        self.router.disable_monitor()
        self.context.destroy(linger=0)

    def connections_ended(self) -> int:
        """How many peer connections have ended so far (from the ROUTER's monitor)."""
        while self.monitor.poll(0):
            self.monitor.recv_multipart()
            self.ended += 1
        return self.ended

    @property
    def patience(self) -> float:
        """How long the peer may take to connect, or to come back."""
        return 10.0

    def probe(self, timeout: float, *, first: bool = False) -> bool:
        """Does the peer serve (a request answered, a request sent) within ``timeout``?"""
        raise NotImplementedError

    def first_probe(self) -> list[Violation]:
        """``Unreachable`` unless the peer connects and serves in time; the violations seen.

        A peer that spoke but never served (every message malformed, say) is ``NeverServed``,
        with what it broke.
        """
        try:
            served = self.probe(self.patience, first=True)
        except PeerExited as error:
            raise Unreachable(f"no MDP/0.2 {self.role}: {error}") from error
        if not served:
            how = "started by --exec" if self.peer is not None else "connected"
            message = (
                f"no MDP/0.2 {self.role} {how} at {self.endpoint} {self.serving} within "
                f"{self.patience:.1f} s"
            )
            if self.violations:  # it spoke, but not as the spec says
                raise NeverServed(message, self.violations)
            raise Unreachable(message)
        seen, self.violations = self.violations, []
        return seen

    def keep_peer_running(self, first: bool) -> None:
        """Restart the peer process if it exited; before it ever served (``first``), give up.

        A command that exits at once (a typo, a wrong flag) is reported, not restarted for ever.
        """
        if self.peer is None:
            return
        code = self.peer.ensure_running()
        if code is not None and first:
            raise PeerExited(f"{' '.join(self.peer.argv)!r} exited with code {code}")

    def send(self, identity: bytes, frames: Sequence[bytes]) -> bool:
        """Send to one connection; ``False`` if it is gone (ROUTER_MANDATORY) or full."""
        try:
            self.router.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
        except zmq.ZMQError as error:
            if error.errno in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                return False
            raise
        return True

    def pump(self, until: float) -> None:
        """Receive and check until ``until`` (monotonic seconds), running the timers.

        What has arrived is read before the timers judge any silence, so that a stall of the
        fuzzer's own process is not taken for the peer's silence; how late each wake-up came is
        a jitter sample (:meth:`wake`).
        """
        while True:
            while True:
                try:
                    frames = self.router.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.heard(frames[0], frames[1:])
            now = time.monotonic()
            self.timers(now)
            if now >= until:
                return
            wake = min(until, self.next_timer(now))
            self.router.poll(max(0, int((wake - now) * 1000)) + 1, zmq.POLLIN)
            self.wake(wake + 0.001, time.monotonic())  # woken early by a message: no sample

    # --- for subclasses -----------------------------------------------------------------------

    def heard(self, identity: bytes, frames: list[bytes]) -> None:
        raise NotImplementedError

    def timers(self, now: float) -> None:
        raise NotImplementedError

    def wake(self, planned: float, now: float) -> None:
        """The receive loop asked to wake at ``planned`` and woke at ``now`` (a jitter sample)."""

    def next_timer(self, now: float) -> float:
        """When :meth:`timers` next has something to do (at the latest)."""
        return now + 0.05
