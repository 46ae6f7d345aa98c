"""Plant each bug listed in tests/mutants/*.toml in a copy of the core; the suite must catch it.

Each mutant names a file under ``src/``, an ``old`` snippet that must occur exactly once there, the
``new`` snippet that replaces it, and the rule of ``specs/mdp-0.2.md`` it breaks. For each mutant
this script copies ``src/domo`` to a temporary directory, applies the change, and runs the core's
tests (``tests/protocol``) against the copy with ``PYTHONPATH`` pointing at it. A mutant is
*killed* when pytest reports failing tests (exit code 1); any other outcome (passing, or pytest
unable to run) means the suite has a hole or the mutant is stale, and the session fails.

Usage: ``python tests/mutants/run.py [--only ID ...] [--jobs N] [--list]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_DIR = Path(__file__).resolve().parent
PYTEST_TARGET = "tests/protocol"
# A mutant can make the core loop forever (a timer re-armed in the past); that is caught too,
# but it must not hang CI.
TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class Mutant:
    """One planted bug."""

    id: str
    rule: str
    file: str
    old: str
    new: str
    description: str


@dataclass(frozen=True)
class Outcome:
    """What the suite did with one mutant."""

    mutant: Mutant
    killed: bool
    detail: str
    seconds: float


def load_mutants() -> list[Mutant]:
    """Every mutant of every ``*.toml`` file next to this script, in file then list order."""
    mutants: list[Mutant] = []
    for path in sorted(MUTANTS_DIR.glob("*.toml")):
        with path.open("rb") as handle:
            data = tomllib.load(handle)
        for entry in data.get("mutant", []):
            mutants.append(Mutant(**entry))
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"duplicate mutant ids: {duplicates}")
    return mutants


def plant(mutant: Mutant, workdir: Path) -> Path:
    """Copy src/domo into ``workdir`` and apply ``mutant``; return the new ``src`` directory."""
    src = workdir / "src"
    shutil.copytree(ROOT / "src" / "domo", src / "domo")
    target = src / Path(mutant.file).relative_to("src")
    text = target.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"'old' occurs {count} times in {mutant.file}, expected exactly once")
    target.write_text(text.replace(mutant.old, mutant.new))
    return src


def run_one(mutant: Mutant) -> Outcome:
    """Plant one mutant and run the core's tests against it."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"domo-mutant-{mutant.id}-") as tmp:
        try:
            src = plant(mutant, Path(tmp))
        except ValueError as error:
            return Outcome(mutant, False, f"stale mutant: {error}", time.monotonic() - started)
        env = dict(os.environ, PYTHONPATH=str(src), CI="true", PYTHONDONTWRITEBYTECODE="1")
        env["HYPOTHESIS_PROFILE"] = "mutants"  # the ci profile without shrinking
        # Prove the copy is what the tests import before trusting the result.
        probe = subprocess.run(
            [sys.executable, "-c", "import domo; print(domo.__file__)"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if not probe.stdout.strip().startswith(str(src)):
            return Outcome(mutant, False, f"imports {probe.stdout.strip()!r}, not the copy", 0.0)
        try:
            result = run_suite(env)
        except subprocess.TimeoutExpired:
            seconds = time.monotonic() - started
            return Outcome(mutant, True, f"the suite hung (> {TIMEOUT_SECONDS}s)", seconds)
    seconds = time.monotonic() - started
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else result.stderr.strip()[-200:]
    if result.returncode == 1:
        failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        return Outcome(mutant, True, failed[0] if failed else summary, seconds)
    return Outcome(mutant, False, f"pytest exit {result.returncode}: {summary}", seconds)


def run_suite(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the core's tests with ``env`` (whose PYTHONPATH points at a mutated copy)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "--no-header",
            # The spec-vs-code table check would "kill" any mutant of a table without a
            # behaviour test noticing; only behaviour counts here.
            "--ignore=tests/protocol/test_spec.py",
            PYTEST_TARGET,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_SECONDS,
    )


def main() -> int:
    """Run the mutants; exit 0 only if every one was killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only these mutant ids")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel runs")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    mutants = load_mutants()
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            parser.error(f"unknown mutant ids: {unknown}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id:32} {m.rule:9} {m.description}")
        return 0
    print(f"planting {len(mutants)} mutants, {args.jobs} at a time", flush=True)
    survivors = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for outcome in pool.map(run_one, mutants):
            verdict = "killed " if outcome.killed else "SURVIVED"
            survivors += not outcome.killed
            print(
                f"{verdict} {outcome.mutant.id:32} {outcome.mutant.rule:9} "
                f"{outcome.seconds:6.1f}s  {outcome.detail}",
                flush=True,
            )
    print(f"{len(mutants) - survivors}/{len(mutants)} mutants killed")
    return 1 if survivors or not mutants else 0


if __name__ == "__main__":
    sys.exit(main())
