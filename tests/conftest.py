"""Test configuration shared by the whole suite: Hypothesis profiles.

- ``dev`` (default): Hypothesis defaults without a deadline (a stateful example is a whole run).
- ``ci``: chosen automatically when the ``CI`` environment variable is set; Hypothesis's own
  ``ci`` profile (derandomized, no database), so CI and the mutants session are repeatable.
- ``long``: many more and longer examples, for ``nox -s stateful_long``.
- ``mutants``: like ``ci`` but without shrinking; the mutants session only needs to know that a
  test fails, not the smallest example (shrinking a stateful failure can take minutes).

Select one with ``--hypothesis-profile=NAME`` or ``HYPOTHESIS_PROFILE=NAME``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

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
