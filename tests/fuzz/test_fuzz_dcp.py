"""`domo fuzz --dialect dcp`: DagBox DCP v1 workers and clients played against a broker.

domo's own broker passes (a short, bounded run through the command), and each planted DCP
mistake (``planted_dcp_broker.py``: domo's broker behind a relay that plants one) is found and
named by its rule of ``specs/dcp-v1.md``.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from domo.cli import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from domo.fuzz.dcp import near_misses
from domo.protocol.dialects.dcp import HEADER, check

from .conftest import INTERVAL, LIVENESS

pytestmark = [pytest.mark.io]

PLANTED_DCP = Path(__file__).with_name("planted_dcp_broker.py")


def _domo(*argv: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "domo", *argv], capture_output=True, text=True, timeout=timeout
    )


def test_domo_broker_is_clean_under_dcp(start_broker: Callable[[list[str]], str]) -> None:
    """DCP-03, DCP-04, DCP-07..DCP-14, DCP-16, DCP-18..DCP-20, DCP-23, DCP-26 judged from
    outside: nothing broken, and replies, requests, pongs, reconnects and echoes were checked."""
    endpoint = start_broker(
        [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
         "--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS),
         "--log-level", "error"]
    )  # fmt: skip
    done = _domo(
        "fuzz", endpoint, "--dialect", "dcp", "--heartbeat-interval", str(INTERVAL),
        "--liveness", str(LIVENESS), "--time-budget", "4", "--examples", "8", "--seed", "5",
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "broker (dcp):" in done.stdout
    assert "0 rule(s) broken: none" in done.stdout
    for kind in ("reply", "request", "pong", "reconnect", "registration"):
        assert re.search(rf"checked .*\b[1-9]\d* {kind}\b", done.stdout), kind  # coverage


def test_dcp_dialect_usage_and_unreachable() -> None:
    done = _domo("fuzz", "tcp://127.0.0.1:1", "--dialect", "dcp", "--target", "worker")
    assert done.returncode == EXIT_USAGE
    assert "--dialect dcp" in done.stderr
    done = _domo(
        "fuzz", "tcp://127.0.0.1:1", "--dialect", "dcp", "--heartbeat-interval", "0.1"
    )  # nothing listens on port 1
    assert done.returncode == EXIT_UNREACHABLE, done.stdout + done.stderr
    assert "nothing answered a DCP ping" in done.stderr


# Each planted mistake of planted_dcp_broker.py and the rule specs/dcp-v1.md gives it.
DCP_PLANTS: dict[str, str] = {
    "reply-wrong-width": "DCP-03",
    "reply-drops-metadata": "DCP-09",
    "pong-to-stranger": "DCP-14",
    "loses-second-request": "DCP-10",
    "no-registration-echo": "DCP-04",
    "reply-to-another-client": "DCP-07",
    "pings-workers": "DCP-16",
    "drops-unknown-service": "DCP-19",
    "dies-on-bad-input": "DCP-23",
    "drop-dual-reply": "DCP-20",
    "mmi-always-200": "DCP-26",
    "no-reconnect-on-reregistration": "DCP-18",
    "no-reconnect-for-stray-reply": "DCP-12",
}


@pytest.mark.parametrize("width", [1, 4])
def test_the_fuzzers_near_misses_are_what_the_codec_drops(width: int) -> None:
    """DCP-23: every near miss the fuzzer sends is one the codec refuses (or no DCP at all),
    but the reply from a peer holding no request, which is well formed (DCP-12): the fuzzer's
    hand-written frames and ``domo.protocol.dialects.dcp`` agree on what is malformed."""
    for frames, why, answered in near_misses(random.Random(width), width, b"svc"):
        is_dcp = frames[0] == b"" and len(frames) > 1 and frames[1][:4] == b"DGBX"
        is_dcp = is_dcp and len(frames[1]) == len(HEADER)
        if answered:
            assert check(frames[1:]) is None, why
        elif is_dcp:
            assert check(frames[1:]) is not None, why
