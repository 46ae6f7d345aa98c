"""Test configuration shared by the whole suite: Hypothesis profiles, pytest-xdist groups.

- ``dev`` (default): Hypothesis defaults without a deadline (a stateful example is a whole run).
- ``ci``: chosen automatically when the ``CI`` environment variable is set; Hypothesis's own
  ``ci`` profile (derandomized, no database), so CI and the mutants session are repeatable.
- ``long``: many more and longer examples, for ``nox -s stateful_long``.
- ``mutants``: like ``ci`` but without shrinking; the mutants session only needs to know that a
  test fails, not the smallest example (shrinking a stateful failure can take minutes).

Select one with ``--hypothesis-profile=NAME`` or ``HYPOTHESIS_PROFILE=NAME``.

``nox -s tests`` runs the suite on pytest-xdist workers with ``--dist loadgroup``, whose groups
are ``GROUPS`` here: each test goes to any worker, except that the tests sharing a costly session
fixture form a group that one worker runs, so the fixture is made once per run, not per worker.
(xdist's own ``xdist_group`` marks are not used: with pytest 9.2 they are silently ignored,
pytest-xdist issue 1386, because xdist carries the group in the node id, which pytest 9.2 no
longer lets a plugin rewrite.)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, Phase, settings

if TYPE_CHECKING:
    from xdist.scheduler import LoadScopeScheduling

settings.register_profile("dev", deadline=None)
settings.register_profile(
    "long",
    max_examples=2000,
    stateful_step_count=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "mutants",
    settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
if "HYPOTHESIS_PROFILE" in os.environ:
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
elif not os.environ.get("CI"):
    settings.load_profile("dev")

# The groups, by test path (the scheduler sees node ids only): the one SparkSession (8 to 16 s
# to start, tests/spark), majortomo's virtualenv (made by tests/interop and tests/docs alike, in
# one folder: two workers would clear it under each other) and EventMQ's.
GROUPS = {
    "tests/spark/": "spark",
    "tests/interop/test_majortomo.py": "majortomo",
    "tests/docs/test_tutorials.py": "majortomo",
    "tests/interop/test_eventmq.py": "eventmq",
    "tests/docs/test_readme.py::test_eventmq_blocks": "eventmq",
}
# Each costly fixture and its group: a test that takes one outside the group's paths is refused.
FIXTURE_GROUPS = {"spark": "spark", "majortomo_python": "majortomo", "eventmq_python": "eventmq"}


def group_of(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` (``GROUPS``), or None: any worker may run it."""
    return next((name for path, name in GROUPS.items() if nodeid.startswith(path)), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test that takes a costly fixture outside its group's paths (see ``GROUPS``)."""
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            group = FIXTURE_GROUPS.get(fixture)
            if group is not None and group_of(item.nodeid) != group:
                raise pytest.UsageError(
                    f"{item.nodeid} takes the {fixture} fixture: add its path to the "
                    f"{group!r} group of tests/conftest.py's GROUPS (one worker makes it once)"
                )


@pytest.fixture(autouse=True)
def fresh_log_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the log's rate limits unspent (``domo.eventlog``'s limiters are one
    per process, and ConnectionClosed's allows one line a minute): a test that waits for a log
    line must not miss it because an earlier test in the same process used the allowance."""
    from domo import eventlog

    for name in ("VIOLATIONS", "CHURN", "CLOSES"):
        limiter = getattr(eventlog, name)
        fresh = eventlog.ViolationLimiter(limiter.burst, limiter.window)
        monkeypatch.setattr(eventlog, name, fresh)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist does not know it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """``--dist loadgroup``: xdist's load scheduling, with ``GROUPS`` kept together."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid  # a test of no group is a scope of its own

    return GroupScheduling(config, log)
