"""``domo broker --primary`` / ``--backup``: the options of a Binary Star pair and what the
broker command does with them (specs/binary-star.md). Kept here so that ``broker.py`` only
calls ``add_pair_options``, ``make_pair`` and ``pair_metrics``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from domo.binarystar.fsm import PairConfig, Role, State, Transition
from domo.binarystar.pair import Pair

from ._common import BIND_SCHEMES, CONNECT_SCHEMES, _endpoint, _positive_float

__all__ = ["add_pair_options", "make_pair", "pair_metrics"]


def add_pair_options(sub: argparse.ArgumentParser) -> None:
    group = sub.add_argument_group(
        "Binary Star pair (a primary and a backup broker; only the active one serves)"
    )
    roles = group.add_mutually_exclusive_group()
    roles.add_argument(
        "--primary",
        action="store_const",
        const=Role.PRIMARY,
        dest="pair_role",
        help="run as the primary of a pair: active when its backup is heard, or alone after "
        "2 x --pair-heartbeat of silence once a client comes (needs --pair-bind, --pair-peer)",
    )
    roles.add_argument(
        "--backup",
        action="store_const",
        const=Role.BACKUP,
        dest="pair_role",
        help="run as the backup of a pair: passive while the primary is active; active only "
        "when the primary has been silent 2 x --pair-heartbeat and a client comes to it",
    )
    group.add_argument(
        "--pair-bind",
        metavar="ENDPOINT",
        type=partial(_endpoint, BIND_SCHEMES),
        help="where this broker publishes its pair state (a PUB socket), e.g. tcp://*:5556",
    )
    group.add_argument(
        "--pair-peer",
        metavar="ENDPOINT",
        type=partial(_endpoint, CONNECT_SCHEMES),
        help="the other broker's --pair-bind endpoint",
    )
    group.add_argument(
        "--pair-heartbeat",
        metavar="SECONDS",
        type=_positive_float,
        default=1.0,
        help="seconds between two state messages; the peer is silent after twice this "
        "(both brokers must agree; default: %(default)s)",
    )


def check_pair_options(args: argparse.Namespace) -> None:
    """Usage errors (exit 2) for pair options given without their partners."""
    role = getattr(args, "pair_role", None)
    if role is None:
        if args.pair_bind is not None or args.pair_peer is not None:
            args.parser.error("--pair-bind and --pair-peer need --primary or --backup")
        return
    if args.pair_bind is None or args.pair_peer is None:
        args.parser.error(f"--{role.value} needs --pair-bind and --pair-peer")


def make_pair(args: argparse.Namespace) -> Pair | None:
    """The pair of ``domo broker``'s options, or None without ``--primary``/``--backup``.

    Every change is printed on stdout with the wall time: ``domo broker: pair ROLE: OLD ->
    NEW (serving|not serving) at UNIX_TIME; RULE: REASON`` (the chaos run reads these lines).
    """
    role = getattr(args, "pair_role", None)
    if role is None:
        return None

    def report(transition: Transition) -> None:
        serving = "serving" if transition.serving else "not serving"
        print(
            f"domo broker: pair {role.value}: {transition.old.value} -> {transition.new.value} "
            f"({serving}) at {time.time():.6f}; {transition.rule}: {transition.reason}",
            flush=True,
        )

    config = PairConfig(role, heartbeat=args.pair_heartbeat)
    return Pair(config, args.pair_bind, args.pair_peer, on_transition=report)


def pair_metrics(registry: Any, pair: Pair) -> None:
    """``domo_pair_state{role,state}`` (1 for the current state) and ``domo_pair_serving`` in
    ``registry`` (a prometheus_client registry), read at each scrape; ``domo status`` shows
    them."""
    from prometheus_client import Gauge

    state = Gauge(
        "domo_pair_state", "This broker's Binary Star state (1: current)", ["role", "state"],
        registry=registry,
    )  # fmt: skip

    def is_current(candidate: State) -> Callable[[], float]:
        return lambda: float(pair.machine.state is candidate)

    for candidate in State:
        state.labels(pair.config.role.value, candidate.value).set_function(is_current(candidate))
    serving = Gauge(
        "domo_pair_serving", "1 while this broker of a pair serves clients and workers",
        registry=registry,
    )  # fmt: skip
    serving.set_function(lambda: float(pair.machine.serving))
