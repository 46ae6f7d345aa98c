"""``domo fuzz``: play a target's peers and check it against the spec (``domo.fuzz``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from domo.endpoints import EndpointError, check_endpoint
from domo.protocol import BrokerConfig
from domo.protocol.layers.emqp import credit_cap
from domo.trio.broker import NNG_EXTRA_HINT, NNG_SCHEME

from . import _common
from ._common import (
    CONNECT_SCHEMES,
    EXIT_ENDPOINT,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    FUZZ_DIALECTS,
    FUZZ_TARGETS,
    _add_heartbeat_options,
    _count,
    _endpoint_to_bind_or_connect,
    _integer,
    _positive_float,
    _subcommand,
)

# The dialects fuzzed by a search of their own (not the MDP broker target's scenarios).
SEARCHES_OF_THEIR_OWN = ("memo01", "dcp", "emqp")
# Scenarios side by side by default: an MDP scenario is light (a few sockets, heartbeats); an
# eMQP or DCP one starts more peers and probes after each step; memo01's run trio per lane.
LANES = {"mdp02": 24, "mdp01": 24, "majortomo": 24, "emqp": 8, "dcp": 8, "memo01": 4}


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = BrokerConfig()
    sub = _subcommand(
        commands,
        "fuzz",
        "check an MDP/0.2 broker, worker or client against domo's model",
        "Check an MDP/0.2 peer against the rules of specs/mdp-0.2.md with generated scenarios, "
        "each finding shrunk to a small scenario. --target broker (the default): play clients "
        "and workers against the broker running at ENDPOINT, --lanes scenarios side by side, "
        "steered to the rules judged least. --target worker or client: bind ENDPOINT "
        "and play the broker against the worker or client that connects to it; --exec CMD starts "
        "it ('{endpoint}' in CMD becomes the endpoint bound, e.g. tcp://127.0.0.1:0 picks a free "
        "port), else start it yourself. A client under test must send requests one after another "
        "for ever (e.g. `domo call --repeat 0`). --dialect mdp01 or majortomo plays that dialect's "
        "clients and workers against a broker; --dialect memo01, dcp or emqp plays that "
        "dialect's peers in scenarios of its own. Use a short --heartbeat-interval and give the "
        "peer the same --heartbeat-interval and --liveness. Each violation is printed with its "
        "rule id and a shrunk scenario, saved for --replay (exit codes below).",
        _fuzz,
        "warning",
        prepare=_check_fuzz,
    )
    sub.add_argument(
        "endpoint",
        metavar="ENDPOINT",
        type=_fuzz_endpoint,
        help="the broker to check, or the endpoint to bind for a worker or client "
        "(tcp:// or ipc://)",
    )
    sub.add_argument(
        "--target",
        choices=list(FUZZ_TARGETS),
        default=None,
        help="what is checked (default: broker; with --replay, the file's target)",
    )
    sub.add_argument(
        "--exec",
        dest="command",
        metavar="CMD",
        help="start the worker or client under test with CMD (split like a shell would, run "
        "without one; '{endpoint}' replaced); restarted if it exits between scenarios",
    )
    _add_heartbeat_options(sub, defaults.heartbeat_interval, defaults.liveness)
    sub.add_argument(
        "--examples",
        type=partial(_integer, least=1),
        default=100,
        metavar="N",
        help="scenarios to run at most (default: %(default)s)",
    )
    sub.add_argument(
        "--max-steps",
        type=partial(_integer, least=1),
        default=12,
        metavar="N",
        help="steps per scenario at most (default: %(default)s)",
    )
    sub.add_argument(
        "--time-budget",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="stop searching after this long (default: %(default)s)",
    )
    sub.add_argument(
        "--seed",
        type=_count,
        default=None,
        metavar="N",
        help="seed of the search; the same seed repeats a run (default: a fresh one, printed)",
    )
    sub.add_argument(
        "--lanes",
        type=partial(_integer, least=1),
        default=None,
        metavar="N",
        help="scenarios run side by side against a broker, each on sockets of its own "
        f"(default: {LANES['mdp02']} for the MDP dialects, {LANES['emqp']} for emqp and dcp, "
        f"{LANES['memo01']} for memo01; 1 plays them one after another)",
    )
    sub.add_argument(
        "--dispatch",
        choices=["lru"],
        default=None,
        help="the broker's choice of worker where MDP-A-04 leaves it open, to be judged too "
        "(lru: the worker idle the longest gets the next request; default: not judged)",
    )
    sub.add_argument(
        "--dialect",
        choices=list(FUZZ_DIALECTS),
        default=None,
        help="the dialect of the clients and workers played against a broker: mdp02 (RFC 18, "
        "the default), mdp01 (RFC 7, specs/mdp-0.1.md) or majortomo (specs/majortomo.md); "
        "with --replay, the file's; memo01 (specs/memo01.md) plays MemoDB workers and clients "
        "against a broker's nng+tcp:// or nng+ipc:// ENDPOINT (needs pip install 'domo[nng]'); "
        "dcp (specs/dcp-v1.md) plays DagBox DCP v1 workers and clients, both type-frame widths, "
        "against a broker (--examples, --time-budget, --seed, --heartbeat-interval, --liveness); "
        "emqp (specs/emqp-1.0.md) plays EventMQ's eMQP/1.0 workers and clients, hand-framed, "
        "in random scenarios from --seed (see --workers, --no-malformed)",
    )
    sub.add_argument(
        "--workers",
        type=partial(_endpoint_to_bind_or_connect, CONNECT_SCHEMES),
        metavar="ENDPOINT",
        help="--dialect emqp: where the workers connect, if not ENDPOINT (EventMQ's router "
        "has its own socket for them)",
    )
    sub.add_argument(
        "--credits",
        type=partial(_integer, least=1),
        default=credit_cap(defaults.pipe_messages),
        metavar="N",
        help="--dialect emqp: the broker's cap on one worker's free slots (EMQP-06: 64 at most; "
        "domo broker's follows from --max-peer-bytes over --max-message-bytes, see "
        "specs/emqp-1.0.md; default: %(default)s, domo broker's with its defaults)",
    )
    sub.add_argument(
        "--no-malformed",
        dest="malformed",
        action="store_false",
        help="--dialect emqp: send no near misses (a broker that stops on one can still be "
        "checked on the rest)",
    )
    sub.add_argument(
        "--no-mmi",
        dest="mmi",
        action="store_false",
        help="the broker does not implement MMI (RFC 8): do not send or judge mmi.* requests",
    )
    sub.add_argument(
        "--first",
        action="store_true",
        help="stop at the first rule found broken (after shrinking its scenario)",
    )
    sub.add_argument(
        "--findings-dir",
        type=Path,
        default=Path("domo-fuzz-findings"),
        metavar="DIR",
        help="where replay files go (default: %(default)s)",
    )
    sub.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="run the scenario saved in FILE once instead of searching (its target, interval "
        "and liveness come from the file)",
    )


def _check_fuzz(args: argparse.Namespace) -> None:
    nng = args.endpoint.startswith(NNG_SCHEME)
    if (args.dialect == "memo01" and not nng) or (nng and args.dialect not in ("memo01", None)):
        args.parser.error("--dialect memo01 fuzzes a broker's nng+tcp:// or nng+ipc:// endpoint")
    if nng and args.dialect is None and args.replay is None:
        args.parser.error("an nng+ ENDPOINT is a memo01 broker's: give --dialect memo01")
    if args.replay is not None and not args.replay.is_file():
        args.parser.error(f"--replay: no such file: {args.replay}")
    if args.dialect != "emqp" and (args.workers is not None or not args.malformed):
        args.parser.error("--workers and --no-malformed go with --dialect emqp")
    if args.dialect == "emqp":
        if args.target not in (None, "broker") or args.command:
            args.parser.error("--dialect emqp: only a broker, without --exec")
        try:
            check_endpoint(args.endpoint, bind=False, schemes=CONNECT_SCHEMES)
        except EndpointError as error:
            args.parser.error(f"argument ENDPOINT: {error}")
        return
    if args.dialect == "memo01":
        if args.target not in (None, "broker") or args.command:
            args.parser.error("--dialect memo01: only a broker, without --exec")
        if not _common._nng_installed():
            args.parser.error(f"--dialect memo01: {NNG_EXTRA_HINT}")
        return
    if args.dialect == "dcp" and (args.target not in (None, "broker") or args.command):
        args.parser.error("--dialect dcp: only a broker, without --exec")
    if args.target in (None, "broker") and args.replay is None:
        try:  # the broker target connects: no port 0 or '*' there
            check_endpoint(args.endpoint, bind=False, schemes=CONNECT_SCHEMES)
        except EndpointError as error:
            args.parser.error(f"argument ENDPOINT: {error}")
    if args.dialect not in (None, "mdp02") and args.target not in (None, "broker"):
        args.parser.error("--dialect: only a broker is fuzzed in another dialect than mdp02")
    if args.command is not None:
        if args.target == "broker" or (args.target is None and args.replay is None):
            args.parser.error("--exec starts a worker or client: give --target worker or client")
        try:
            shlex.split(args.command)
        except ValueError as error:
            args.parser.error(f"--exec: {error}")


async def _fuzz(args: argparse.Namespace) -> int:
    dialect = args.dialect
    if args.replay is not None:
        try:
            from domo import fuzz
        except ImportError as error:
            return _needs_hypothesis(error)
        try:
            saved = fuzz.load_replay(args.replay)
        except ValueError as error:
            print(f"domo fuzz: {error}", file=sys.stderr)
            return EXIT_USAGE
        if saved.dialect in SEARCHES_OF_THEIR_OWN:
            if dialect not in (None, saved.dialect):
                print(
                    f"domo fuzz: {args.replay} is a {saved.dialect} scenario, not {dialect}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            dialect = saved.dialect
    if dialect == "memo01":
        return await _fuzz_memo01(args)
    if dialect == "dcp":
        return await _fuzz_dcp(args)
    if dialect == "emqp":
        return await _fuzz_emqp(args)
    try:
        from domo import fuzz
    except ImportError as error:
        return _needs_hypothesis(error)
    if args.heartbeat_interval > 0.5 and args.replay is None:  # a replay uses its file's
        print(
            f"domo fuzz: heartbeat interval {args.heartbeat_interval} s makes every scenario slow; "
            "give the peer e.g. --heartbeat-interval 0.1 and pass the same here",
            file=sys.stderr,
        )
    options = fuzz.FuzzOptions(
        args.endpoint,
        target=args.target or "broker",
        command=args.command,
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        examples=args.examples,
        max_steps=args.max_steps,
        time_budget=args.time_budget,
        seed=args.seed,
        findings_dir=args.findings_dir,
        first=args.first,
        dispatch=args.dispatch,
        mmi=args.mmi,
        dialect=args.dialect or "mdp02",
        lanes=args.lanes or LANES[args.dialect or "mdp02"],
    )
    try:
        if args.replay is not None:
            try:
                replay = fuzz.load_replay(args.replay)
            except ValueError as error:
                print(f"domo fuzz: {error}", file=sys.stderr)
                return EXIT_USAGE
            if args.target is not None and args.target != replay.target:
                print(
                    f"domo fuzz: {args.replay} is a {replay.target} scenario, not {args.target}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            if args.dialect is not None and args.dialect != replay.dialect:
                print(
                    f"domo fuzz: {args.replay} is a {replay.dialect} scenario, not {args.dialect}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            if args.command is not None and replay.target == "broker":
                print(
                    f"domo fuzz: {args.replay} is a broker scenario; --exec starts a worker or "
                    "client",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            print(f"replaying {args.replay} ({replay.rule or 'no rule recorded'}):")
            violations = await trio.to_thread.run_sync(
                partial(fuzz.replay_file, options, replay, print)
            )
            for violation in violations:
                print(f"{violation.rule}: {violation.explanation}")
            print(f"{len(violations)} violation(s)")
            return EXIT_FINDINGS if violations else EXIT_OK
        result = await trio.to_thread.run_sync(fuzz.fuzz, options)
    except fuzz.Unreachable as error:
        print(f"domo fuzz: target unreachable: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ValueError as error:  # an endpoint that cannot be bound, a command that cannot start
        print(f"domo fuzz: {error}", file=sys.stderr)
        return EXIT_ENDPOINT
    for finding in result.findings:
        if finding.violation.explanation == result.never_served:
            continue  # said once, below (the intervals differ)
        print(fuzz.format_finding(finding, options.target, options.endpoint, options.command))
    if result.never_served:
        print(f"domo fuzz: no scenario could run: {result.never_served}")
    else:
        print(fuzz.format_coverage(result))
    if result.jitter:  # what the timing windows allowed for (docs/fuzz.md)
        seen = ", ".join(f"{kind} {s * 1000:.0f} ms" for kind, s in sorted(result.jitter.items()))
        print(f"domo fuzz: largest jitter samples: {seen}")
    print(
        f"domo fuzz: {options.target}"
        + ("" if options.dialect == "mdp02" else f" ({options.dialect})")
        + f": {result.examples} scenarios in {result.seconds:.1f} s "
        f"({result.scenarios_per_second:.1f}/s), seed {result.seed}; "
        f"{len(result.findings)} rule(s) broken: "
        + (
            ", ".join(f"{f.violation.rule} after {f.seconds or 0:.1f} s" for f in result.findings)
            or "none"
        )
    )
    return EXIT_FINDINGS if result.findings else EXIT_OK


def _fuzz_endpoint(text: str) -> str:
    """``domo fuzz``'s ENDPOINT: ZeroMQ's, or a broker's ``nng+`` one for ``--dialect memo01``."""
    if text.startswith(NNG_SCHEME):
        try:
            check_endpoint(text[len(NNG_SCHEME) :], bind=False, schemes=("tcp", "ipc"))
        except EndpointError as error:
            raise argparse.ArgumentTypeError(f"{text}: {error}") from None
        return text
    return _endpoint_to_bind_or_connect(CONNECT_SCHEMES, text)


async def _fuzz_memo01(args: argparse.Namespace) -> int:
    """``domo fuzz --dialect memo01``: ``domo.fuzz.memo01``'s scenarios over NNG."""
    from domo import fuzz
    from domo.fuzz.memo01 import fuzz_memo01, replay_memo01

    url = args.endpoint[len(NNG_SCHEME) :]
    if args.replay is not None:
        saved = fuzz.load_replay(args.replay)
        print(f"replaying {args.replay} ({saved.rule or 'no rule recorded'}):")
        replayed = partial(replay_memo01, url, saved.steps)
        return _replayed(await trio.to_thread.run_sync(replayed))
    seed = _seed(args)
    print(f"domo fuzz: seed {seed} (--seed {seed} repeats this search)", file=sys.stderr)
    run = partial(
        fuzz_memo01,
        url,
        scenarios=args.examples,
        seed=seed,
        time_budget=args.time_budget,
        lanes=args.lanes or LANES["memo01"],
        first=args.first,
        progress=lambda line: print(f"domo fuzz: found {line}", file=sys.stderr),
    )
    result = await trio.to_thread.run_sync(run)
    for finding in result.findings:
        kinds = ", ".join(s.kind for s in finding.steps if s.kind != "setup")
        print(
            f"{finding.rule}: {finding.explanation} (--seed {seed}; broken in "
            f"{finding.scenarios} of {result.scenarios} scenarios; the smallest: "
            f"{len(finding.steps) - 1} step(s): {kinds})"
        )
        _save_plan(args, "memo01", finding.rule, finding.explanation, finding.steps)
    print(fuzz.format_rule_coverage(result.judged, result.held, result.rules))
    broken = ", ".join(f.rule for f in result.findings) or "none"
    print(
        f"domo fuzz: broker (memo01): {result.scenarios} scenarios in {result.seconds:.1f} s "
        f"({result.scenarios / max(result.seconds, 1e-9):.1f}/s), seed {seed}; "
        f"{len(result.findings)} rule(s) broken: {broken}"
    )
    return EXIT_FINDINGS if result.findings else EXIT_OK


async def _fuzz_dcp(args: argparse.Namespace) -> int:
    """``domo fuzz --dialect dcp``: ``domo.fuzz.dcp``'s scenarios over ZeroMQ."""
    try:  # the module needs only pyzmq, but its package (domo.fuzz) imports Hypothesis
        from domo import fuzz
        from domo.fuzz.dcp import DcpUnreachable, fuzz_dcp, replay_dcp
    except ImportError as error:
        return _needs_hypothesis(error)

    if args.replay is not None:
        saved = fuzz.load_replay(args.replay)
        print(f"replaying {args.replay} ({saved.rule or 'no rule recorded'}):")
        replayed = partial(
            replay_dcp,
            args.endpoint,
            saved.steps,
            heartbeat_interval=saved.heartbeat_interval,
            liveness=saved.liveness,
        )
        return _replayed(await trio.to_thread.run_sync(replayed))
    seed = _seed(args)
    print(f"domo fuzz: seed {seed} (--seed {seed} repeats this search)", file=sys.stderr)
    run = partial(
        fuzz_dcp,
        args.endpoint,
        scenarios=args.examples,
        seed=seed,
        time_budget=args.time_budget,
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        stop_at_first=args.first,
        lanes=args.lanes or LANES["dcp"],
        progress=lambda line: print(f"domo fuzz: found {line}", file=sys.stderr),
    )
    try:
        result = await trio.to_thread.run_sync(run)
    except DcpUnreachable as error:
        print(f"domo fuzz: target unreachable: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    for finding in result.findings:
        kinds = ", ".join(s.kind for s in finding.steps if s.kind != "setup")
        print(
            f"{finding.rule}: {finding.explanation} (--seed {seed}; broken in "
            f"{finding.scenarios} of {result.scenarios} scenarios; the smallest: "
            f"{len(finding.steps) - 1} step(s): {kinds})"
        )
        _save_plan(args, "dcp", finding.rule, finding.explanation, finding.steps)
    if result.stopped:
        print(f"domo fuzz: the run stopped: {result.stopped}")
    steps = ", ".join(f"{kind} {n}" for kind, n in sorted(result.steps.items()))
    checked = ", ".join(f"{n} {kind}" for kind, n in sorted(result.checked.items()))
    print(f"domo fuzz: steps played: {steps or 'none'}")
    print(
        f"domo fuzz: checked {checked or 'nothing'}; {result.unjudged} scenario(s) not judged "
        "(the machine stalled a worker or the broker for half the liveness span)"
    )
    print(fuzz.format_rule_coverage(result.judged, result.held, result.rules))
    broken = ", ".join(f.rule for f in result.findings) or "none"
    print(
        f"domo fuzz: broker (dcp): {result.scenarios} scenarios in {result.seconds:.1f} s "
        f"({result.scenarios / max(result.seconds, 1e-9):.1f}/s), seed {seed}; "
        f"{len(result.findings)} rule(s) broken: {broken}"
    )
    return EXIT_FINDINGS if result.findings else EXIT_OK


async def _fuzz_emqp(args: argparse.Namespace) -> int:
    """``domo fuzz --dialect emqp``: ``domo.fuzz.emqp``'s scenarios over ZeroMQ."""
    try:  # the module needs only pyzmq, but its package (domo.fuzz) imports Hypothesis
        from domo import fuzz
        from domo.fuzz.emqp import describe, fuzz_emqp, replay_emqp
    except ImportError as error:
        return _needs_hypothesis(error)

    if args.replay is not None:
        saved = fuzz.load_replay(args.replay)
        print(f"replaying {args.replay} ({saved.rule or 'no rule recorded'}):")
        replayed = partial(
            replay_emqp,
            args.endpoint,
            saved.steps,
            workers_endpoint=args.workers,
            heartbeat_interval=saved.heartbeat_interval,
            liveness=saved.liveness,
            credits=args.credits,
        )
        return _replayed(await trio.to_thread.run_sync(replayed))
    seed = _seed(args)
    print(f"domo fuzz: seed {seed} (--seed {seed} repeats this search)", file=sys.stderr)
    run = partial(
        fuzz_emqp,
        args.endpoint,
        workers_endpoint=args.workers,
        scenarios=args.examples,
        seed=seed,
        time_budget=args.time_budget,
        heartbeat_interval=args.heartbeat_interval,
        liveness=args.liveness,
        malformed=args.malformed,
        credits=args.credits,
        first=args.first,
        lanes=args.lanes or LANES["emqp"],
        progress=lambda line: print(f"domo fuzz: found {line}", file=sys.stderr),
    )
    result = await trio.to_thread.run_sync(run)
    for line in describe(result):
        print(line)
    for finding in result.findings:
        _save_plan(args, "emqp", finding.rule, finding.explanation, finding.steps)
    steps = ", ".join(f"{kind} {count}" for kind, count in result.steps.items())
    print(f"domo fuzz: steps played: {steps or 'none'}")
    print(fuzz.format_rule_coverage(result.judged, result.held, result.rules))
    broken = ", ".join(f"{f.rule} ({f.scenarios})" for f in result.findings) or "none"
    print(
        f"domo fuzz: broker (emqp): {result.scenarios} scenarios in {result.seconds:.1f} s "
        f"({result.scenarios / max(result.seconds, 1e-9):.1f}/s), seed {seed}; "
        f"{len(result.findings)} rule(s) broken: {broken}"
    )
    return EXIT_FINDINGS if result.findings else EXIT_OK


def _save_plan(
    args: argparse.Namespace, dialect: str, rule: str, explanation: str, steps: Sequence[Any]
) -> None:
    """Save a finding's plan as a replay file in --findings-dir, and say how to replay it."""
    from domo import fuzz

    path = args.findings_dir / f"broker-{dialect}-{rule}.json"
    replay = fuzz.Replay(
        "broker", args.heartbeat_interval, args.liveness, list(steps), rule, explanation, dialect
    )
    fuzz.save_replay(path, replay)
    print(f"  replay: {shlex.join(['domo', 'fuzz', '--replay', str(path), args.endpoint])}")


def _replayed(violations: Sequence[Any]) -> int:
    """Print what a replayed plan broke; the exit code."""
    for violation in violations:
        print(f"{violation.rule}: {violation.explanation}")
    print(f"{len(violations)} violation(s)")
    return EXIT_FINDINGS if violations else EXIT_OK


def _needs_hypothesis(error: ImportError) -> int:
    """Say that ``domo.fuzz`` (whose package imports Hypothesis) needs the fuzz extra."""
    print(
        f"domo fuzz: needs hypothesis (pip install '.[fuzz]' in domo's source directory): {error}",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _seed(args: argparse.Namespace) -> int:
    """``--seed``, or a fresh one drawn from the OS."""
    return args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
