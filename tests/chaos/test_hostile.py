"""The hostile-peer probes' short forms (CI); ``nox -s chaos`` runs their long forms.

Each runs a real ``domo broker`` process and checks one promise of docs/security.md or
docs/reliability.md (issue 27); the probes and their figures are in ``hostile.py``. Timing
promises are judged loosely here, where a shared machine can halve anything: the long forms
measure them, and only a collapse fails CI.
"""

from __future__ import annotations

import pytest

from .hostile import (
    probe_auth,
    probe_blame,
    probe_drain,
    probe_fairness,
    probe_labels,
    probe_nng_size,
    probe_ready_flood,
    probe_sighup,
)

pytest.importorskip("pynng")
pytest.importorskip("cryptography")

pytestmark = [pytest.mark.io]


def test_auth_no_keyless_peer_of_any_dialect_is_served() -> None:
    """Finding 1: under CURVE a plain NNG endpoint is refused at start; on nng+tls+tcp:// a
    peer with no certificate or an unlisted one is neither served nor given a body, a listed
    one is; the startup line claims CURVE and TLS only where they apply."""
    result = probe_auth()
    assert result["plain_refused"], result
    assert result["tls_listed_served"] is True, result
    for who in ("tls_keyless", "tls_unlisted"):
        assert result[f"{who}_served"] is False, result
        assert result[f"{who}_worker_got_body"] is False, result
    assert result["tls_claims_ok"], result
    assert result["ok"]


def test_sighup_never_kills_the_broker() -> None:
    """Finding 5: with and without --curve-allow-file, logged."""
    result = probe_sighup()
    assert result["ok"], result


def test_malformed_nng_input_is_blamed_on_the_peer() -> None:
    """Finding 8."""
    result = probe_blame()
    assert result["lines"] > 0, result
    assert result["blaming_the_broker"] == 0, result


def test_a_real_service_gets_its_metric_label_after_1024_squatted_names() -> None:
    """Finding 7: four keyless memo01 READYs of 256 names, then a real `payments` worker: it is
    labelled in /metrics (it showed only as (none) before); the squatters, once gone, are not
    counted as workers under any label."""
    result = probe_labels()
    assert result["payments_labelled"], result
    assert result["squat_workers_after_they_left"] == 0, result


def test_an_nng_message_over_the_bound_is_not_taken_in() -> None:
    """Finding 2: 64 MiB messages at a broker bounded at 1 MiB move its RSS by < 16 MiB (they
    took it from 38 to 422 MiB)."""
    result = probe_nng_size()
    assert result["ok"], result


def test_a_ready_flood_does_not_flood_the_log() -> None:
    """Finding 3: memo01 READYs of 256 names for 3 s: the log grows by < 2 MB (5.4 MB before),
    and the broker serves the honest client once the flood stops. (Its rate during the flood,
    the core's cost of 256 seats a READY, is measured in the long form, not judged here.)"""
    result = probe_ready_flood()
    assert result["log_bytes_during"] < 2_000_000, result
    assert result["after_rps"] > 0, result


def test_drain_finishes_the_request_in_flight_and_takes_no_new_one() -> None:
    """Finding 9: --drain on SIGTERM (MDP-D-34): the request in flight is answered, a new one
    is refused (RequestRefused, draining), and the broker exits 0 once drained."""
    result = probe_drain()
    assert result["in_flight_answered"], result
    assert not result["late_request_answered"], result
    assert result["exit_code"] == 0, result


def test_a_junk_flood_of_any_dialect_starves_no_transport() -> None:
    """Finding 6, short form: each dialect's junk flood beside an honest client of each
    transport; every request answered (the probe raises otherwise), RSS back within 10 %, and
    no collapse (the ratios of the long form are in docs/reliability.md)."""
    result = probe_fairness()
    start, _, after = result["memo01"]["rss_mib"]  # after all four (one trim round, at the end)
    assert after <= start * 1.10, result
    for flood in ("mdp", "dcp", "emqp", "memo01"):
        row = result[flood]
        for side in ("zmq", "nng"):
            assert row[side]["throughput"] >= 0.1, (flood, side, result)
