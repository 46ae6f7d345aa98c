"""``python -m domo``: the ``domo`` command (see ``domo.cli``)."""

from __future__ import annotations

from domo.cli import main

raise SystemExit(main())
