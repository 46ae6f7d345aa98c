"""Search for rule violations with Hypothesis, shrink each, report it and save a replay file.

:func:`fuzz_broker` runs rounds of ``hypothesis.find``: each round looks for a scenario that
breaks a rule not found yet, and Hypothesis shrinks it to a small one. Rounds stop when a round
finds nothing new, or the example or time budget is spent. Every example runs in real time
against the real target, so the budgets bound the run. A target that stops serving ends the
search at once: the scenario that killed it is reported as it ran, unshrunk, because shrinking
would run against a dead target.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from .broker_target import BrokerRun, TargetDied, Timing, Unreachable, Violation
from .scenario import Replay, Step, describe, save_replay, scenarios

__all__ = ["Finding", "FuzzOptions", "FuzzResult", "format_finding", "fuzz_broker", "replay_broker"]


@dataclass(frozen=True, slots=True)
class FuzzOptions:
    """Bounds and timing of one fuzzing run."""

    endpoint: str
    heartbeat_interval: float = 0.1
    liveness: int = 3
    examples: int = 100
    max_steps: int = 12
    time_budget: float = 60.0
    seed: int = 0
    findings_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """One violated rule, with the shrunk scenario that shows it."""

    violation: Violation
    steps: list[Step]
    replay_file: Path | None = None


@dataclass
class FuzzResult:
    """What a run found, and how much it ran."""

    findings: list[Finding] = field(default_factory=list)
    examples: int = 0
    seconds: float = 0.0

    @property
    def rules(self) -> list[str]:
        return [f.violation.rule for f in self.findings]


def format_finding(finding: Finding) -> str:
    """A finding as the readable block ``domo fuzz`` prints."""
    lines = [f"{finding.violation.rule}: {finding.violation.explanation}", "  scenario:"]
    lines += [f"    {i}. {describe(s)}" for i, s in enumerate(finding.steps, 1)]
    if finding.replay_file is not None:
        lines.append(f"  replay: domo fuzz --replay {finding.replay_file} ENDPOINT")
    return "\n".join(lines)


def fuzz_broker(options: FuzzOptions, progress: TextIO | None = sys.stderr) -> FuzzResult:
    """Fuzz the broker at ``options.endpoint``; ``Unreachable`` if it never answers a probe."""
    timing = Timing(options.heartbeat_interval, options.liveness)
    run = BrokerRun(options.endpoint, timing)
    result = FuzzResult()
    start = time.monotonic()
    try:
        if not run.probe("start", timing.probe_timeout):
            raise Unreachable(
                f"no MDP/0.2 broker answered at {options.endpoint} within "
                f"{timing.probe_timeout:.1f} s"
            )
        rng = random.Random(options.seed)
        found: set[str] = set()
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
                try:
                    seen = run.run(steps)
                except TargetDied as dead:
                    died.append((dead.violation, list(steps)))
                    failing[tuple(steps)] = [dead.violation]
                    return True
                _show(progress, run.examples, elapsed, found, options)
                new = [v for v in seen if v.rule not in found]
                if new:
                    failing[tuple(steps)] = new
                return bool(new)

            try:
                steps = find(
                    scenarios(options.max_steps),
                    breaks_new_rule,
                    settings=settings(
                        database=None,
                        max_examples=max(1, options.examples - run.examples),
                        deadline=None,
                        suppress_health_check=list(HealthCheck),
                        phases=[Phase.generate, Phase.shrink],
                    ),
                    random=rng,
                )
            except NoSuchExample:
                break
            except Exception:
                if not failing:
                    raise
                steps = list(sorted(failing.keys(), key=len)[0])
            if died:
                violation, steps = died[0]
                result.findings.append(_finding(options, violation, steps))
                break
            for violation in failing.get(tuple(steps), []):
                if violation.rule not in found:
                    found.add(violation.rule)
                    result.findings.append(_finding(options, violation, steps))
            if stop or not failing:
                break
    finally:
        run.close()
        result.examples = run.examples
        result.seconds = time.monotonic() - start
        if progress is not None:
            progress.write("\n")
    return result


def replay_broker(
    endpoint: str, replay: Replay, show: Callable[[str], None] | None = None
) -> list[Violation]:
    """Run the scenario of a replay file once against ``endpoint``; the violations seen."""
    timing = Timing(replay.heartbeat_interval, replay.liveness)
    run = BrokerRun(endpoint, timing)
    try:
        if not run.probe("start", timing.probe_timeout):
            raise Unreachable(
                f"no MDP/0.2 broker answered at {endpoint} within {timing.probe_timeout:.1f} s"
            )
        if show is not None:
            for i, step in enumerate(replay.steps, 1):
                show(f"  {i}. {describe(step)}")
        try:
            return run.run(replay.steps)
        except TargetDied as dead:
            return [dead.violation]
    finally:
        run.close()


def _finding(options: FuzzOptions, violation: Violation, steps: list[Step]) -> Finding:
    path = None
    if options.findings_dir is not None:
        path = options.findings_dir / f"broker-{violation.rule}.json"
        save_replay(
            path,
            Replay(
                "broker",
                options.heartbeat_interval,
                options.liveness,
                steps,
                violation.rule,
                violation.explanation,
            ),
        )
    return Finding(violation, steps, path)


def _show(
    progress: TextIO | None, examples: int, elapsed: float, found: set[str], o: FuzzOptions
) -> None:
    if progress is None:
        return
    rules = ", ".join(sorted(found)) or "none"
    progress.write(
        f"\rdomo fuzz: {examples}/{o.examples} examples, {elapsed:.0f}/{o.time_budget:.0f} s, "
        f"rules broken: {rules}   "
    )
    progress.flush()
