"""conformance/run.py writes its table from the record of a run: every finding gets a row."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _runner() -> ModuleType:
    path = ROOT / "conformance" / "run.py"
    spec = importlib.util.spec_from_file_location("conformance_run", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_has_a_row_per_finding_and_per_clean_run() -> None:
    run = _runner()
    record = json.loads((ROOT / "docs" / "conformance.json").read_text(encoding="utf-8"))
    rows = run.table(record["runs"]).splitlines()[2:]
    expected = sum(max(1, len(r["findings"])) for r in record["runs"])
    assert len(rows) == expected
    for r in record["runs"]:
        for finding in r["findings"]:
            assert any(finding["rule"] in row and r["system"] in row for row in rows)


def test_the_committed_doc_holds_the_committed_record() -> None:
    """docs/conformance.md's table is the one run.py makes from docs/conformance.json."""
    run = _runner()
    record = json.loads((ROOT / "docs" / "conformance.json").read_text(encoding="utf-8"))
    doc = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    assert run.table(record["runs"]) in doc
