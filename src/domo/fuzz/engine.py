"""The search every broker fuzzer of ``domo fuzz`` shares: scenarios side by side, steered to the
rules judged least, each finding shrunk to a small scenario.

A scenario is a *plan*, a tuple of steps the dialect's runner knows how to play; this module
knows nothing of any protocol. It runs plans on several *lanes* at once (threads, each with its
own sockets to the target: a scenario spends nearly all its time waiting for the target's
heartbeats and deadlines, so lanes multiply the scenarios per second rather than compete for the
CPU), asks the dialect's :class:`Planner` for each new plan with the rule coverage so far (how
often each rule was judged), and, when a plan breaks a rule not found before, shrinks it: chunks
of steps are removed, then steps replaced by simpler ones (``Planner.simpler``), each candidate
run on a free lane, until no candidate breaks that rule again or the shrink's runs are spent.

The plan of scenario ``n`` is drawn from ``random.Random(seed * 1_000_003 + n)`` and the coverage
seen when it is drawn: the same seed repeats the same search as far as the coverage repeats
(timing can shift what a scenario got to judge); a replay file repeats one plan exactly.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "Lane",
    "Outcome",
    "Planner",
    "SearchFinding",
    "SearchResult",
    "Violation",
    "search",
]

Plan = tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: its id in the dialect's spec and what the target did."""

    rule: str
    explanation: str


@dataclass
class Outcome:
    """What one scenario judged and found."""

    violations: list[Violation] = field(default_factory=list)
    judged: frozenset[str] = frozenset()  # the rules a check had something to judge in it
    fatal: Violation | None = None  # the target stopped serving: the search ends
    unjudged: bool = False  # the machine stalled: nothing of it was judged


class Lane(Protocol):
    """One lane's connection to the target; ``play`` plays one plan."""

    def play(self, plan: Plan) -> Outcome: ...

    def close(self) -> None: ...


class Planner(Protocol):
    """A dialect's scenarios: what to draw next, and what is simpler than a step."""

    rules: tuple[str, ...]  # the rules its checks can judge (coverage: those never judged)
    death_rule: str  # the rule a target that stopped serving for no reason of its own breaks

    def draw(self, rng: random.Random, judged: Mapping[str, int]) -> Plan: ...

    def simpler(self, step: Hashable) -> Sequence[Hashable]: ...


@dataclass
class SearchFinding:
    """A broken rule and the smallest plan found that breaks it."""

    violation: Violation
    plan: Plan
    seconds: float  # from the start of the search until first seen
    shrink_runs: int = 0
    scenarios: int = 1  # how many scenarios of the run broke it


@dataclass
class SearchResult:
    findings: list[SearchFinding] = field(default_factory=list)
    scenarios: int = 0
    seconds: float = 0.0
    judged: Counter[str] = field(default_factory=Counter)  # rule -> scenarios that judged it
    held: Counter[str] = field(default_factory=Counter)  # rule -> ... in which it held
    unjudged: int = 0
    stopped: str | None = None  # the target stopped serving: why
    lanes: int = 1
    errors: list[str] = field(default_factory=list)  # a lane's own crash (a fuzzer bug)

    @property
    def rules(self) -> list[str]:
        return [f.violation.rule for f in self.findings]

    @property
    def scenarios_per_second(self) -> float:
        return self.scenarios / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Job:
    plan: Plan
    number: int
    started: float = 0.0
    shrink: _Shrink | None = None


@dataclass
class _Shrink:
    """Shrinking one finding: remove chunks of steps, then simplify steps one by one."""

    rule: str
    best: Plan
    limit: int  # runs at most
    chunk: int = 0
    phase: str = "remove"  # remove, simplify, done
    runs: int = 0
    waiting: int = 0  # candidates of the current batch not back yet
    winners: list[Plan] = field(default_factory=list)

    def batch(self, planner: Planner) -> list[Plan]:
        """The next candidates to run (empty when done)."""
        while self.phase != "done":
            if self.phase == "remove":
                if self.chunk == 0:
                    self.chunk = max(1, len(self.best) // 2)
                k = self.chunk
                found = [
                    self.best[:i] + self.best[i + k :]
                    for i in range(0, len(self.best), k)
                    if len(self.best) > k
                ]
                if found:
                    return found
                self.phase = "simplify"
            else:
                found = [
                    (*self.best[:i], simple, *self.best[i + 1 :])
                    for i, step in enumerate(self.best)
                    for simple in planner.simpler(step)
                ]
                if found:
                    return found
                self.phase = "done"
        return []

    def settle(self) -> None:
        """The batch is back: keep the smallest plan that broke the rule again, or go finer."""
        if self.winners:
            self.best = min(self.winners, key=lambda p: (len(p), repr(p)))
            self.winners = []
            self.chunk = max(1, len(self.best) // 2)
            self.phase = "remove"
        elif self.phase == "remove" and self.chunk > 1:
            self.chunk //= 2
        elif self.phase == "remove":
            self.phase = "simplify"
        else:
            self.phase = "done"


def search(
    open_lane: Callable[[int], Lane],
    planner: Planner,
    *,
    seed: int,
    lanes: int,
    time_budget: float,
    examples: int = 1_000_000,
    stop_after: Sequence[str] = (),
    first: bool = False,
    shrink: bool = True,
    shrink_runs: int = 48,
    progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """Run plans on ``lanes`` lanes until ``time_budget`` seconds or ``examples`` scenarios.

    ``open_lane(i)`` is called in lane ``i``'s own thread (its sockets live there). A rule in
    ``stop_after`` ends the search once found (unshrunk: a measurement wants the time); ``first``
    ends it after the first finding is shrunk.
    """
    result = SearchResult(lanes=lanes)
    start = time.monotonic()
    jobs: queue.Queue[_Job | None] = queue.Queue()
    done: queue.Queue[tuple[_Job, Outcome | BaseException]] = queue.Queue()
    opened = threading.Barrier(lanes + 1, timeout=60)
    threads = [
        threading.Thread(
            target=_lane_loop, args=(open_lane, i, jobs, done, opened), daemon=True, name=f"lane{i}"
        )
        for i in range(lanes)
    ]
    for thread in threads:
        thread.start()
    by_rule: dict[str, SearchFinding] = {}
    shrinking: list[_Shrink] = []
    candidates: list[_Job] = []
    inflight = drawn = 0
    stopping = False
    fatal: list[tuple[_Job, Outcome]] = []
    try:
        try:
            opened.wait()
        except threading.BrokenBarrierError:
            stopping = True
        while True:
            elapsed = time.monotonic() - start
            if elapsed >= time_budget:
                stopping = True
            while not stopping and inflight < lanes:
                if candidates:
                    job = candidates.pop(0)
                elif drawn < examples:
                    rng = random.Random(seed * 1_000_003 + drawn)
                    job = _Job(planner.draw(rng, result.judged), drawn)
                    drawn += 1
                else:
                    break
                job.started = time.monotonic()
                jobs.put(job)
                inflight += 1
            if inflight == 0:
                break
            try:
                job, outcome = done.get(timeout=1.0)
            except queue.Empty:
                continue
            inflight -= 1
            if isinstance(outcome, BaseException):
                result.errors.append(f"{type(outcome).__name__}: {outcome}")
                stopping = True
                continue
            result.scenarios += 1
            seconds = time.monotonic() - start
            if outcome.unjudged:
                result.unjudged += 1
            broken = {v.rule for v in outcome.violations}
            if outcome.fatal is not None:
                broken.add(outcome.fatal.rule)
            for rule in outcome.judged:
                result.judged[rule] += 1
                if rule not in broken:
                    result.held[rule] += 1
            if outcome.fatal is not None:
                fatal.append((job, outcome))
                stopping = True
                continue
            if stopping and job.shrink is None and fatal:
                continue
            for violation in outcome.violations:
                known = by_rule.get(violation.rule)
                if known is not None:
                    if job.shrink is None:
                        known.scenarios += 1
                    continue
                finding = SearchFinding(violation, job.plan, seconds)
                by_rule[violation.rule] = finding
                result.findings.append(finding)
                if progress is not None:
                    progress(f"{violation.rule}: {violation.explanation} (after {seconds:.1f} s)")
                if violation.rule in stop_after:
                    stopping = True
                elif shrink and len(job.plan) > 1:
                    task = _Shrink(violation.rule, job.plan, shrink_runs)
                    shrinking.append(task)
                    candidates += _next_batch(task, planner, drawn)
                elif first:
                    stopping = True
            owner = job.shrink
            if owner is not None:
                owner.runs += 1
                owner.waiting -= 1
                if owner.rule in {v.rule for v in outcome.violations}:
                    owner.winners.append(job.plan)
                if owner.waiting == 0:
                    owner.settle()
                    finding = by_rule[owner.rule]
                    finding.plan, finding.shrink_runs = owner.best, owner.runs
                    batch = [] if owner.runs >= owner.limit else _next_batch(owner, planner, drawn)
                    if batch:
                        candidates += batch
                    else:
                        shrinking.remove(owner)
                        if first:
                            stopping = True
        if fatal:
            # Every lane's probe fails once the target stops: the culprit is the plan that did
            # what the death is blamed on, if one did (malformed input), else the first begun.
            specific = [f for f in fatal if f[1].fatal and f[1].fatal.rule != planner.death_rule]
            job, outcome = min(specific or fatal, key=lambda f: f[0].started)
            assert outcome.fatal is not None
            result.stopped = outcome.fatal.explanation
            for violation in [*outcome.violations, outcome.fatal]:
                if violation.rule not in by_rule:
                    finding = SearchFinding(violation, job.plan, time.monotonic() - start)
                    by_rule[violation.rule] = finding
                    result.findings.append(finding)
        for task in shrinking:  # out of time: the smallest plan reached so far
            finding = by_rule[task.rule]
            finding.plan, finding.shrink_runs = task.best, task.runs
    finally:
        for _ in threads:
            jobs.put(None)
        for thread in threads:
            thread.join(timeout=30)
        result.seconds = time.monotonic() - start
    return result


def _next_batch(task: _Shrink, planner: Planner, drawn: int) -> list[_Job]:
    plans = task.batch(planner)[: max(0, task.limit - task.runs)]
    task.waiting = len(plans)
    return [_Job(plan, drawn, shrink=task) for plan in plans]


def _lane_loop(
    open_lane: Callable[[int], Lane],
    index: int,
    jobs: queue.Queue[_Job | None],
    done: queue.Queue[tuple[_Job, Outcome | BaseException]],
    opened: threading.Barrier,
) -> None:
    try:
        lane = open_lane(index)
    except BaseException as error:  # reported by the first job it would have run
        opened.abort()
        while (job := jobs.get()) is not None:
            done.put((job, error))
        return
    with contextlib.suppress(threading.BrokenBarrierError):
        opened.wait()
    try:
        while (job := jobs.get()) is not None:
            try:
                outcome: Outcome | BaseException = lane.play(job.plan)
            except Exception as error:  # a fuzzer bug: reported, the search stops
                outcome = error
            done.put((job, outcome))
    finally:
        lane.close()
