"""``domo.trio.command``: the ``--exec`` handler used from Python, on real subprocesses."""

from __future__ import annotations

import shlex
import sys

import trio

from domo import DomoError
from domo.runtime.errors import parse_error_body
from domo.trio.command import CommandFailed, command_handler

ECHO_SIZES = (
    "import os, sys; data = sys.stdin.buffer.read(); "
    "sys.stdout.write(os.environ['DOMO_SERVICE'] + ':' + os.environ['DOMO_FRAME_SIZES'] + ':' "
    "+ data.decode())"
)


async def test_the_body_is_stdin_and_stdout_is_the_reply() -> None:
    handler = command_handler("svc", [sys.executable, "-c", ECHO_SIZES], timeout=10.0)
    with trio.fail_after(20):
        reply = await handler([b"ab", b"", b"cde"])
    assert reply == b"svc:2,0,3:abcde"


async def test_a_failing_command_is_an_error_reply_naming_status_and_stderr() -> None:
    code = "import sys; sys.stderr.write('boom'); sys.exit(3)"
    handler = command_handler("svc", [sys.executable, "-c", code], timeout=10.0)
    with trio.fail_after(20):
        reply = await handler([b"x"])
    assert isinstance(reply, list)
    expected = ("CommandFailed", "command exited with status 3; stderr: boom")
    assert parse_error_body(reply) == expected


async def test_a_command_past_its_timeout_is_killed() -> None:
    argv = shlex.split(f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(30)'")
    handler = command_handler("svc", argv, timeout=0.3)
    with trio.fail_after(20):
        reply = await handler([b""])
    assert isinstance(reply, list)
    assert parse_error_body(reply) == (
        "CommandFailed",
        "command timed out after 0.3 s and was killed",
    )


def test_command_failed_is_a_domo_error() -> None:
    assert issubclass(CommandFailed, DomoError)
