"""The fuzzer as the broker: against domo's worker and client (nothing found) and planted ones."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from domo.fuzz import FuzzOptions, Replay, Step, fuzz, load_replay, replay_file, save_replay
from domo.fuzz.broker_target import Timing
from domo.fuzz.worker_target import WorkerRun
from domo.protocol import mdp

from .conftest import INTERVAL, LIVENESS

PLANTED = Path(__file__).with_name("planted_peers.py")
ANY_PORT = "tcp://127.0.0.1:0"
DOMO = [sys.executable, "-m", "domo"]
DOMO_WORKER = [
    *DOMO,
    "worker",
    "--connect",
    "{endpoint}",
    "--heartbeat-interval",
    str(INTERVAL),
    "--liveness",
    str(LIVENESS),
    "--log-level",
    "error",
    "echo",
]
DOMO_CLIENT = [
    *DOMO,
    "call",
    "--connect",
    "{endpoint}",
    "--repeat",
    "0",
    "--timeout",
    "0.5",
    "--retries",
    "1",
    "--log-level",
    "error",
    "echo",
    "hello",
]


def _options(target: str, command: list[str], tmp_path: Path, **kw: object) -> FuzzOptions:
    values: dict[str, object] = {
        "target": target,
        "command": command,
        "heartbeat_interval": INTERVAL,
        "liveness": LIVENESS,
        "examples": 20,
        "max_steps": 8,
        "time_budget": 8.0,
        "seed": 1,
        "findings_dir": tmp_path,
    }
    values.update(kw)
    return FuzzOptions(ANY_PORT, **values)  # type: ignore[arg-type]


def _planted(role: str, flaw: str) -> list[str]:
    argv = [sys.executable, str(PLANTED), role, flaw, "{endpoint}"]
    return [*argv, str(INTERVAL), str(LIVENESS)] if role == "worker" else argv


@pytest.mark.parametrize(("target", "command"), [("worker", DOMO_WORKER), ("client", DOMO_CLIENT)])
def test_domo_peer_conforms(target: str, command: list[str], tmp_path: Path) -> None:
    """`domo worker` and `domo call --repeat 0`, started by the fuzzer: nothing found."""
    result = fuzz(_options(target, command, tmp_path, examples=12), progress=None)
    assert result.examples >= 3
    assert result.findings == []


@pytest.mark.parametrize("role", ["worker", "client"])
def test_control_planted_peer_conforms(role: str, tmp_path: Path) -> None:
    """The hand-written peers with no flaw are clean, so each flaw alone is what is caught."""
    result = fuzz(_options(role, _planted(role, "none"), tmp_path, examples=10), progress=None)
    assert result.examples >= 3
    assert result.findings == []


@pytest.mark.parametrize(
    ("role", "flaw", "rule"),
    [
        ("worker", "final-without-request", "MDP-R-01"),
        ("worker", "no-heartbeat", "MDP-H-04"),
        ("worker", "ignore-disconnect", "MDP-W-17"),
        ("worker", "wrong-address", "MDP-R-03"),
        ("worker", "die-on-garbage", "MDP-W-08"),
        ("client", "ignore-service", "MDP-D-20"),
        ("client", "partial-is-final", "MDP-C-05"),
    ],
)
def test_planted_peer_is_caught(role: str, flaw: str, rule: str, tmp_path: Path) -> None:
    options = _options(role, _planted(role, flaw), tmp_path, first=True, time_budget=5.0)
    result = fuzz(options, progress=None)
    assert rule in result.rules, [str(f.violation) for f in result.findings]
    finding = next(f for f in result.findings if f.violation.rule == rule)
    assert finding.replay_file == tmp_path / f"{role}-{rule}.json"
    replay = load_replay(finding.replay_file)
    assert (replay.target, replay.rule, replay.steps) == (role, rule, finding.steps)


def test_a_peer_that_never_serves_is_reported_with_what_it_sent(tmp_path: Path) -> None:
    """A worker whose every message is malformed cannot be played a scenario: the fuzzer says
    so and reports what it sent (a finding, exit 1), rather than "unreachable" (exit 3)."""
    command = _planted("worker", "delimiter-first")
    result = fuzz(_options("worker", command, tmp_path), progress=None)
    assert result.rules == ["MDP-W-08"]
    assert result.examples == 0
    assert "sent READY and answered a request" in result.never_served
    assert result.findings[0].steps == []
    assert "expected header b'MDPW02', got b''" in result.findings[0].violation.explanation


def test_replay_runs_again_against_a_peer(tmp_path: Path) -> None:
    """A saved worker scenario runs again: the flaw shows, the control passes the same steps."""
    steps = [Step("request", 0, 0), Step("wait", 0, 2), Step("request", 0, 6)]
    path = tmp_path / "scenario.json"
    save_replay(path, Replay("worker", INTERVAL, LIVENESS, steps, "MDP-R-01"))
    replay = load_replay(path)
    flawed = _options("worker", _planted("worker", "final-without-request"), tmp_path)
    assert "MDP-R-01" in [v.rule for v in replay_file(flawed, replay)]
    control = _options("worker", _planted("worker", "none"), tmp_path)
    assert replay_file(control, replay) == []


def test_a_probe_abandoned_with_its_connection_is_sent_again() -> None:
    """A worker may leave a connection holding the fuzzer's probe (a silence that began up to an
    interval after the last HEARTBEAT reaches its liveness, MDP-H-06; the request is abandoned,
    MDP-D-17): the probe goes again on the new connection, so a worker that serves there is not
    reported as no longer answering (the false MDP-D-17 of the conformance run at f7231a0)."""
    run = WorkerRun("tcp://127.0.0.1:0", Timing(INTERVAL, LIVENESS))
    requests_seen: list[int] = []

    def worker() -> None:  # leaves its first connection when the first REQUEST comes
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        deadline = time.monotonic() + 10.0
        for connection in range(2):
            socket = context.socket(zmq.DEALER)
            socket.linger = 0
            socket.connect(run.endpoint)
            socket.send_multipart(mdp.worker_ready_frames(b"echo"))
            try:
                while time.monotonic() < deadline:
                    if not socket.poll(50):
                        continue
                    frames = socket.recv_multipart()
                    if frames[1] != mdp.W_REQUEST:
                        continue
                    requests_seen.append(connection)
                    if connection == 0:
                        break  # abandoned: a new socket, READY again
                    client, body = frames[2], frames[4:]
                    socket.send_multipart(mdp.worker_final_frames(client, body))
                    return
            finally:
                socket.close()

    peer = threading.Thread(target=worker)
    peer.start()
    try:
        assert run.probe(8.0, first=True)
    finally:
        peer.join(timeout=15.0)
        run.close()
    assert requests_seen == [0, 1]


def test_a_worker_leaving_after_a_long_gap_is_not_blamed_for_a_short_silence() -> None:
    """A silence step shorter than liveness x interval can still leave the worker a longer gap:
    it runs from the fuzzer's last message before the step, and a starved fuzzer sends late.
    A worker that counts the gap when the next HEARTBEAT arrives, and then opens a new
    connection, is within MDP-H-05: the fuzzer judges the longest gap it left, not the time
    since that HEARTBEAT (the false "after only 0.00 s of broker silence" of the planted runs
    on 2026-11-28)."""
    run = WorkerRun("tcp://127.0.0.1:0", Timing(INTERVAL, LIVENESS))
    patience = LIVENESS * INTERVAL
    done = threading.Event()
    connections: list[int] = []

    def worker() -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        socket = None
        try:
            deadline = time.monotonic() + 10.0
            while not done.is_set() and time.monotonic() < deadline:
                socket = context.socket(zmq.DEALER)
                socket.linger = 0
                socket.connect(run.endpoint)
                socket.send_multipart(mdp.worker_ready_frames(b"echo"))
                connections.append(len(connections))
                last_heard = last_sent = time.monotonic()
                while not done.is_set() and time.monotonic() < deadline:
                    if time.monotonic() - last_sent >= INTERVAL:
                        socket.send_multipart(mdp.HEARTBEAT_FRAMES)
                        last_sent = time.monotonic()
                    if not socket.poll(10):
                        continue
                    socket.recv_multipart()
                    now = time.monotonic()
                    if now - last_heard > patience:  # the broker was silent too long
                        break
                    last_heard = now
                socket.close()
                socket = None
        finally:
            if socket is not None:
                socket.close()

    peer = threading.Thread(target=worker)
    peer.start()
    try:
        conn = run.wait_for_worker(5.0, first=True)
        assert conn is not None
        run.to_worker(conn, mdp.HEARTBEAT_FRAMES)
        time.sleep(patience + INTERVAL)  # the fuzzer starved: nothing sent, nothing read
        silence = 0.05
        assert silence <= patience - run.t.slack, "the step must count as a short silence"
        run.violations = []
        run.silence(conn, silence)
        run.pump(time.monotonic() + patience)
        assert connections == [0, 1], "the worker should have left after the long gap"
        assert [v.rule for v in run.violations if v.rule == "MDP-H-05"] == [], run.violations
    finally:
        done.set()
        peer.join(timeout=15.0)
        run.close()
