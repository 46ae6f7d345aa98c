"""Search for rule violations with Hypothesis, shrink each, report it and save a replay file.

:func:`fuzz` runs rounds of ``hypothesis.find``: each round looks for a scenario that
breaks a rule not found yet, and Hypothesis shrinks it to a small one. Rounds stop when a round
finds nothing new, or the example or time budget is spent. Every example runs in real time
against the real target, so the budgets bound the run. A target that stops serving ends the
search at once: the scenario that killed it is reported as it ran, unshrunk, because shrinking
would run against a dead target.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, TextIO

import zmq
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from . import engine
from .broker_target import BrokerRun, NeverServed, TargetDied, Timing, Violation
from .client_target import ClientRun
from .dialect import DIALECT_RULES, Wire
from .plans import BROKER_RULES, BrokerPlanner
from .scenario import (
    JUDGED_RULES,
    STEP_RULES,
    TARGETS,
    Replay,
    Step,
    describe,
    save_replay,
    scenarios,
)
from .worker_target import WorkerRun

__all__ = [
    "Finding",
    "FuzzOptions",
    "FuzzResult",
    "format_coverage",
    "format_finding",
    "format_rule_coverage",
    "fuzz",
    "fuzz_broker",
    "open_run",
    "replay_broker",
    "replay_file",
]


_ROUND = 25  # scenarios per round of the search at most


class _Run(Protocol):
    """What the search needs of a target: one of BrokerRun, WorkerRun, ClientRun."""

    examples: int
    coverage: Counter[str]

    def first_probe(self) -> list[Violation]: ...

    def run(self, steps: list[Step]) -> list[Violation]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class FuzzOptions:
    """What to fuzz, and the bounds and timing of one fuzzing run.

    ``target`` is ``"broker"`` (``endpoint`` is a running broker to connect to), ``"worker"`` or
    ``"client"`` (domo binds ``endpoint`` and plays the broker; ``command``, if given, starts the
    peer, ``{endpoint}`` in it replaced by the endpoint actually bound).
    """

    endpoint: str
    target: str = "broker"
    command: str | Sequence[str] | None = None
    heartbeat_interval: float = 0.1
    liveness: int = 3
    examples: int = 100
    max_steps: int = 12
    time_budget: float = 60.0
    seed: int | None = None  # None: a fresh one, reported in FuzzResult.seed
    findings_dir: Path | None = None
    first: bool = False  # stop at the first violation found (after shrinking it)
    # The dispatch policy the target says it follows where MDP-A-04 leaves the choice open
    # ("lru": the worker idle longest gets the next request); None: not judged.
    dispatch: str | None = None
    mmi: bool = True  # judge the MMI answers (MDP-M-01, MDP-M-02): the target implements RFC 8
    stop_after: tuple[str, ...] = ()  # stop once one of these rules is found (measurements)
    # The dialect of the clients and workers played against a broker (domo.fuzz.dialect).
    dialect: str = "mdp02"
    # Scenarios run side by side against a broker (each on sockets of its own); 1 plays them
    # one after another. A worker or client target is always played one scenario at a time.
    lanes: int = 24


@dataclass(frozen=True, slots=True)
class Finding:
    """One violated rule, with the shrunk scenario that shows it."""

    violation: Violation
    steps: list[Step]
    replay_file: Path | None = None
    seconds: float | None = None  # from the start of the run until the rule was first seen


@dataclass
class FuzzResult:
    """What a run found, and how much it ran."""

    findings: list[Finding] = field(default_factory=list)
    examples: int = 0
    seconds: float = 0.0
    never_served: str = ""  # why no scenario could run, when the peer never served
    seed: int = 0  # the seed the search used: ``--seed`` repeats it
    coverage: Counter[str] = field(default_factory=Counter)  # rule id -> scenarios judging it
    held: Counter[str] | None = None  # rule id -> scenarios in which it was judged and held
    judged: tuple[str, ...] = ()  # the rules this target's checks can judge
    # The largest jitter sample of each kind (domo.fuzz.jitter): what the windows allowed for.
    jitter: dict[str, float] = field(default_factory=dict)

    @property
    def rules(self) -> list[str]:
        return [f.violation.rule for f in self.findings]

    @property
    def scenarios_per_second(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else 0.0

    @property
    def never_reached(self) -> list[str]:
        """Judged rules that no scenario of this run exercised."""
        return [rule for rule in self.judged if self.coverage[rule] == 0]


def format_coverage(result: FuzzResult) -> str:
    """Per rule id, in how many scenarios a check judged it (and, where counted, in how many
    of those it held); then the rules never reached."""
    rules = sorted(set(result.coverage) | set(result.judged))
    if result.held is not None:
        held = result.held
        counts = ", ".join(f"{rule} {result.coverage[rule]}/{held[rule]}" for rule in rules)
        title = "rule coverage (judged/held)"
    else:
        counts = ", ".join(f"{rule} {result.coverage[rule]}" for rule in rules)
        title = "rule coverage (exercised)"
    lines = [f"domo fuzz: {title}: {counts or 'nothing exercised'}"]
    if result.never_reached:
        lines.append(
            f"domo fuzz: warning: rules never reached: {', '.join(result.never_reached)} "
            "(give the search more time or steps)"
        )
    return "\n".join(lines)


def format_rule_coverage(
    judged: Mapping[str, int], held: Mapping[str, int], rules: Sequence[str]
) -> str:
    """The coverage line of a search: per rule, in how many scenarios a check judged it and in
    how many of those it held; then the rules that no scenario judged."""
    shown = sorted(set(judged) | set(rules))
    counts = ", ".join(f"{rule} {judged.get(rule, 0)}/{held.get(rule, 0)}" for rule in shown)
    lines = [f"domo fuzz: rule coverage (judged/held): {counts or 'nothing judged'}"]
    never = [rule for rule in rules if not judged.get(rule, 0)]
    if never:
        lines.append(
            f"domo fuzz: warning: rules never reached: {', '.join(never)} "
            "(give the search more time or steps)"
        )
    return "\n".join(lines)


def format_finding(
    finding: Finding,
    target: str = "broker",
    endpoint: str = "ENDPOINT",
    command: str | Sequence[str] | None = None,
) -> str:
    """A finding as the readable block ``domo fuzz`` prints; the replay hint names ``endpoint``
    and ``command`` (the ones the run used), so that it can be pasted as it is."""
    when = "" if finding.seconds is None else f" (after {finding.seconds:.1f} s)"
    lines = [f"{finding.violation.rule}: {finding.violation.explanation}{when}", "  scenario:"]
    lines += [f"    {i}. {describe(s, target)}" for i, s in enumerate(finding.steps, 1)]
    if not finding.steps:
        lines.append("    (none: seen while the peer first connected)")
    if finding.replay_file is not None:
        hint = ["domo", "fuzz", "--replay", str(finding.replay_file), endpoint]
        if command is not None:
            text = command if isinstance(command, str) else shlex.join(command)
            hint += ["--exec", text]
        lines.append(f"  replay: {shlex.join(hint)}")
    return "\n".join(lines)


def open_run(options: FuzzOptions, timing: Timing | None = None) -> _Run:
    """Connect to (broker) or bind (worker, client) ``options.endpoint``; ``timing`` (the
    agreed interval and liveness, and the jitter meter) is made from ``options`` if not given."""
    if timing is None:
        timing = Timing(options.heartbeat_interval, options.liveness)
    if options.target == "broker":
        if options.command is not None:
            raise ValueError("--exec starts a worker or client; start the broker yourself")
        return BrokerRun(
            options.endpoint,
            timing,
            dispatch=options.dispatch,
            mmi=options.mmi,
            wire=Wire(options.dialect),
        )
    if options.dialect != "mdp02":
        raise ValueError(f"--dialect {options.dialect}: only a broker is fuzzed in other dialects")
    if options.target == "worker":
        return WorkerRun(options.endpoint, timing, options.command)
    if options.target == "client":
        return ClientRun(options.endpoint, timing, options.command)
    raise ValueError(f"unknown target {options.target!r} (one of {', '.join(TARGETS)})")


def fuzz_broker(options: FuzzOptions, progress: TextIO | None = sys.stderr) -> FuzzResult:
    """Fuzz the broker at ``options.endpoint`` (``options.target`` is ignored)."""
    return fuzz(replace(options, target="broker"), progress)


def fuzz(options: FuzzOptions, progress: TextIO | None = sys.stderr) -> FuzzResult:
    """Fuzz ``options.target``; ``Unreachable`` if it never answers a first probe.

    ``ValueError`` for an endpoint that cannot be bound or a command that cannot be started.
    """
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**32)
    options = replace(options, seed=seed)
    if options.target == "broker" and options.command is None:
        return _search_broker(options, progress)
    timing = Timing(options.heartbeat_interval, options.liveness)
    run = open_run(options, timing)
    # MDP-A-04 is a MAY: judged only when the target says which choice it made; the MMI rules
    # only when it implements MMI.
    skipped = {"MDP-A-04"} if options.dispatch is None else set()
    skipped |= set() if options.mmi else {"MDP-M-01", "MDP-M-02", "MDP-D-14"}
    judged = tuple(rule for rule in JUDGED_RULES[options.target] if rule not in skipped)
    if options.target == "broker":
        judged += DIALECT_RULES.get(options.dialect, ())
    result = FuzzResult(seed=seed, judged=judged)
    start = time.monotonic()
    if progress is not None:
        progress.write(f"domo fuzz: seed {seed} (--seed {seed} repeats this search)\n")
        progress.flush()
    if progress is not None and isinstance(run, WorkerRun | ClientRun):
        who = "starting it with --exec" if options.command is not None else "start it now"
        progress.write(f"domo fuzz: bound {run.endpoint} for the {options.target}; {who}\n")
        progress.flush()
    try:
        found: set[str] = set()
        try:
            first = run.first_probe()
        except NeverServed as never:
            # No scenario can run; what it sent instead is the finding (exit 7, not 9).
            first = never.violations
            result.never_served = str(never)
            options = replace(options, examples=0)
        for violation in first:
            if violation.rule not in found:
                found.add(violation.rule)
                result.findings.append(_finding(options, violation, [], time.monotonic() - start))
        rng = random.Random(seed)
        first_seen: dict[str, float] = {}
        if options.examples == 0:
            return result
        died: list[tuple[Violation, list[Step]]] = []
        stop: list[bool] = []
        while time.monotonic() - start < options.time_budget:
            failing: dict[tuple[Step, ...], list[Violation]] = {}

            def breaks_new_rule(
                steps: list[Step], failing: dict[tuple[Step, ...], list[Violation]] = failing
            ) -> bool:
                # Never raise in here: Hypothesis would shrink the exception itself.
                if tuple(steps) in failing:
                    return (
                        True  # Hypothesis runs the final example again: a real-time run may differ
                    )
                elapsed = time.monotonic() - start
                if died or stop:
                    return False
                if elapsed > options.time_budget or (
                    not failing and run.examples >= options.examples
                ):
                    stop.append(True)
                    return False
                if options.target != "broker":  # the broker target counts its own checks
                    for step in steps:
                        run.coverage.update(STEP_RULES[options.target].get(step.kind, ()))
                try:
                    seen = run.run(steps)
                except TargetDied as dead:
                    died.append((dead.violation, list(steps)))
                    failing[tuple(steps)] = [
                        *(v for v in dead.seen if v.rule not in found),
                        dead.violation,
                    ]
                    for v in failing[tuple(steps)]:
                        first_seen.setdefault(v.rule, time.monotonic() - start)
                    return True
                _show(progress, run.examples, elapsed, found, options)
                for v in seen:
                    first_seen.setdefault(v.rule, time.monotonic() - start)
                new = [v for v in seen if v.rule not in found]
                if new:
                    failing[tuple(steps)] = new
                return bool(new)

            try:
                steps = find(
                    scenarios(options.max_steps, options.target),
                    breaks_new_rule,
                    settings=settings(
                        database=None,
                        # Rounds of a bounded size: once the budget is spent, Hypothesis
                        # would otherwise go on drawing the rest of max_examples for nothing.
                        max_examples=max(1, min(_ROUND, options.examples - run.examples)),
                        deadline=None,
                        suppress_health_check=list(HealthCheck),
                        phases=[Phase.generate, Phase.shrink],
                    ),
                    random=rng,
                )
            except NoSuchExample:
                if stop or died or run.examples >= options.examples:
                    break
                continue
            except Exception:
                if not failing:
                    raise
                steps = list(sorted(failing.keys(), key=len)[0])
            if died:
                _, steps = died[0]
                for violation in failing.get(tuple(steps), []):
                    if violation.rule not in found:
                        found.add(violation.rule)
                        result.findings.append(
                            _finding(options, violation, steps, first_seen.get(violation.rule))
                        )
                break
            for violation in failing.get(tuple(steps), []):
                if violation.rule not in found:
                    found.add(violation.rule)
                    result.findings.append(
                        _finding(options, violation, steps, first_seen.get(violation.rule))
                    )
            # Shrinking keeps a scenario that breaks some new rule, not every one seen on the
            # way: a rule another example of this round broke is reported too, with the
            # shortest example that broke it, rather than lost until a later round meets it.
            for seen_steps in [] if options.first else sorted(failing, key=len):
                for violation in failing[seen_steps]:
                    if violation.rule not in found:
                        found.add(violation.rule)
                        result.findings.append(
                            _finding(
                                options,
                                violation,
                                list(seen_steps),
                                first_seen.get(violation.rule),
                            )
                        )
            if stop or not failing or (options.first and result.findings):
                break
            if found & set(options.stop_after):
                break
    finally:
        run.close()
        result.examples = run.examples
        result.coverage = Counter(run.coverage)
        result.jitter = dict(timing.meter.largest)
        result.seconds = time.monotonic() - start
        if progress is not None and _is_terminal(progress):
            progress.write("\n")  # ends the progress line
    return result


def broker_rules(options: FuzzOptions) -> tuple[str, ...]:
    """The rules the broker target judges with these options (coverage: those never judged)."""
    skipped = set() if options.mmi else {"MDP-M-01", "MDP-M-02", "MDP-D-14"}
    if not Wire(options.dialect).worker_partials:
        skipped |= {"MDP-D-09", "MDP-C-02"}  # no PARTIAL to send or forward
    if not Wire(options.dialect).one_outstanding:
        skipped |= {"MDP-S-02", "MDP-D-12"}  # several requests outstanding (MDP01-09)
    if not Wire(options.dialect).worker_sends_request:
        skipped.add("MDP-R-02")
    if options.dialect != "mdp02":
        skipped |= {"MDP-C-02", "MDP-C-03"}  # the dialect's own reply frames instead
    rules = tuple(rule for rule in BROKER_RULES if rule not in skipped)
    if options.dispatch is not None:
        rules += ("MDP-A-04",)
    return rules + DIALECT_RULES.get(options.dialect, ())


def _context() -> zmq.Context[zmq.Socket[bytes]]:
    """A context for the lanes: ZeroMQ's default of 1,023 sockets was reached once with 8
    lanes under load (closed sockets count until its reaper thread, starved too, frees them):
    "a lane failed: Too many open files"."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 8192)
    return context


def _search_broker(options: FuzzOptions, progress: TextIO | None) -> FuzzResult:
    """The broker target: scenarios on ``options.lanes`` lanes, steered and shrunk by
    :func:`domo.fuzz.engine.search`."""
    assert options.seed is not None
    timing = Timing(options.heartbeat_interval, options.liveness)
    wire = Wire(options.dialect)
    result = FuzzResult(seed=options.seed, judged=broker_rules(options))
    start = time.monotonic()
    context = _context()

    def open_lane(_: int) -> BrokerRun:
        own = os.environ.get("DOMO_FUZZ_CONTEXT") == "lane"
        return BrokerRun(
            options.endpoint,
            timing,
            context=_context() if own else context,
            owns_context=own,
            dispatch=options.dispatch,
            mmi=options.mmi,
            wire=Wire(options.dialect),
        )

    if progress is not None:
        progress.write(
            f"domo fuzz: seed {options.seed} (--seed {options.seed} repeats this search)\n"
        )
        progress.flush()
    try:
        first = open_lane(0)
        try:
            seen = first.first_probe()
        except NeverServed as never:
            seen, result.never_served = never.violations, str(never)
        finally:
            first.close()
        for violation in seen:
            if violation.rule not in result.rules:
                result.findings.append(_finding(options, violation, [], time.monotonic() - start))
        if result.never_served or options.examples == 0:
            return result

        def show(line: str) -> None:
            if progress is not None:
                progress.write(f"domo fuzz: found {line}\n")
                progress.flush()

        planner = BrokerPlanner(
            result.judged, options.max_steps, mmi=options.mmi, partials=wire.worker_partials
        )
        budget = max(0.0, options.time_budget - (time.monotonic() - start))
        searched = engine.search(
            open_lane,
            planner,
            seed=options.seed,
            lanes=max(1, options.lanes),
            time_budget=budget,
            examples=options.examples,
            stop_after=options.stop_after,
            first=options.first,
            progress=show,
        )
        for error in searched.errors:
            raise RuntimeError(f"domo fuzz: a lane failed: {error}")
        for f in searched.findings:
            if f.violation.rule in result.rules:
                continue
            steps = [step for step in f.plan if isinstance(step, Step)]
            result.findings.append(_finding(options, f.violation, steps, f.seconds))
        result.examples = searched.scenarios
        result.coverage = Counter(searched.judged)
        result.held = Counter(searched.held)
    finally:
        context.destroy(linger=0)
        result.jitter = dict(timing.meter.largest)
        result.seconds = time.monotonic() - start
    return result


def replay_broker(
    endpoint: str, replay: Replay, show: Callable[[str], None] | None = None
) -> list[Violation]:
    """Run the scenario of a broker replay file once against the broker at ``endpoint``."""
    return replay_file(FuzzOptions(endpoint), replay, show)


def replay_file(
    options: FuzzOptions, replay: Replay, show: Callable[[str], None] | None = None
) -> list[Violation]:
    """Run the scenario of a replay file once; the violations seen.

    The target and timing come from the file; ``options`` gives the endpoint and ``command``.
    """
    options = replace(
        options,
        target=replay.target,
        heartbeat_interval=replay.heartbeat_interval,
        liveness=replay.liveness,
        dialect=replay.dialect,
    )
    run = open_run(options)
    try:
        try:
            seen = run.first_probe()
        except NeverServed as never:
            return never.violations
        if show is not None:
            for i, step in enumerate(replay.steps, 1):
                show(f"  {i}. {describe(step, replay.target)}")
        try:
            return seen + run.run(replay.steps)
        except TargetDied as dead:
            return [*seen, *dead.seen, dead.violation]
    finally:
        run.close()


def _finding(
    options: FuzzOptions, violation: Violation, steps: list[Step], seconds: float | None = None
) -> Finding:
    path = None
    if options.findings_dir is not None:
        dialect = "" if options.dialect == "mdp02" else f"{options.dialect}-"
        path = options.findings_dir / f"{options.target}-{dialect}{violation.rule}.json"
        save_replay(
            path,
            Replay(
                options.target,
                options.heartbeat_interval,
                options.liveness,
                steps,
                violation.rule,
                violation.explanation,
                options.dialect,
            ),
        )
    return Finding(violation, steps, path, seconds)


def _is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal: a '\\r' progress line is for people, not for a log."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def _show(
    progress: TextIO | None, examples: int, elapsed: float, found: set[str], o: FuzzOptions
) -> None:
    if progress is None or not _is_terminal(progress):
        return
    rules = ", ".join(sorted(found)) or "none"
    progress.write(
        f"\rdomo fuzz: {examples}/{o.examples} examples, {elapsed:.0f}/{o.time_budget:.0f} s, "
        f"rules broken: {rules}   "
    )
    progress.flush()
