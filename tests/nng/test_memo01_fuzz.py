"""`domo fuzz --dialect memo01` against `domo broker`'s NNG endpoint, and against a broker with a
planted bug (MEMO-16 off), which it must catch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("pynng")
pytest.importorskip("cbor2")

import trio

import domo.protocol.memo01 as memo_layer
from domo.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from domo.fuzz.memo01 import fuzz_memo01
from domo.trio import serve_broker

pytestmark = [pytest.mark.io]

DOMO = [sys.executable, "-m", "domo"]


async def run(*args: str) -> tuple[int, str, str]:
    with trio.fail_after(60):
        done = await trio.run_process(
            [*DOMO, *args], capture_stdout=True, capture_stderr=True, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_memo_16_domo_fuzz_memo01_finds_nothing_in_domo_broker(tmp_path: Path) -> None:
    """MEMO-03, MEMO-05, MEMO-10, MEMO-16, MEMO-18 checked from outside, over NNG."""
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            _, nng = await nursery.start(
                lambda task_status: serve_broker(
                    "tcp://127.0.0.1:0", f"nng+ipc://{tmp_path}/f.ipc", task_status=task_status
                )
            )
            code, out, err = await run(
                "fuzz", "--dialect", "memo01", nng, "--examples", "4", "--seed", "3"
            )
            assert code == EXIT_OK, out + err
            assert "4 scenarios" in out
            assert "0 rule(s) broken: none" in out
            code, _, err = await run("fuzz", "--dialect", "memo01", "tcp://127.0.0.1:1")
            assert code == EXIT_USAGE
            assert "nng+tcp://" in err
            nursery.cancel_scope.cancel()


async def test_memo_16_the_memo01_fuzzer_catches_a_broker_that_runs_resends_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MEMO-16: with the duplicate check planted away, the fuzzer reports MEMO-16."""
    original = memo_layer.Memo01Broker._on_job

    def no_joining(self: memo_layer.Memo01Broker, *args: object) -> None:
        self._by_signature.clear()  # planted: a resent JOB is never found again
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(memo_layer.Memo01Broker, "_on_job", no_joining)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            _, nng = await nursery.start(
                lambda task_status: serve_broker(
                    "tcp://127.0.0.1:0", f"nng+ipc://{tmp_path}/p.ipc", task_status=task_status
                )
            )
            url = nng.removeprefix("nng+")
            result = await trio.to_thread.run_sync(
                lambda: fuzz_memo01(url, scenarios=12, seed=5, time_budget=60, lanes=1)
            )
            assert [f.rule for f in result.findings] == ["MEMO-16"], result
            assert EXIT_FINDINGS == 7
            nursery.cancel_scope.cancel()
