"""``domo worker --exec``: a command that needs a shell is refused at start unless ``--shell``
is given, and the defaults of ``domo call`` and ``domo worker`` agree, so that a slow command is
not run again for each resend."""

from __future__ import annotations

import argparse

import pytest

from domo.cli import EXIT_USAGE, build_parser
from domo.cli.worker import shell_syntax

from .conftest import run_domo


@pytest.mark.parametrize(
    ("command", "syntax"),
    [
        ("tr a-z A-Z | rev", "a pipe '|'"),
        ("sort > /tmp/out", "a redirection '>'"),
        ("echo $HOME", "a '$' expansion"),
        ('echo "$HOME"', "a '$' expansion"),
        ("true; false", "';'"),
        ("sleep 1 &", "'&'"),
        ("echo `date`", "a '`' substitution"),
    ],
)
async def test_a_command_that_needs_a_shell_is_refused_at_start(command: str, syntax: str) -> None:
    done = await run_domo("worker", "upper", "--exec", command)
    assert done.code == EXIT_USAGE, done
    assert f"has shell syntax ({syntax}): give --shell to run it with /bin/sh -c" in done.stderr


@pytest.mark.parametrize(
    "command",
    ["tr a-z A-Z", "tr 'a|b' 'c>d'", "echo '$HOME'", 'python3 -c "print(1)"', "echo a\\|b"],
)
def test_a_command_that_needs_no_shell_is_taken_as_it_is(command: str) -> None:
    assert shell_syntax(command) is None


def defaults(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_a_call_waits_longer_than_a_command_may_run() -> None:
    """With both at their defaults, a slow command runs once: its worker kills it at
    --exec-timeout and answers with an error before the call would resend."""
    call = defaults("call", "upper")
    worker = defaults("worker", "upper", "--exec", "tr a-z A-Z")
    assert call.timeout > worker.exec_timeout
