"""A Binary Star pair of ``domo broker`` processes under SIGKILL and SIGSTOP.

What it proves (issue 26, item 5; docs/reliability.md holds a full run's figures):

- **kill**: with the primary active and the backup passive, the primary is SIGKILLed while
  clients submit durable requests (Titanic, connected to both brokers, as are the workers and
  the clients). The backup must serve within 2 pair heartbeats plus one client timeout of the
  kill, and every durable request submitted before, during and after the takeover is answered:
  0 lost, 0 wrong.
- **stop**: the primary is SIGSTOPped while clients keep calling, long enough for the backup to
  take over, then resumed. Each broker prints every change of its pair state with the wall time;
  the run rebuilds from those records when each one served, removes the time the primary was
  stopped (a stopped process serves nobody), and checks that at no instant did both serve.

Run it as ``python tests/chaos/binary_star.py`` (``--help``), through ``nox -s chaos``, or
through ``tests/titanic/test_durable_chaos.py`` (the short form CI runs). Loopback only; every
process is killed by PID at the end; every wait is bounded.
"""

from __future__ import annotations

import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script: the checkout's root, so that ``tests`` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import domo.sync
from domo.runtime.errors import DomoError
from domo.titanic.sync import TitanicClient
from tests.chaos.durable_procs import DOMO, RECORDING_WORKER, Processes, free_port, script_main

SERVICE = "pair.echo"
RECORD = re.compile(
    r"domo broker: pair (\w+): (\w+) -> (\w+) \((serving|not serving)\) at ([0-9.]+); (\S+): (.*)"
)


@dataclass
class PairChaosConfig:
    requests: int = 400  # durable requests in the kill phase
    clients: int = 2
    pair_beat: float = 0.25  # --pair-heartbeat
    beat: float = 0.2  # MDP heartbeat of brokers, workers, Titanic
    timeout: float = 1.0  # a client's wait before it tries the other broker
    stop_seconds: float = 3.0  # how long the primary stays SIGSTOPped
    time_limit: float = 300.0


@dataclass
class PairChaosResult:
    submitted: int = 0
    fetched: int = 0
    lost: int = 0
    wrong: int = 0
    takeover_seconds: float = -1.0  # from the SIGKILL to the backup serving
    takeover_bound: float = 0.0  # 2 pair heartbeats + 1 client timeout
    first_reply_after_kill_seconds: float = -1.0
    stop_records: dict[str, list[str]] = field(default_factory=dict)
    overlap_seconds: float = 0.0  # time both served in the stop phase (must be 0)
    backup_took_over_in_stop: bool = False
    primary_unsure_after_resume: bool = False
    stop_calls_answered: int = 0
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and not self.timed_out
            and self.lost == 0
            and self.wrong == 0
            and self.fetched == self.submitted > 0
            and 0 <= self.takeover_seconds <= self.takeover_bound
            and self.overlap_seconds == 0.0
            and self.backup_took_over_in_stop
            and self.primary_unsure_after_resume
        )


def _records(text: str) -> list[tuple[float, bool, str]]:
    """(wall time, serving, line) of each pair record in a broker's output."""
    found = []
    for match in RECORD.finditer(text):
        found.append((float(match.group(5)), match.group(4) == "serving", match.group(0)))
    return found


def _serving_intervals(
    records: list[tuple[float, bool, str]], end: float, stopped: tuple[float, float] | None = None
) -> list[tuple[float, float]]:
    """When a broker served, from its records; minus the time it was SIGSTOPped."""
    intervals: list[tuple[float, float]] = []
    since: float | None = None
    for at, serving, _ in records:
        if serving and since is None:
            since = at
        elif not serving and since is not None:
            intervals.append((since, at))
            since = None
    if since is not None:
        intervals.append((since, end))
    if stopped is None:
        return intervals
    cut: list[tuple[float, float]] = []
    for start, stop in intervals:
        for piece in ((start, min(stop, stopped[0])), (max(start, stopped[1]), stop)):
            if piece[0] < piece[1]:
                cut.append(piece)
    return cut


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


class _Pair:
    def __init__(self, processes: Processes, config: PairChaosConfig, log_dir: Path) -> None:
        self.processes = processes
        self.endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
        pair = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
        beats = ["--heartbeat-interval", str(config.beat), "--liveness", "3"]
        pair_beat = ["--pair-heartbeat", str(config.pair_beat)]
        for name, role, bind, own, peer in (
            ("primary", "--primary", self.endpoints[0], pair[0], pair[1]),
            ("backup", "--backup", self.endpoints[1], pair[1], pair[0]),
        ):
            processes.start(
                name,
                [*DOMO, "broker", "--bind", bind, role, "--pair-bind", own, "--pair-peer", peer,
                 *pair_beat, *beats],
            )  # fmt: skip
        processes.wait_for("primary", r"primary -> active \(serving\)")
        processes.wait_for("backup", r"backup -> passive")
        both = [arg for endpoint in self.endpoints for arg in ("--connect", endpoint)]
        processes.start(
            "titanic",
            [*DOMO, "titanic", *both, "--db", str(log_dir / "titanic.db"), "--synchronous",
             "normal", "--dispatch-timeout", "2", "--retry-initial", "0.1", "--retry-max", "1",
             *beats],
        )  # fmt: skip
        processes.wait_for("titanic", "domo titanic: serving")
        processes.start(
            "worker",
            [*RECORDING_WORKER, SERVICE, str(log_dir / "executions.log"), *self.endpoints,
             "--beat", str(config.beat)],
        )  # fmt: skip
        processes.wait_for("worker", "serving")


def _kill_phase(config: PairChaosConfig, result: PairChaosResult, log_dir: Path) -> None:
    processes = Processes(log_dir / "kill")
    (log_dir / "kill").mkdir()
    deadline = time.monotonic() + config.time_limit / 2
    try:
        pair = _Pair(processes, config, log_dir / "kill")
        lock = threading.Lock()
        killed_at: list[float] = []
        first_reply: list[float] = []
        submitted: dict[str, bytes] = {}

        def client(number: int) -> None:
            with domo.sync.Client(pair.endpoints, timeout=config.timeout, retries=1) as c:
                titanic = TitanicClient(c)
                for n in range(number, config.requests, config.clients):
                    body = b"pair-%06d" % n
                    while time.monotonic() < deadline:
                        try:
                            request_id = titanic.submit(SERVICE, body)
                        except DomoError:
                            continue
                        with lock:
                            submitted[request_id] = body
                            if killed_at and not first_reply:
                                first_reply.append(time.time())
                        break
                    time.sleep(0.005)

        threads = [
            threading.Thread(target=client, args=(n,), daemon=True) for n in range(config.clients)
        ]
        for thread in threads:
            thread.start()
        while len(submitted) < config.requests // 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        killed_at.append(time.time())
        processes.kill("primary", signal.SIGKILL)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        result.submitted = len(submitted)
        with domo.sync.Client(pair.endpoints, timeout=config.timeout, retries=1) as c:
            titanic = TitanicClient(c)
            waiting = dict(submitted)
            while waiting and time.monotonic() < deadline:
                for request_id, body in list(waiting.items()):
                    try:
                        fetched = titanic.fetch(request_id)
                    except DomoError:
                        continue
                    if fetched.pending:
                        continue
                    del waiting[request_id]
                    if fetched.unknown:
                        result.lost += 1
                        result.problems.append(f"{request_id}: {fetched.text}")
                    elif fetched.body != [body + b"!"]:
                        result.wrong += 1
                    else:
                        result.fetched += 1
                time.sleep(0.05)
            if waiting:
                result.timed_out = True
                result.lost += len(waiting)
        backup = _records(processes.log("backup"))
        serving = [at for at, is_serving, _ in backup if is_serving and at > killed_at[0]]
        if serving:
            result.takeover_seconds = serving[0] - killed_at[0]
        else:
            result.problems.append("the backup never served after the primary was killed")
        result.takeover_bound = 2 * config.pair_beat + config.timeout
        if first_reply:
            result.first_reply_after_kill_seconds = first_reply[0] - killed_at[0]
    finally:
        processes.stop_all()


def _stop_phase(config: PairChaosConfig, result: PairChaosResult, log_dir: Path) -> None:
    processes = Processes(log_dir / "stop")
    (log_dir / "stop").mkdir()
    deadline = time.monotonic() + config.time_limit / 2
    try:
        pair = _Pair(processes, config, log_dir / "stop")
        running = threading.Event()
        running.set()
        answered = [0]

        def caller() -> None:
            with domo.sync.Client(pair.endpoints, timeout=config.timeout, retries=1) as c:
                while running.is_set() and time.monotonic() < deadline:
                    try:
                        if c.request("mmi.service", SERVICE.encode()) is not None:
                            answered[0] += 1
                    except DomoError:
                        pass
                    time.sleep(0.02)

        thread = threading.Thread(target=caller, daemon=True)
        thread.start()
        time.sleep(1.0)
        stopped_at = time.time()
        processes.kill("primary", signal.SIGSTOP)
        time.sleep(config.stop_seconds)
        resumed_at = time.time()
        processes.kill("primary", signal.SIGCONT)
        time.sleep(max(2.0, 6 * config.pair_beat))
        running.clear()
        thread.join(10)
        end = time.time()
        primary = _records(processes.log("primary"))
        backup = _records(processes.log("backup"))
        result.stop_records = {
            "primary": [line for _, _, line in primary],
            "backup": [line for _, _, line in backup],
        }
        result.stop_calls_answered = answered[0]
        result.backup_took_over_in_stop = any(
            serving and stopped_at < at < resumed_at for at, serving, _ in backup
        )
        after = [(at, serving, line) for at, serving, line in primary if at >= resumed_at]
        # The first thing the primary did after SIGCONT: its first input found the gap and it
        # stopped serving (BSTAR-12) before it handled that input. Until that record it handled
        # nothing at all, so it served nobody from the SIGSTOP to that record.
        woke = after[0] if after else None
        result.primary_unsure_after_resume = (
            woke is not None and woke[1] is False and "BSTAR-12: not run" in woke[2]
        )
        idle = (stopped_at, woke[0] if result.primary_unsure_after_resume and woke else resumed_at)
        result.overlap_seconds = _overlap(
            _serving_intervals(primary, end, idle), _serving_intervals(backup, end)
        )
    finally:
        processes.stop_all()


def run_pair_chaos(config: PairChaosConfig, log_dir: Path | None = None) -> PairChaosResult:
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="domo-pair-chaos-"))
    result = PairChaosResult()
    _kill_phase(config, result, log_dir)
    _stop_phase(config, result, log_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    return script_main(__doc__.split("\n\n")[0], PairChaosConfig, run_pair_chaos, argv)


if __name__ == "__main__":
    sys.exit(main())
