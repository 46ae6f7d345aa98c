"""Fixtures of the docs' tests: ``processes`` starts subprocesses, all stopped at the end
(``eventmq_python``, for the README's EventMQ blocks, is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

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
