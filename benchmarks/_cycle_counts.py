"""One broker request cycle's cost in instructions, as ``docs/performance.md`` counts it.

``python benchmarks/_cycle_counts.py KIND N`` sets up 1,500 request cycles and runs the first
``N`` of them; run it under callgrind for N = 300 and N = 1,500 with ``PYTHONHASHSEED=0``, and
the difference of the two totals over 1,200 is one cycle (the setups cancel)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind python benchmarks/_cycle_counts.py mdp01 300

KIND: ``mdp02``, ``mdp01`` or ``dcp`` (``benchmarks/core.py``'s ``broker_cycle`` through
``FamilyBroker``, with clients of that dialect and MDP/0.2 workers), or ``memo01``: a memo01
client's JOB to a memo01 worker and its RESULT back through ``Memo01Broker``, on one NNG
connection (16-byte payloads, a fresh context token for each message).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PLANNED = 1500
NNG = 1


def _family(kind: str, cycles: int) -> None:
    from core import broker_cycle

    case = (
        broker_cycle(PLANNED, family=True)
        if kind == "mdp02"
        else broker_cycle(PLANNED, family=True, dialect=kind)
    )
    body = case.setup()
    cells = dict(zip(body.__code__.co_freevars, body.__closure__ or (), strict=True))
    del cells["plan"].cell_contents[cycles:]  # the same setup, fewer cycles run
    body()


def _token(n: int, pipe: int) -> bytes:
    return pipe.to_bytes(8, "big") + n.to_bytes(8, "big")


def _memo01(cycles: int) -> None:
    from domo.protocol import BrokerConfig
    from domo.protocol.dialects.memo01 import MessageType, encode
    from domo.protocol.memo01 import Memo01Broker, Memo01Config

    broker = Memo01Broker(BrokerConfig(), memo_connections={NNG}, memo=Memo01Config(epoch=b"EPOC"))
    broker.receive(_token(1, 2), [encode(MessageType.READY, services=("echo",))], 0.0, NNG)
    broker.take_outgoing()
    broker.flushed()
    (ident,) = broker.memo_workers()
    body = b"0123456789abcdef"
    plan = [
        (
            _token(10 + index, 1),
            _token(10 + index, 2),
            encode(MessageType.JOB, b"", body, service="echo", timeout_ms=5000),
            encode(MessageType.RESULT, ident, body),
        )
        for index in range(PLANNED)
    ][:cycles]
    now = 1.0
    receive, take, flushed = broker.receive, broker.take_outgoing, broker.flushed
    for client, worker, job, result in plan:
        now += 1e-6
        receive(client, [job], now, NNG)
        [(_, to, _)] = take()
        flushed()
        receive(worker, [result], now, NNG)
        [(_, to, _)] = take()
        if to != client:
            raise AssertionError(f"the RESULT went to {to!r}")
        flushed()
    if broker.core.requests():
        raise AssertionError("requests left outstanding")


def main() -> None:
    kind, cycles = sys.argv[1], int(sys.argv[2])
    if kind == "memo01":
        _memo01(cycles)
    else:
        _family(kind, cycles)


if __name__ == "__main__":
    main()
