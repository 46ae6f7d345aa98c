"""The broker's byte bounds as an operator meets them (MDP-D-25, MDP-D-26): options, log lines,
and what ``domo call`` says when a body is over the bound."""

from __future__ import annotations

import trio

from domo.sync import Client, RequestTimeout

from .conftest import QUICK_BEATS, StartDomo, run_domo

EXIT_TIMEOUT = 3


async def test_a_request_over_max_message_bytes_is_refused_and_logged(domo: StartDomo) -> None:
    """MDP-D-25: two 300 KiB frames against --max-message-bytes 512K: refused with the rule in
    the broker's log, no reply; a request within the bound is served; MDP-D-26 likewise."""
    bounds = ["--max-message-bytes", "512K", "--max-peer-bytes", "2M", "--max-held-bytes", "1M"]
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS, *bounds)
    endpoint = await broker.endpoint()
    await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
    await broker.line("WorkerRegistered:", "stderr")
    frame = b"x" * (300 * 1024)

    def call(*body: bytes) -> list[bytes] | None:
        with Client(endpoint, timeout=0.5, retries=0) as client:
            try:
                return client.request("echo", *body)
            except RequestTimeout:
                return None

    with trio.fail_after(30):
        assert await trio.to_thread.run_sync(call, frame, frame) is None
        line = await broker.line("refused", "stderr")
        assert "refused: too-large (MDP-D-25; 614400 bytes, 0 held)" in line
        assert await trio.to_thread.run_sync(call, frame) == [frame]


async def test_call_names_the_bound_for_a_body_over_the_default(domo: StartDomo) -> None:
    """A 5 MB body to a broker with the default bound: ZeroMQ cuts it off (MDP-D-25), and the
    call's message names --max-message-bytes instead of blaming the broker's absence."""
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS)
    endpoint = await broker.endpoint()
    await domo("worker", "echo", "--connect", endpoint, *QUICK_BEATS)
    await broker.line("WorkerRegistered:", "stderr")
    done = await run_domo(
        "call", "echo", "-", "--connect", endpoint, "--timeout", "1", "--retries", "0",
        stdin=b"\0" * 5_000_000,
    )  # fmt: skip
    assert done.code == EXIT_TIMEOUT, done
    assert "over the 4 MiB a broker takes by default" in done.stderr, done.stderr
    assert "--max-message-bytes" in done.stderr
    # MDP-D-31: the connection ZeroMQ closed is in the broker's log, with the rule it may mean.
    line = await broker.line("ConnectionClosed:", "stderr")
    assert "a frame over max_message_bytes (MDP-D-25)" in line
    assert line.endswith("(MDP-D-31)")


async def test_bounds_that_cannot_hold_one_message_are_a_usage_error() -> None:
    done = await run_domo("broker", "--max-message-bytes", "8M", "--max-held-bytes", "4M")
    assert done.code == 2
    assert (
        "--max-held-bytes (4194304) must be >= --max-message-bytes (8388608) + REQUEST_OVERHEAD "
        "(2048), that is 8390656" in done.stderr
    )
    done = await run_domo("broker", "--max-peer-bytes", "lots")
    assert done.code == 2
    assert "not a size: 'lots'" in done.stderr


async def test_a_pipe_of_fewer_than_four_largest_messages_is_a_usage_error() -> None:
    """MDP-D-32: --max-peer-bytes under 4 x --max-message-bytes is refused at start, with both
    options and the least allowed value named; exactly 4 x starts."""
    done = await run_domo("broker", "--max-message-bytes", "1M", "--max-peer-bytes", "3M")
    assert done.code == 2
    assert (
        "--max-peer-bytes (3145728) must be at least 4 x --max-message-bytes (1048576), "
        "that is 4194304" in done.stderr
    ), done.stderr
    done = await run_domo(
        "broker", "--max-message-bytes", "1M", "--max-peer-bytes", "4M", "--max-pending-bytes",
        "512K",
    )  # fmt: skip
    assert done.code == 2
    assert "--max-pending-bytes (524288) must be >= --max-message-bytes (1048576)" in done.stderr


async def test_the_smallest_pipe_allowed_starts(domo: StartDomo) -> None:
    """MDP-D-32: --max-peer-bytes exactly 4 x --max-message-bytes is accepted."""
    bounds = ["--max-message-bytes", "1M", "--max-peer-bytes", "4M", "--max-pending-bytes", "8M"]
    broker = await domo("broker", "--bind", "tcp://127.0.0.1:0", *QUICK_BEATS, *bounds)
    assert (await broker.endpoint()).startswith("tcp://127.0.0.1:")
