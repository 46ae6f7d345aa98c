"""CPU cost of the sans-IO core, without sockets: what the broker and sessions cost per input.

Cases (times are CPU microseconds per operation; see ``_harness.py`` for how they are taken):

- broker request cycle: client REQUEST in, worker REQUEST out, worker FINAL in, client FINAL
  out, through ``Broker.receive``, ``take_outgoing`` and ``flushed`` (which completes it), with
  100 workers on 10 services and 16-byte bodies. Our budget on the team's machine is 15 us per
  cycle.
- family broker request cycle: the same through ``FamilyBroker`` (what ``serve_broker`` runs),
  with MDP/0.2 clients, then with MDP/0.1 REQ clients (the dialect layer's cost).
- broker tick, nothing due: ``tick(now)`` with 10,000 idle workers registered (must not scan).
- broker heartbeat round: one ``tick`` at which all 10,000 workers are due a HEARTBEAT, then
  ``take_outgoing``; per worker.
- worker session: REQUEST in and FINAL out (``receive``, ``send_final``, ``take_outgoing``),
  per message; HEARTBEAT in, per message.
- client session: ``request``, ``take_outgoing``, FINAL in (``receive``), per message.

Each timed body checks the messages it gets back (cheaply) so that a broken core fails here
instead of printing a fast, meaningless number.

Usage: ``python benchmarks/core.py [--quick] [--reps N] [--json FILE] [--profile]
[--family-profile] [--baseline REV [--rounds N]]``.
``--profile`` runs the broker cycle under cProfile and prints where the time goes
(``--family-profile``: the family broker's MDP/0.2 cycle).

``--baseline REV`` compares this checkout with domo as of git revision ``REV`` in one run: this
script runs in two child processes, one on this checkout and one on ``REV``'s package (the
virtualenv ``benchmarks/brokers.py --baseline`` makes), alternating over ``--rounds`` rounds
(default 5, ``--reps`` repetitions each) so that the machine's drift hits both alike; it prints
both medians and their ratio per case. A revision that predates ``FamilyBroker`` runs the bare
``Broker`` only: the family cycles are then compared with its bare cycle, which is what its
``serve_broker`` ran. A revision before ``flushed`` (MDP-D-24) completes a request on its FINAL,
so its cycle has no ``flushed`` call.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from _harness import Case, measure, parser, report

from domo.protocol import Broker, BrokerConfig, ClientSession, WorkerSession, mdp

try:  # absent from a --baseline revision older than the dialects
    from domo.protocol.dialects import Dialect
    from domo.protocol.family import FamilyBroker, peer_key
except ImportError:
    FAMILY = False
else:
    FAMILY = True

BARE_CYCLE = "broker: request cycle, 100 workers, 10 services"

BODY = (b"0123456789abcdef",)  # one 16-byte frame
WORKERS, SERVICES, CLIENTS = 100, 10, 1000
IDLE_WORKERS = 10_000
STEP = 1e-6  # seconds between inputs: far less than any heartbeat or expiry


def _service(index: int) -> bytes:
    return b"service-%02d" % (index % SERVICES)


def _broker_with_workers(count: int) -> Broker:
    """A broker at time 0 with ``count`` idle workers spread over the services."""
    broker = Broker(BrokerConfig())
    for index in range(count):
        broker.receive(b"worker-%05d" % index, mdp.worker_ready_frames(_service(index)), 0.0)
    if broker.take_outgoing() or len(broker.workers()) != count:
        raise AssertionError("workers did not register")
    return broker


# --- broker -----------------------------------------------------------------------------------


def broker_cycle(cycles: int, family: bool = False, dialect: bool = False) -> Case:
    """Full request cycles through the broker.

    ``family``: through ``FamilyBroker``, as ``serve_broker`` runs it, with MDP/0.2 peers (what
    the dialect layer costs everyone); ``dialect``: with MDP/0.1 REQ clients instead (what a
    dialect peer costs: detect, decode, a peer key, encode).
    """

    def setup() -> Callable[[], None]:
        core = _broker_with_workers(WORKERS)
        broker: Broker | FamilyBroker = core
        if family:
            layered = FamilyBroker(core.config)
            layered.core = core  # the same registered workers, behind the family layer
            broker = layered
        plan = []
        for index in range(cycles):
            client = b"client-%04d" % (index % CLIENTS)
            if dialect:
                request = [b"", b"MDPC01", _service(index), *BODY]
                key = peer_key(client, (), Dialect.MDP01)
            else:
                request = list(mdp.client_request_frames(_service(index), BODY))
                key = client
            final = list(mdp.worker_final_frames(key, BODY))
            plan.append((client, key, request, final))
        receive = broker.receive
        reply_code = b"MDPC01" if dialect else mdp.C_FINAL

        def body() -> None:
            now = 1.0
            take, flushed = core.take_outgoing, core.flushed
            for client, key, request, final in plan:
                now += STEP
                receive(client, request, now)
                [(worker, _)] = take()
                receive(worker, final, now)
                [(to, reply)] = take()
                if to != client or reply[1] != reply_code:
                    raise AssertionError(f"unexpected reply {reply!r} to {to!r}")
                if len(flushed()) != 1:  # the FINAL was sent: the request is completed
                    raise AssertionError(f"request to {key!r} not completed")
            if core.requests():
                raise AssertionError("requests left outstanding")

        def body_before_flushed() -> None:
            # A --baseline revision before MDP-D-24: the FINAL completes the request.
            now = 1.0
            take = core.take_outgoing
            for client, _, request, final in plan:
                now += STEP
                receive(client, request, now)
                [(worker, _)] = take()
                receive(worker, final, now)
                [(to, reply)] = take()
                if to != client or reply[1] != reply_code:
                    raise AssertionError(f"unexpected reply {reply!r} to {to!r}")
            if core.requests():
                raise AssertionError("requests left outstanding")

        def family_body() -> None:
            # FamilyBroker's outbox: (connection, routing id, frames), each on connection 0.
            now = 1.0
            take, flushed = layered.take_outgoing, layered.flushed
            for client, key, request, final in plan:
                now += STEP
                receive(client, request, now)
                [(_, worker, sent)] = take()
                final[2] = bytes(sent[2])  # the client's address as the broker gave it
                receive(worker, final, now)
                [(connection, to, reply)] = take()
                if connection != 0 or to != client or reply[1] != reply_code:
                    raise AssertionError(f"unexpected reply {reply!r} to {to!r}")
                if len(flushed()) != 1:  # the FINAL was sent: the request is completed
                    raise AssertionError(f"request to {key!r} not completed")
            if core.requests():
                raise AssertionError("requests left outstanding")

        if family:
            return family_body
        return body if hasattr(core, "flushed") else body_before_flushed

    name = BARE_CYCLE
    if family:
        name = "family broker: request cycle, " + ("MDP/0.1 REQ clients" if dialect else "MDP/0.2")
    return Case(name, "cycle", cycles, setup)


def broker_tick_idle(calls: int) -> Case:
    """``tick`` when nothing is due, with many idle workers registered."""

    def setup() -> Callable[[], None]:
        broker = _broker_with_workers(IDLE_WORKERS)
        tick = broker.tick
        interval = broker.config.heartbeat_interval
        times = [interval * 0.9 * (i + 1) / calls for i in range(calls)]

        def body() -> None:
            for now in times:
                if tick(now):
                    raise AssertionError(f"events at {now} with nothing due")
            if broker.take_outgoing():
                raise AssertionError("messages sent with nothing due")

        return body

    return Case("broker: tick, 10,000 idle workers, nothing due", "tick", calls, setup)


def broker_heartbeat_round() -> Case:
    """One ``tick`` at which every one of many idle workers is due a HEARTBEAT."""

    def setup() -> Callable[[], None]:
        broker = _broker_with_workers(IDLE_WORKERS)
        due = broker.config.heartbeat_interval

        def body() -> None:
            broker.tick(due)
            sent = broker.take_outgoing()
            if len(sent) != IDLE_WORKERS or any(f != mdp.HEARTBEAT_FRAMES for _, f in sent):
                raise AssertionError(f"{len(sent)} messages, expected one HEARTBEAT per worker")

        return body

    return Case("broker: heartbeat round, 10,000 workers due", "worker", IDLE_WORKERS, setup)


# --- sessions ---------------------------------------------------------------------------------


def _connected_worker() -> WorkerSession:
    worker = WorkerSession(b"service-00")
    worker.connected(0.0)
    if worker.take_outgoing() != [mdp.worker_ready_frames(b"service-00")]:
        raise AssertionError("the worker did not send READY")
    return worker


def worker_request_final(cycles: int) -> Case:
    """A worker session takes a REQUEST and sends its FINAL."""

    def setup() -> Callable[[], None]:
        worker = _connected_worker()
        request = mdp.worker_request_frames(b"client-0001", BODY)
        receive, send_final, take = worker.receive, worker.send_final, worker.take_outgoing

        def body() -> None:
            now = 1.0
            for _ in range(cycles):
                now += STEP
                [received] = receive(request, now)
                send_final(BODY, now)
                [final] = take()
                if final[1] != mdp.W_FINAL:
                    raise AssertionError(f"unexpected {final!r} after {received!r}")

        return body

    return Case("worker session: REQUEST in, FINAL out", "message", 2 * cycles, setup)


def worker_heartbeat_in(messages: int) -> Case:
    """A worker session hears a HEARTBEAT from the broker."""

    def setup() -> Callable[[], None]:
        worker = _connected_worker()
        receive = worker.receive
        heartbeat = mdp.HEARTBEAT_FRAMES

        def body() -> None:
            now = 1.0
            for _ in range(messages):
                now += STEP
                if receive(heartbeat, now):
                    raise AssertionError("events for a HEARTBEAT")
            if worker.take_outgoing():
                raise AssertionError("the worker answered a HEARTBEAT")

        return body

    return Case("worker session: HEARTBEAT in", "message", messages, setup)


def client_request_final(cycles: int) -> Case:
    """A client session sends a REQUEST and takes its FINAL."""

    def setup() -> Callable[[], None]:
        client = ClientSession()
        client.connected(0.0)
        final = mdp.client_final_frames(b"service-00", BODY)
        request, receive, take = client.request, client.receive, client.take_outgoing

        def body() -> None:
            now = 1.0
            for _ in range(cycles):
                now += STEP
                request(b"service-00", BODY, now)
                [sent] = take()
                [received] = receive(final, now)
                if sent[1] != mdp.C_REQUEST:
                    raise AssertionError(f"unexpected {sent!r} before {received!r}")

        return body

    return Case("client session: REQUEST out, FINAL in", "message", 2 * cycles, setup)


# --- the command ------------------------------------------------------------------------------


def cases(quick: bool) -> list[Case]:
    """Every case, sized for a full run or a quick one."""
    scale = 2_000 if quick else 50_000
    family = [broker_cycle(scale, family=True), broker_cycle(scale, family=True, dialect=True)]
    return [
        broker_cycle(scale),
        *(family if FAMILY else []),
        broker_tick_idle(scale),
        broker_heartbeat_round(),
        worker_request_final(scale),
        worker_heartbeat_in(scale),
        client_request_final(scale),
    ]


def profile(cycles: int, family: bool = False) -> None:
    """Print the functions where the broker cycle spends its time."""
    body = broker_cycle(cycles, family=family).setup()
    profiler = cProfile.Profile()
    profiler.runcall(body)
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(20)


def compare_with(rev: str, quick: bool, reps: int, rounds: int) -> None:
    """Run this script on this checkout and on ``rev``'s domo, alternating; print the ratios."""
    from brokers import baseline_python  # the virtualenv of domo as of ``rev``

    before, sha = baseline_python(rev)
    pythons = {"now": sys.executable, sha: before}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in pythons}
    script = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            order = list(pythons) if round_ % 2 == 0 else list(reversed(pythons))
            for name in order:
                record_path = Path(tmp) / f"{name}-{round_}.json"
                command = [pythons[name], str(script), "--reps", str(reps), "--json"]
                command += [str(record_path), *(["--quick"] if quick else [])]
                # The revision's own package, whatever PYTHONPATH points this checkout at.
                env = None if name == "now" else {**os.environ, "PYTHONPATH": ""}
                subprocess.run(command, check=True, capture_output=True, cwd=script.parent, env=env)
                record = json.loads(record_path.read_text(encoding="utf-8"))
                for result in record["results"]:
                    median = result["cpu"]["median_us"]
                    samples[name].setdefault(result["name"], []).append(median)
            print(f"round {round_ + 1}/{rounds} done", file=sys.stderr, flush=True)
    now, then = samples["now"], samples[sha]
    width = max(map(len, now))
    print(f"{'benchmark':<{width}}  {'now us':>8}  {sha + ' us':>14}  ratio  (medians of rounds)")
    for name, values in now.items():
        anchor = then.get(name) or (then.get(BARE_CYCLE) if "request cycle" in name else None)
        if anchor is None:
            continue
        mine, theirs = statistics.median(values), statistics.median(anchor)
        print(f"{name:<{width}}  {mine:8.3f}  {theirs:14.3f}  {mine / theirs:5.2f}")


def main() -> None:
    """Run every case and print the table."""
    args_parser = parser(__doc__.split("\n")[0] if __doc__ else "core benchmarks")
    args_parser.add_argument("--profile", action="store_true", help="profile the broker cycle")
    args_parser.add_argument(
        "--family-profile", action="store_true", help="profile the family broker's MDP/0.2 cycle"
    )
    args_parser.add_argument("--baseline", metavar="REV", help="also run domo as of REV")
    args_parser.add_argument("--rounds", type=int, default=5, help="--baseline: rounds")
    args = args_parser.parse_args()
    if args.profile or args.family_profile:
        profile(2_000 if args.quick else 50_000, family=args.family_profile)
        return
    reps = args.reps if args.reps is not None else (3 if args.quick else 15)
    if args.baseline:
        compare_with(args.baseline, args.quick, args.reps or 3, args.rounds)
        return
    results = [measure(case, reps) for case in cases(args.quick)]
    report("benchmarks/core.py", results, args)


if __name__ == "__main__":
    main()
