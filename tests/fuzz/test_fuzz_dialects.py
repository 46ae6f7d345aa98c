"""`domo fuzz --dialect`: MDP/0.1's and majortomo's peers played against a broker.

domo's own broker passes in both dialects (a short, bounded run each, through the command); a
broker that breaks MDP/0.1's worker framing (MDP01-02) is found; the fuzzer's framing follows
the spec texts, both ways (specs/mdp-0.1.md, specs/majortomo.md).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from domo.fuzz import FuzzOptions, Step, fuzz_broker
from domo.fuzz import frames as mdp
from domo.fuzz.broker_target import BrokerRun, Timing
from domo.fuzz.dialect import Wire
from domo.fuzz.frames import FrameError

from .conftest import INTERVAL, LIVENESS

PLANTED_DIALECT = Path(__file__).with_name("planted_dialect_broker.py")


def _domo(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "domo", *argv], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("dialect", ["mdp01", "majortomo"])
def test_domo_broker_is_clean_in_each_dialect(
    start_broker: Callable[[list[str]], str], tmp_path: Path, dialect: str
) -> None:
    endpoint = start_broker(
        [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
         "--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS),
         "--log-level", "error"]
    )  # fmt: skip
    done = _domo(
        "fuzz", endpoint, "--dialect", dialect, "--heartbeat-interval", str(INTERVAL),
        "--liveness", str(LIVENESS), "--time-budget", "8", "--examples", "12", "--seed", "5",
        "--findings-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"broker ({dialect}):" in done.stdout
    assert "0 rule(s) broken" in done.stdout
    frame_rule = {"mdp01": "MDP01-02", "majortomo": "MAJ-01"}[dialect]
    assert f"{frame_rule} " in done.stdout  # coverage: its framing was judged


def test_a_broken_mdp01_framing_is_found(
    start_broker: Callable[[list[str]], str], tmp_path: Path
) -> None:
    """MDP01-02: the HEARTBEAT an MDP/0.1 worker gets lacks its leading empty frame."""
    endpoint = start_broker(
        [sys.executable, str(PLANTED_DIALECT), "mdp01-heartbeat-no-delimiter", str(INTERVAL),
         str(LIVENESS)]
    )  # fmt: skip
    options = FuzzOptions(
        endpoint,
        heartbeat_interval=INTERVAL,
        liveness=LIVENESS,
        examples=20,
        time_budget=15.0,
        seed=1,
        findings_dir=tmp_path,
        dialect="mdp01",
        stop_after=("MDP01-02",),
    )
    result = fuzz_broker(options, progress=None)
    assert "MDP01-02" in result.rules, [str(f.violation) for f in result.findings]


def test_the_same_relay_unaltered_is_clean(
    start_broker: Callable[[list[str]], str], tmp_path: Path
) -> None:
    """The planted relay with no flaw passes, so the flaw alone is what is found."""
    endpoint = start_broker(
        [sys.executable, str(PLANTED_DIALECT), "none", str(INTERVAL), str(LIVENESS)]
    )
    options = FuzzOptions(
        endpoint,
        heartbeat_interval=INTERVAL,
        liveness=LIVENESS,
        examples=6,
        time_budget=8.0,
        seed=1,
        findings_dir=tmp_path,
        dialect="mdp01",
    )
    assert fuzz_broker(options, progress=None).findings == []


def _play(endpoint: str, dialect: str, steps: list[Step]) -> list[str]:
    run = BrokerRun(endpoint, Timing(INTERVAL, LIVENESS), wire=Wire(dialect))
    try:
        return [f"{v.rule}: {v.explanation}" for v in run.run(steps)]
    finally:
        run.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dialect", ["mdp01", "majortomo"])
def test_a_silent_worker_given_a_request_before_its_expiry_stays_registered(
    start_broker: Callable[[list[str]], str], planted: Callable[..., str], dialect: str
) -> None:
    """w0 goes silent idle, c0's request comes before the broker expires w0: the broker hands
    it to w0, and a busy worker of these dialects is never expired (MDP01-12, MAJ-08), so
    mmi.service for its service is 200 long after w0's liveness ran out, rightly (MDP-M-01;
    CI's control run named it once). With no request, 200 is still stale: the plant is found."""
    domo = start_broker(
        [sys.executable, "-m", "domo", "broker", "--bind", "tcp://127.0.0.1:0",
         "--heartbeat-interval", str(INTERVAL), "--liveness", str(LIVENESS),
         "--log-level", "error"]
    )  # fmt: skip
    lost = [Step("ready", 0, 0), Step("wait", 0, 3), Step("die", 0, 0)]
    given = [*lost, Step("request", 0, 0), Step("wait", 0, 12), Step("mmi", 1, 0)]
    assert _play(domo, dialect, given) == []
    stale = planted("mmi-stale-200", dialect)
    found = _play(stale, dialect, [*lost, Step("wait", 0, 12), Step("mmi", 1, 0)])
    assert [f.split(":")[0] for f in found] == ["MDP-M-01"], found


def test_dialect_is_for_the_broker_target_only() -> None:
    done = _domo("fuzz", "tcp://127.0.0.1:0", "--target", "worker", "--dialect", "mdp01")
    assert done.returncode == 2
    assert "--dialect" in done.stderr


def test_framing_follows_the_dialect_specs() -> None:
    """What the fuzzer's peers send is framed as specs/mdp-0.1.md and specs/majortomo.md say,
    and what the broker sends reads back as MDP/0.2 (MDP01-02, MDP01-03, MAJ-01..04)."""
    mdp01, maj = Wire("mdp01"), Wire("majortomo")
    assert mdp01.out(mdp.worker_ready(b"echo")) == [b"", b"MDPW01", b"\x01", b"echo"]
    assert mdp01.out(mdp.client_request(b"echo", [b"hi"])) == [
        b"", b"MDPC01", b"echo", b"hi"
    ]  # fmt: skip
    assert maj.out(mdp.client_request(b"echo", [b"hi"])) == [
        b"", b"MDPC02", b"\x02", b"echo", b"hi"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no such command"):
        mdp01.out(mdp.worker_reply(mdp.W_PARTIAL, b"c", [b"x"]))  # MDP/0.1 has no PARTIAL
    assert mdp01.worker_in([b"", b"MDPW01", b"\x04"]) == [b"MDPW02", mdp.W_HEARTBEAT]
    assert mdp01.client_in([b"", b"MDPC01", b"echo", b"hi"], b"") == [
        b"MDPC02", mdp.C_FINAL, b"echo", b"hi"
    ]  # fmt: skip
    assert maj.client_in([b"", b"MDPC02", b"\x03", b"part"], b"echo") == [
        b"MDPC02", mdp.C_PARTIAL, b"echo", b"part"
    ]  # fmt: skip
    with pytest.raises(FrameError) as missing:
        mdp01.worker_in([b"MDPW01", b"\x04"])
    assert missing.value.rule == "MDP01-02"
    with pytest.raises(FrameError) as other:
        maj.client_in([b"", b"MDPC02", b"\x09", b"x"], b"echo")  # no such reply code
    assert other.value.rule == "MAJ-04"
    # A near-miss that would be valid in another dialect once framed is not sent as garbage.
    assert mdp01.garbage([b"MDPW01", b"\x01", b"echo"]) is None
    assert maj.garbage([b"MDPW01", b"\x01", b"echo"]) is None
    assert mdp01.garbage([b"MDPW02", b"\x09"]) == [b"", b"MDPW01", b"\x09"]
