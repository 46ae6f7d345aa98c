"""The durable chaos runs' short forms (CI), and proof that their checks can fail.

The long forms are in ``nox -s chaos`` (tests/chaos/titanic_chaos.py with 10,000 requests,
tests/chaos/binary_star.py); their figures are in docs/reliability.md.
"""

from __future__ import annotations

from tests.chaos.binary_star import (
    PairChaosConfig,
    PairChaosResult,
    _overlap,
    _records,
    _serving_intervals,
    run_pair_chaos,
)
from tests.chaos.titanic_chaos import TitanicChaosConfig, TitanicChaosResult, run_titanic_chaos


def test_durable_requests_survive_kills_of_broker_titanic_and_workers() -> None:
    """TSP-D-04, TSP-D-01, TSP-S-09, TSP-S-11: nothing lost, nothing wrong, fetched once."""
    config = TitanicChaosConfig(
        requests=240, clients=4, workers=2, kill_every=0.3, batch=30, max_kills=8
    )
    result = run_titanic_chaos(config)
    assert result.problems == []
    assert result.ok, result
    assert result.fetched == 240
    assert result.closed_then_unknown == 240
    assert result.executions >= 240  # at least once; repeats are counted, not forbidden
    for victim in ("broker", "titanic", "worker0", "worker1"):
        assert result.kills.get(victim, 0) >= 1, f"the run ended before {victim} was killed"


def test_a_binary_star_pair_takes_over_and_never_serves_twice() -> None:
    """BSTAR-10, BSTAR-11, BSTAR-12, BSTAR-17: the backup serves within 2 pair heartbeats and
    one client timeout of the primary's SIGKILL with 0 durable requests lost; a SIGSTOPped
    primary, resumed, never serves beside the backup."""
    config = PairChaosConfig(requests=100, clients=2, stop_seconds=2.5)  # margin for load
    result = run_pair_chaos(config)
    assert result.problems == []
    assert result.lost == 0
    assert result.fetched == result.submitted == 100
    # The bound, with room for a loaded machine: the client's first try went to the dead
    # primary and timed out; its second went to the backup, silent peer: active at once.
    assert 0 < result.takeover_seconds <= result.takeover_bound + 1.0, result
    assert result.backup_took_over_in_stop
    assert result.primary_unsure_after_resume, result.stop_records
    assert result.overlap_seconds == 0.0, result.stop_records


def test_the_checks_can_fail() -> None:
    assert not TitanicChaosResult(requests=2, submitted=2, fetched=1, closed_then_unknown=2).ok
    assert not TitanicChaosResult(
        requests=1, submitted=1, fetched=1, closed_then_unknown=1, wrong=1
    ).ok
    assert TitanicChaosResult(requests=1, submitted=1, fetched=1, closed_then_unknown=1).ok
    text = (
        "domo broker: pair primary: primary -> active (serving) at 10.0; BSTAR-05: x\n"
        "domo broker: pair primary: active -> passive (not serving) at 20.0; BSTAR-11: y\n"
    )
    records = _records(text)
    assert [(at, serving) for at, serving, _ in records] == [(10.0, True), (20.0, False)]
    assert _serving_intervals(records, 30.0) == [(10.0, 20.0)]
    assert _serving_intervals(records, 30.0, (12.0, 15.0)) == [(10.0, 12.0), (15.0, 20.0)]
    assert _overlap([(10.0, 20.0)], [(19.0, 25.0)]) == 1.0
    assert _overlap([(10.0, 12.0)], [(12.0, 25.0)]) == 0.0
    both_served = PairChaosResult(
        submitted=1, fetched=1, takeover_seconds=1.0, takeover_bound=1.5, overlap_seconds=0.1,
        backup_took_over_in_stop=True, primary_unsure_after_resume=True,
    )  # fmt: skip
    assert not both_served.ok
    slow = PairChaosResult(
        submitted=1, fetched=1, takeover_seconds=2.0, takeover_bound=1.5,
        backup_took_over_in_stop=True, primary_unsure_after_resume=True,
    )  # fmt: skip
    assert not slow.ok
