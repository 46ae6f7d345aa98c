"""The core's public names are what its ``__all__`` says (issue 13): what the runtimes, the
fuzzer and the command use of ``domo.protocol.mdp`` is public, and every type a public view
returns can be imported from ``domo.protocol``."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import domo.protocol
from domo.protocol import mdp

SRC = Path(__file__).resolve().parents[2] / "src" / "domo"


def test_what_the_rest_of_domo_uses_of_mdp_is_public() -> None:
    used: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        if "protocol" in path.relative_to(SRC).parts:
            continue  # the core may use its own helpers
        text = path.read_text(encoding="utf-8")
        # ``mdp.X`` counts where ``mdp`` is the core's module (domo.fuzz names its own codec so)
        core_mdp = re.search(r"from domo\.protocol import (\(?[^)\n]*\bmdp\b)", text)
        names = set(re.findall(r"\bmdp\.([A-Za-z_]\w*)", text)) if core_mdp else set()
        for imported in re.findall(
            r"from domo\.protocol\.mdp import \(?([^)\n]*(?:\n[^)]*)*?)\)?\n", text
        ):
            names |= {name.strip() for name in imported.split(",") if name.strip()}
        for name in names:
            used.setdefault(name, set()).add(str(path.relative_to(SRC)))
    private = {name: where for name, where in used.items() if name not in mdp.__all__}
    assert private == {}, "used outside the core but not in mdp.__all__"
    assert all(hasattr(mdp, name) for name in mdp.__all__)


def test_every_type_a_view_returns_is_importable_from_domo_protocol() -> None:
    for view in (domo.protocol.RequestView, domo.protocol.WorkerView, domo.protocol.ServiceView):
        hints = typing.get_type_hints(view)
        for hint in hints.values():
            if isinstance(hint, type) and hint.__module__.startswith("domo.protocol"):
                assert hint.__name__ in domo.protocol.__all__, (view.__name__, hint)
                assert getattr(domo.protocol, hint.__name__) is hint
