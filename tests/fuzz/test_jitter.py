"""The fuzzer's timing windows follow the jitter it measures (domo.fuzz.jitter, docs/fuzz.md)."""

from __future__ import annotations

import time

import pytest

from domo.fuzz.broker_target import Timing
from domo.fuzz.jitter import CAP, FLOOR, JitterMeter


def test_idle_meter_gives_the_floor() -> None:
    assert JitterMeter().value == FLOOR


def test_a_late_wake_widens_every_window_and_is_forgotten_after_the_horizon() -> None:
    timing = Timing(0.1, 3, JitterMeter(horizon=0.2))
    idle_dead_after = timing.dead_after
    assert idle_dead_after == pytest.approx(0.3 + 0.02 + 4 * FLOOR)
    now = time.monotonic()
    timing.meter.wake(now - 0.08, now)  # the fuzzer woke 80 ms late
    assert timing.jitter == pytest.approx(0.08)
    assert timing.slack == pytest.approx(0.02 + 4 * 0.08)
    assert timing.dead_after == pytest.approx(0.3 + timing.slack)
    assert timing.forward_window == pytest.approx(0.1 + 2 * timing.slack)
    time.sleep(1.3)  # past the horizon and its one-second bucket
    assert timing.jitter == FLOOR


def test_regular_heartbeats_at_a_wrong_interval_are_no_jitter() -> None:
    # A peer heartbeating steadily every 0.25 s (a wrong interval) must not widen the windows
    # that judge it: the spread is taken around the median gap, not around the interval.
    meter = JitterMeter()
    for _ in range(10):
        meter.heartbeat_gap("w", 0.25)
    assert meter.value == FLOOR
    meter.heartbeat_gap("w", 0.40)  # one heartbeat 150 ms late
    assert meter.value == pytest.approx(0.15)
    assert meter.largest["heartbeat"] == pytest.approx(0.15)


def test_jitter_is_capped() -> None:
    meter = JitterMeter()
    meter.round_trip(10.0)
    assert meter.value == CAP
