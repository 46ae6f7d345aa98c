"""Fixtures for the interop tests: the ``domo`` command's process fixture (``tests/cli``)."""

from __future__ import annotations

from ..cli.conftest import collect_garbage, domo

__all__ = ["collect_garbage", "domo"]
