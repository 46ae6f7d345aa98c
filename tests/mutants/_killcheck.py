"""A pytest plugin for the mutants runner: records *how* each failing test failed.

A planted bug is only caught when a test's own check notices it: an ``assert`` in the tests (or
the test models), ``pytest.fail``, or ``pytest.raises`` that did not see its exception. A test
that dies of a ``NameError``, ``TypeError`` or ``ImportError`` raised inside the mutated core
would fail just as loudly against a mutant that is merely broken Python, so it proves nothing
about the rule the mutant breaks. This plugin writes one JSON line per failed test phase to the
file named by ``DOMO_KILLCHECK_FILE``: the test id, the exception types met (an exception group,
as Hypothesis raises for several distinct bugs, gives each of its leaves) and whether each was
raised by a check (``assertion``) or by anything else (``crash``).

Loaded by ``run.py`` with ``-p tests.mutants._killcheck``; it does nothing without the variable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

ENV_VAR = "DOMO_KILLCHECK_FILE"

# pytest's own "the test says this failed" outcomes: pytest.fail, and pytest.raises that did
# not see its exception, both raise Failed from pytest's code on behalf of the test.
_CHECK_TYPE_NAMES = frozenset({"Failed"})


def _leaves(error: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``error`` (itself if it is not a group)."""
    if isinstance(error, BaseExceptionGroup):
        found: list[BaseException] = []
        for inner in error.exceptions:
            found.extend(_leaves(inner))
        return found
    return [error]


def _core_dir() -> str:
    """The directory of the ``domo`` package the tests import (the mutated copy, under run.py)."""
    import domo  # imported late: the plugin loads before the tests choose what to import

    return str(Path(domo.__file__).resolve().parent) + os.sep


def _raised_in_core(error: BaseException) -> bool:
    """Whether the innermost frame of ``error``'s traceback is inside the package ``domo``."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_core_dir())


def classify(error: BaseException) -> str:
    """``assertion`` when ``error`` is a test's own check failing, else ``crash``.

    An ``AssertionError`` raised by an ``assert`` inside the core itself is a crash here: the core
    tripped over its own invariant, which is not a test noticing the rule being broken.
    """
    if type(error).__name__ in _CHECK_TYPE_NAMES:
        return "assertion"
    if isinstance(error, AssertionError) and not _raised_in_core(error):
        return "assertion"
    return "crash"


def describe(error: BaseException) -> list[dict[str, str]]:
    """One entry per leaf exception: its type name and its classification."""
    return [{"type": type(leaf).__name__, "kind": classify(leaf)} for leaf in _leaves(error)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Append a record for every failed setup, call or teardown phase."""
    report = yield
    path = os.environ.get(ENV_VAR)
    if path and report.failed and call.excinfo is not None:
        record = {"test": item.nodeid, "when": call.when, "errors": describe(call.excinfo.value)}
        with Path(path).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    return report


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module that cannot even be imported is a crash."""
    path = os.environ.get(ENV_VAR)
    if path and report.failed:
        record = {
            "test": report.nodeid,
            "when": "collect",
            "errors": [{"type": "CollectionError", "kind": "crash"}],
        }
        with Path(path).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
