"""Durable requests (Titanic, 9/TSP) while workers, Titanic and the broker are SIGKILLed.

What it proves (issue 26, item 5; docs/reliability.md holds a full run's figures): clients
submit durable requests to ``domo titanic`` through a ``domo broker`` and fetch their replies,
while the chaos thread SIGKILLs a random one of the broker, Titanic and the workers about every
``--kill-every`` seconds and starts it again (the broker on the same endpoint, Titanic on the
same database file). At the end:

- every request a client submitted (its id answered ``200``) has its reply fetched exactly once
  by that client, and that reply is its own (the worker answers ``body + "!"``): 0 lost, 0 wrong;
- after ``close``, fetching it again says unknown: no reply is handed out twice;
- re-executions are counted, not forbidden: execution is at least once (TSP-D-04). The workers
  log every body they run; a body run twice is a re-execution (a request in flight when
  something died, or a submit whose ``200`` was lost and was sent again).

Run it as ``python tests/chaos/titanic_chaos.py`` (``--help``), through ``nox -s chaos``
(10,000 requests), or through ``tests/titanic/test_durable_chaos.py`` (the short form CI runs).
Everything is on 127.0.0.1; every process is killed by PID at the end; every wait is bounded.
"""

from __future__ import annotations

import random
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
from tests.chaos.durable_procs import (
    DOMO,
    RECORDING_WORKER,
    Processes,
    executions,
    free_port,
    script_main,
)

SERVICE = "chaos.echo"


@dataclass
class TitanicChaosConfig:
    requests: int = 1_000
    clients: int = 4
    workers: int = 2
    batch: int = 50  # a client submits this many, then fetches them
    kill_every: float = 1.0  # seconds between two SIGKILLs (with +-50 % jitter)
    beat: float = 0.2  # heartbeat of broker, workers and Titanic
    timeout: float = 1.0  # a client's wait for one answer from Titanic
    time_limit: float = 900.0
    synchronous: str = "normal"
    seed: int = 0
    max_kills: int = 0  # stop killing after this many (0: kill until the clients are done)


@dataclass
class TitanicChaosResult:
    requests: int = 0
    submitted: int = 0
    fetched: int = 0  # replies fetched (done), one per request
    closed_then_unknown: int = 0
    lost: int = 0  # submitted, never fetched done (or unknown)
    wrong: int = 0  # another request's reply
    duplicate_fetches: int = 0
    executions: int = 0  # bodies run by the workers, with repeats
    re_executions: int = 0  # runs beyond the first, over all requests
    requests_run_more_than_once: int = 0
    submit_retries: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.problems
            and not self.timed_out
            and self.lost == 0
            and self.wrong == 0
            and self.duplicate_fetches == 0
            and self.fetched == self.requests == self.submitted
            and self.closed_then_unknown == self.requests
        )


class _Client(threading.Thread):
    def __init__(
        self, number: int, bodies: list[bytes], endpoint: str, config: TitanicChaosConfig,
        deadline: float, result: TitanicChaosResult, lock: threading.Lock,
        killed_once: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True, name=f"chaos-client-{number}")
        self.bodies = bodies
        self.endpoint = endpoint
        self.config = config
        self.deadline = deadline
        self.result = result
        self.lock = lock
        self.killed_once = killed_once  # set when the killer has killed every victim once
        self.done: dict[bytes, int] = {}

    def _retry(self, what: str, call: object) -> object:
        while time.monotonic() < self.deadline:
            try:
                return call()  # type: ignore[operator]
            except DomoError:
                with self.lock:
                    self.result.submit_retries += what == "submit"
                time.sleep(0.05)
        raise TimeoutError(what)

    def run(self) -> None:
        try:
            with domo.sync.Client(self.endpoint, timeout=self.config.timeout, retries=1) as c:
                titanic = TitanicClient(c)
                starts = range(0, len(self.bodies), self.config.batch)
                for start in starts:
                    last = start == starts[-1]
                    self._batch(titanic, self.bodies[start : start + self.config.batch], last)
        except TimeoutError as error:
            with self.lock:
                self.result.timed_out = True
                self.result.problems.append(f"{self.name}: out of time in {error}")

    def _batch(self, titanic: TitanicClient, bodies: list[bytes], last: bool) -> None:
        ids: dict[str, bytes] = {}
        for body in bodies:
            request_id = self._retry("submit", lambda body=body: titanic.submit(SERVICE, body))
            assert isinstance(request_id, str)
            ids[request_id] = body
            with self.lock:
                self.result.submitted += 1
        # A fast machine can finish every request before the killer has gone round once;
        # the last batch stays stored, unfetched, until every victim has been killed.
        if last and not self.killed_once.wait(max(0.0, self.deadline - time.monotonic())):
            raise TimeoutError("the killer's first round")
        waiting = dict(ids)
        while waiting:
            if time.monotonic() > self.deadline:
                raise TimeoutError("fetch")
            for request_id, body in list(waiting.items()):
                try:
                    fetched = titanic.fetch(request_id)
                except DomoError:
                    continue
                if fetched.pending:
                    continue
                del waiting[request_id]
                with self.lock:
                    if fetched.unknown:
                        self.result.lost += 1
                        self.result.problems.append(f"{request_id} ({body!r}): {fetched.text}")
                        continue
                    self.result.fetched += 1
                    self.done[body] = self.done.get(body, 0) + 1
                    if self.done[body] > 1:
                        self.result.duplicate_fetches += 1
                    if fetched.body != [body + b"!"]:
                        self.result.wrong += 1
                        self.result.problems.append(f"{body!r} answered {fetched.body!r}")
            time.sleep(0.05)
        for request_id in ids:
            self._retry("close", lambda request_id=request_id: titanic.close(request_id))
            after = self._retry("fetch", lambda request_id=request_id: titanic.fetch(request_id))
            with self.lock:
                if getattr(after, "unknown", False):
                    self.result.closed_then_unknown += 1
                else:
                    self.result.problems.append(f"{request_id} after close: {after}")


def run_titanic_chaos(
    config: TitanicChaosConfig, log_dir: Path | None = None
) -> TitanicChaosResult:
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="domo-titanic-chaos-"))
    processes = Processes(log_dir)
    result = TitanicChaosResult(requests=config.requests)
    rng = random.Random(config.seed)
    beats = ["--heartbeat-interval", str(config.beat), "--liveness", "3"]
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    executed_log = log_dir / "executions.log"
    started = time.monotonic()
    deadline = started + config.time_limit
    try:
        processes.start("broker", [*DOMO, "broker", "--bind", endpoint, *beats])
        processes.wait_for("broker", "listening on")
        processes.start(
            "titanic",
            [*DOMO, "titanic", "--connect", endpoint, "--db", str(log_dir / "titanic.db"),
             "--synchronous", config.synchronous, "--dispatch-timeout", "2",
             "--retry-initial", "0.1", "--retry-max", "1", *beats],
        )  # fmt: skip
        processes.wait_for("titanic", "domo titanic: serving")
        workers = [f"worker{n}" for n in range(config.workers)]
        for name in workers:
            processes.start(
                name,
                [
                    *RECORDING_WORKER,
                    SERVICE,
                    str(executed_log),
                    endpoint,
                    "--beat",
                    str(config.beat),
                ],
            )
        lock = threading.Lock()
        killed_once = threading.Event()
        bodies = [b"request-%06d" % n for n in range(config.requests)]
        share = [bodies[n :: config.clients] for n in range(config.clients)]
        clients = [
            _Client(n, mine, endpoint, config, deadline, result, lock, killed_once)
            for n, mine in enumerate(share)
        ]
        for client in clients:
            client.start()
        victims = ["broker", "titanic", *workers]
        order: list[str] = []
        kills = 0
        while any(client.is_alive() for client in clients) and time.monotonic() < deadline:
            if config.max_kills and kills >= config.max_kills:
                killed_once.set()  # the killer is done: nobody waits for more
                time.sleep(0.05)
                continue
            kills += 1
            time.sleep(config.kill_every * rng.uniform(0.5, 1.5))
            if not any(client.is_alive() for client in clients):
                break
            if not order:  # every victim once per round, in a random order
                order = rng.sample(victims, len(victims))
            victim = order.pop()
            processes.kill(victim, signal.SIGKILL)
            time.sleep(rng.uniform(0.05, 0.5))
            processes.restart(victim)
            if not order:
                killed_once.set()  # every victim killed once (and restarted)
        for client in clients:
            client.join(max(0.0, deadline - time.monotonic()) + 1)
            if client.is_alive():
                result.timed_out = True
    finally:
        processes.stop_all()
    result.seconds = time.monotonic() - started
    result.kills = dict(processes.kills)
    counts = executions(executed_log)
    result.executions = sum(counts.values())
    result.re_executions = sum(n - 1 for n in counts.values())
    result.requests_run_more_than_once = sum(1 for n in counts.values() if n > 1)
    never = [body for body in bodies if body not in counts]
    if never:
        result.problems.append(f"{len(never)} requests never ran, e.g. {never[:3]}")
    return result


def main(argv: list[str] | None = None) -> int:
    return script_main(__doc__.split("\n\n")[0], TitanicChaosConfig, run_titanic_chaos, argv)


if __name__ == "__main__":
    sys.exit(main())
