"""Fixtures of the docs' tests: ``processes`` starts subprocesses, all stopped at the end;
``eventmq_python`` is EventMQ's virtualenv (as in tests/interop), for the README's EventMQ
blocks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.interop import eventmq_venv

from .processes import Process


@pytest.fixture
def processes() -> Iterator[Callable[..., Process]]:
    """Start processes that are all stopped (SIGINT, then SIGKILL) at the end of the test."""
    started: list[Process] = []

    def start(*argv: str, **kwargs: object) -> Process:
        process = Process(*argv, **kwargs)  # type: ignore[arg-type]
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in reversed(started):
            process.stop()


@pytest.fixture(scope="session")
def eventmq_python() -> Path:
    """The python of EventMQ 0.3.13's virtualenv, made once and shared (eventmq_venv)."""
    try:
        return eventmq_venv.eventmq_python()
    except eventmq_venv.Offline as offline:
        pytest.skip(str(offline))
    except RuntimeError as failed:
        raise AssertionError(str(failed)) from None
