"""Serve a service by running a command once per request: ``domo worker SERVICE --exec``.

``command_handler(service, argv, timeout)`` is a ``run_worker`` handler usable from Python as
well as from the command line. Each request's body (its frames joined) is the command's stdin;
its stdout is the reply. The command sees ``DOMO_SERVICE`` and ``DOMO_FRAME_SIZES`` (the
request's frame lengths, comma-separated, so a command can split a multi-frame body). A command
that exits non-zero, is killed by a signal or outlives ``timeout`` (then it is killed) is a
failed request: the reply is the MDP-D-23 error reply naming what happened, with the tail of its
stderr, and the worker logs one warning, no traceback.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import trio

from .errors import DomoError, error_body

__all__ = [
    "STDERR_TAIL",
    "CommandFailed",
    "CommandHandler",
    "CommandOutcome",
    "command_handler",
    "run_command",
]

CommandHandler = Callable[[list[bytes]], Awaitable[list[bytes] | bytes]]
"""What ``command_handler`` makes: a ``run_worker`` handler (``domo.trio.Handler``)."""

logger = logging.getLogger("domo.cli")  # its warnings read as the worker command's own


@dataclass
class CommandOutcome:
    """How one run of a command ended."""

    returncode: int | None  # None: killed at the timeout
    stdout: bytes
    stderr: bytes = field(repr=False)


class CommandFailed(DomoError):
    """The command exited non-zero, was killed, or ran out of time (MDP-D-23 reply)."""


STDERR_TAIL: Final = 2000  # bytes of a failed command's stderr that go into the error reply


def command_handler(service: str, argv: Sequence[str], timeout: float) -> CommandHandler:
    """The handler that serves ``service`` by running ``argv`` once per request."""
    command = shlex.join(argv)

    async def run_command_for(body: list[bytes]) -> list[bytes] | bytes:
        env = os.environ | {
            "DOMO_SERVICE": service,
            "DOMO_FRAME_SIZES": ",".join(str(len(frame)) for frame in body),
        }
        outcome = await run_command(argv, b"".join(body), env, timeout)
        if outcome.returncode == 0:
            return outcome.stdout
        failure = CommandFailed(_describe_failure(outcome, timeout))
        logger.warning("%s: %s", command, failure)
        return error_body(failure)  # an expected failure: no traceback in the worker's log

    return run_command_for


def _describe_failure(outcome: CommandOutcome, timeout: float) -> str:
    code = outcome.returncode
    if code is None:
        what = f"timed out after {timeout:g} s and was killed"
    elif code < 0:
        what = f"was killed by {signal.Signals(-code).name}"
    else:
        what = f"exited with status {code}"
    tail = outcome.stderr[-STDERR_TAIL:].decode("utf-8", "replace").strip()
    return f"command {what}" + (f"; stderr: {tail}" if tail else "")


async def run_command(
    argv: Sequence[str], stdin: bytes, env: dict[str, str], time_limit: float
) -> CommandOutcome:
    """Run ``argv`` with ``stdin``; its output, and its exit status unless it timed out.

    It is killed (SIGKILL) after ``time_limit`` seconds, or if we are cancelled; either way it
    is waited for.
    """
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    to_command, from_stdout, from_stderr = process.stdin, process.stdout, process.stderr
    assert to_command is not None
    assert from_stdout is not None
    assert from_stderr is not None
    stdout, stderr = bytearray(), bytearray()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_feed, to_command, stdin)
            nursery.start_soon(_read_all, from_stdout, stdout)
            nursery.start_soon(_read_all, from_stderr, stderr)
            with trio.move_on_after(time_limit) as deadline:
                await process.wait()
            if deadline.cancelled_caught:
                process.kill()
            # A grandchild may hold the pipes open after the command exits: don't wait for it.
            nursery.cancel_scope.deadline = trio.current_time() + 1.0
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            await to_command.aclose()
            await from_stdout.aclose()
            await from_stderr.aclose()
    returncode = None if deadline.cancelled_caught else process.returncode
    return CommandOutcome(returncode, bytes(stdout), bytes(stderr))


async def _feed(pipe: trio.abc.SendStream, data: bytes) -> None:
    try:
        await pipe.send_all(data)
        await pipe.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the command does not read all its input; that is its business


async def _read_all(pipe: trio.abc.ReceiveStream, into: bytearray) -> None:
    while chunk := await pipe.receive_some():
        into += chunk
