"""The broker oracle judges what arrives on two connections without assuming their order.

Messages on two sockets have no order between them: a fresh connection's first messages wait for
its handshake, and a loaded machine delays that; the fuzzer reads two sockets that are both ready
in a fixed order, not in the order the broker sent to them. Under two CPU hogs that gave false
findings against domo's own broker (issue 28): an MMI answer of 200 for a service whose READY was
sent just after the question (MDP-M-01), and a request the broker had sent a worker just before
reading its DISCONNECT taken for a second dispatch after it went to another worker (MDP-H-05),
and a FINAL a worker sent before any request, forwarded as the reply to a request its client
sent just after (MDP-W-15).

Here a relay between the fuzzer and ``domo broker`` (real sockets, real subprocess) holds one
peer's messages back for a fixed time, so that the order the load made happen by chance happens
every time; each scenario breaks no rule and the oracle must say so.
"""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from domo.fuzz import Step
from domo.fuzz.broker_target import BrokerRun, Timing
from domo.fuzz.jitter import JitterMeter

from .conftest import INTERVAL, LIVENESS

HOLD = 0.03  # seconds the relay holds a chosen peer's messages back


class _Relay:
    """A ROUTER for the fuzzer's peers, one DEALER per peer toward the broker; messages from a
    peer for which ``slow_in(identity)`` holds, or to one for which ``slow_out(identity)`` holds,
    are held ``HOLD`` seconds (in order) before they go on."""

    def __init__(
        self,
        backend: str,
        slow_in: Callable[[bytes], bool],
        slow_out: Callable[[bytes], bool],
        frozen_until: float = 0.0,
    ) -> None:
        self.backend, self.slow_in, self.slow_out = backend, slow_in, slow_out
        self.frozen_until = frozen_until  # nothing passes before then (a broker not running)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.front = self.context.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        self.front.bind("tcp://127.0.0.1:0")
        self.endpoint = self.front.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        dealers: dict[bytes, zmq.Socket[bytes]] = {}
        peers: dict[zmq.Socket[bytes], bytes] = {}
        held: list[tuple[float, zmq.Socket[bytes], list[bytes]]] = []  # (due, to, frames)
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                while held and held[0][0] <= now:
                    _, due_to, due_frames = held.pop(0)
                    due_to.send_multipart(due_frames)
                wait = 10 if not held else max(0, int((held[0][0] - now) * 1000)) + 1
                for sock, _ in poller.poll(min(wait, 10)):
                    frames = sock.recv_multipart()
                    if sock is self.front:
                        identity, *frames = frames
                        if identity not in dealers:
                            dealer = self.context.socket(zmq.DEALER)
                            dealer.setsockopt(zmq.LINGER, 0)
                            dealer.setsockopt(zmq.ROUTING_ID, identity)
                            dealer.connect(self.backend)
                            dealers[identity], peers[dealer] = dealer, identity
                            poller.register(dealer, zmq.POLLIN)
                        to = dealers[identity]
                        slow = self.slow_in(identity)
                    else:
                        identity, to = peers[sock], self.front
                        frames = [identity, *frames]
                        slow = self.slow_out(identity)
                    due = max(self.frozen_until, time.monotonic() + HOLD if slow else 0.0)
                    if due > time.monotonic():  # one peer's messages keep their order
                        bisect.insort(held, (due, to, frames), key=lambda entry: entry[0])
                    else:
                        to.send_multipart(frames)
        finally:
            self.context.destroy(linger=0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


@pytest.fixture
def domo_broker(start_broker: Callable[[list[str]], str]) -> str:
    return start_broker(
        [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
         "--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS),
         "--log-level", "error"]
    )  # fmt: skip


@pytest.fixture
def relayed(domo_broker: str) -> Iterator[Callable[..., str]]:
    relays: list[_Relay] = []

    def start(
        slow_in: Callable[[bytes], bool], slow_out: Callable[[bytes], bool], frozen: float = 0.0
    ) -> str:
        relay = _Relay(domo_broker, slow_in, slow_out, time.monotonic() + frozen)
        relays.append(relay)
        return relay.endpoint

    yield start
    for relay in relays:
        relay.close()


def _play(endpoint: str, steps: list[Step]) -> list[str]:
    run = BrokerRun(endpoint, Timing(INTERVAL, LIVENESS))
    try:
        return [f"{v.rule}: {v.explanation}" for v in run.run(steps)]
    finally:
        run.close()


@pytest.mark.timeout(60)
def test_a_ready_sent_after_an_mmi_question_may_reach_the_broker_first(
    relayed: Callable[..., str],
) -> None:
    """c0 asks mmi.service about s0, then w1 sends READY s0; c0's connection is the slower:
    the broker takes the READY first and answers 200, as it must (MDP-M-01)."""
    endpoint = relayed(lambda peer: b"-c0" in peer, lambda peer: False)
    steps = [Step("mmi", 0, 0), Step("ready", 1, 0), Step("wait", 0, 2)]
    for _ in range(3):  # three times: the order is the relay's, not chance
        assert _play(endpoint, steps) == []


@pytest.mark.timeout(60)
def test_a_request_sent_to_a_worker_before_its_disconnect_was_read_is_no_second_dispatch(
    relayed: Callable[..., str],
) -> None:
    """c0's request waits for s0; w1 sends READY s0 and DISCONNECT at once, w0 READY s0. The
    broker sends the request to w1, reads its DISCONNECT, sends it to w0 (MDP-S-01); what goes to
    w1 comes later (its connection is the slower), after w0 has it: w0 was not given up."""
    endpoint = relayed(lambda peer: False, lambda peer: b"-w1-" in peer)
    steps = [
        Step("request", 0, 0),
        Step("wait", 0, 1),
        Step("disconnect", 1, 0),
        Step("ready", 0, 0),
        Step("wait", 0, 2),
    ]
    for _ in range(3):
        assert _play(endpoint, steps) == []


@pytest.mark.timeout(60)
def test_a_second_request_after_the_first_was_lost_past_its_partial_is_served(
    domo_broker: str,
) -> None:
    """c1's request goes to w1, which sends a PARTIAL and DISCONNECT: the broker drops the
    request (MDP-D-09: not dispatched again). c1's next REQUEST on the same socket is then a
    request of its own, and serving it is no second dispatch (MDP-S-02; the planted-suite
    control named it on domo's broker, seed 3)."""
    steps = [
        Step("ready", 1, 0),
        Step("ready", 0, 0),
        Step("request", 1, 0),
        Step("partial", 0, 0),
        Step("disconnect", 1, 1),
        Step("second-request", 1, 0),
    ]
    for _ in range(3):
        assert _play(domo_broker, steps) == []


@pytest.mark.timeout(60)
def test_a_request_sent_after_a_stray_final_may_make_it_expected(
    relayed: Callable[..., str],
) -> None:
    """w0 sends READY s0 and then a FINAL for c0, which has asked nothing (unexpected: MDP-W-15
    wants a DISCONNECT); then c0 asks s0. w0's connection is the slower: the broker takes c0's
    request first, gives it to w0, and forwards w0's FINAL as its reply, as it must."""
    endpoint = relayed(lambda peer: b"-w0-" in peer, lambda peer: False)
    steps = [Step("ready", 0, 0), Step("unexpected", 0, 1), Step("request", 0, 0)]
    for _ in range(3):
        assert _play(endpoint, steps) == []


@pytest.mark.timeout(60)
def test_a_stray_final_taken_as_a_reply_may_free_its_worker_for_the_next_request(
    relayed: Callable[..., str],
) -> None:
    """w0 sends READY s0 and a FINAL for c0, which has asked nothing; c0 and c1 then ask s0.
    w0's connection is the slower: the broker queues both requests, takes the READY, gives w0
    c0's request, takes the FINAL as its reply and gives w0 c1's. The reply to c0 is held back
    too, so w0 gets its second REQUEST before c0 has its FINAL: no second REQUEST before a FINAL
    (MDP-A-06; issue 28: seen under load with the README's fuzz block)."""
    endpoint = relayed(lambda peer: b"-w0-" in peer, lambda peer: b"-c0" in peer)
    steps = [
        Step("ready", 0, 0),
        Step("unexpected", 0, 1),
        Step("request", 0, 0),
        Step("request", 1, 0),
        Step("wait", 0, 2),
    ]
    for _ in range(3):
        assert _play(endpoint, steps) == []


@pytest.mark.timeout(90)
def test_a_lanes_first_scenario_is_not_judged_while_the_broker_does_not_run(
    relayed: Callable[..., str],
) -> None:
    """A fresh run (a lane's first scenario) against a broker that does not run for its first
    second: nothing passes the relay until then. The pacemaker has heard nothing yet, so it gave
    no evidence of the stall, and w0's READY again was judged as if the broker ran: no DISCONNECT
    within dead_after (MDP-W-10; issue 28, seen under load with the README's fuzz block). Its
    first heartbeat overdue now says the broker is not running, as a later one does."""
    endpoint = relayed(lambda peer: False, lambda peer: False, frozen=1.0)
    steps = [Step("ready", 0, 0), Step("unexpected", 0, 0), Step("wait", 0, 2)]
    assert _play(endpoint, steps) == []


@pytest.mark.timeout(60)
def test_a_stall_of_the_broker_hidden_by_the_fuzzers_own_counts_as_its_lag() -> None:
    """The pacemaker tells how late the broker ran from the gaps between its heartbeats; while
    the fuzzer itself is stalled it reads nothing, and what it reads after in a burst shows no
    gap, though a machine that starves the fuzzer starves the broker too. A FINAL a worker sent
    after its expiry, read by a broker that woke late before it ran its timers, was then judged
    as forwarded by a broker that ran (MDP-D-10; issue 28, the README's fuzz block under load).
    Here the broker is stopped (SIGSTOP) for 0.6 s while this process sleeps, and this process
    sleeps 0.1 s more while the broker runs again and heartbeats: the burst read then shows no
    gap, and the heartbeats missing from it count as the broker's lag. (A liveness of 10, so
    that the broker keeps the pacemaker through the stall.)"""
    liveness = 10
    argv = [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
            "--heartbeat-interval", str(INTERVAL), "--liveness", str(liveness),
            "--log-level", "error"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    run = BrokerRun(proc.stdout.readline().split()[-1], Timing(INTERVAL, liveness))
    try:
        pace = run.pacemaker
        give_up = time.monotonic() + 10
        while not pace.ever_heard and time.monotonic() < give_up:
            pace.tick(time.monotonic())
            pace.drain()
            time.sleep(0.01)
        assert pace.ever_heard
        since = time.monotonic()
        os.kill(proc.pid, signal.SIGSTOP)  # the broker does not run...
        time.sleep(0.6)  # ...nor does the fuzzer: nothing read, nothing sent
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.1)  # the broker runs and heartbeats; the fuzzer still reads nothing
        pace.drain()
        assert not pace.stalled(time.monotonic())  # it heartbeated: running now
        assert pace.lag_since(since) >= 0.3
    finally:
        run.close()
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.timeout(60)
def test_a_request_sent_unseen_to_a_left_socket_may_have_been_lost_more_often(
    domo_broker: str,
) -> None:
    """w0 dies idle and comes back on a new socket (its old one left unread while the broker
    still counts it registered); c1's request goes to the dead socket unseen, then to two more
    workers that die, and domo's broker drops it at its redispatch limit (MDP-D-08) while w1
    sits idle. The fuzzer saw two losses of it, not three, and required it resent (MDP-S-01;
    issue 28, the README's fuzz block, 6 of 6 replays on the oracle before)."""
    steps = [
        Step("die", 0, 0),
        Step("unexpected", 0, 2),
        Step("wait", 0, 1),
        Step("request", 1, 6),
        Step("disconnect", 1, 0),
        Step("ready", 1, 2),
        Step("disconnect", 0, 0),
        Step("pause", 0, 3),
        Step("die", 0, 0),
        Step("die", 1, 1),
        Step("pause", 1, 3),
        Step("reply", 0, 2),
    ]
    for _ in range(2):
        assert _play(domo_broker, steps) == []


@pytest.mark.timeout(60)
def test_the_pacemaker_is_not_registered_anew_at_every_tick_under_a_large_jitter(
    domo_broker: str,
) -> None:
    """With a jitter of 100 ms (the floor here stands for a loaded machine) the keep-alive limit
    (liveness x interval - 0.02 s - 2 x jitter) is 80 ms, under one interval: the pacemaker,
    heartbeating every interval, was found too late at every tick and registered anew on a new
    socket, 20 a second per lane (issue 28: 271 in 10 s, the broker flooded, a probe's worker
    found unreachable, MDP-W-16 named on domo's broker)."""
    run = BrokerRun(domo_broker, Timing(INTERVAL, LIVENESS, JitterMeter(floor=0.1)))
    try:
        pace = run.pacemaker
        until = time.monotonic() + 1.0
        while (now := time.monotonic()) < until:
            pace.tick(now)
            pace.drain()
            time.sleep(0.01)
        assert pace.sockets <= 2
    finally:
        run.close()
