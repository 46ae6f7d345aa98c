"""The renderer of the spec's transition tables: every cell shown, markers handled, the command.

The check that the spec is current is in tests/protocol/test_spec.py; this file tests the tool.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

import pytest

from domo.protocol.broker import WORKER_TRANSITIONS, Action, PeerState, WorkerInput
from domo.spec_tables import (
    BEGIN,
    END,
    MACHINES,
    Machine,
    extract_block,
    main,
    render_block,
    render_machine,
    replace_block,
)


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the Markdown tables in ``markdown``, split into stripped cells."""
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    return [
        [cell.strip() for cell in row.strip("|").split(" | ")]
        for row in rows
        if not row.startswith("| state |") and not row.startswith("| ---")
    ]


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.source.rsplit(".", 1)[-1])
def test_every_cell_is_one_row_with_its_rule(machine: Machine) -> None:
    rows = table_rows(render_machine(machine))
    expected = [(s.name, str(i.value)) for s in machine.states for i in machine.inputs]
    assert [(row[0], row[1]) for row in rows] == expected
    for row, (state, input_) in zip(
        rows, [(s, i) for s in machine.states for i in machine.inputs], strict=True
    ):
        cell = machine.table[state, input_]
        assert row[4] == cell.rule
        assert row[3] == ", ".join(f"`{a.name}`" for a in cell.actions)
        after = cell.next_state
        assert row[2] == ("—" if after is None or after is state else after.name)
        error = getattr(cell, "error", None)
        if error is not None:
            assert row[5] == f"error: {error}"
        else:
            assert row[5] == ("violation" if cell.violation else "")


def test_a_missing_cell_is_an_error_not_a_gap() -> None:
    partial = dict(WORKER_TRANSITIONS)
    del partial[PeerState.BUSY, WorkerInput.FINAL]
    machine = dataclasses.replace(MACHINES[0], table=partial)
    with pytest.raises(ValueError, match="BUSY"):
        render_machine(machine)


def test_pipes_in_text_do_not_break_the_table() -> None:
    class Odd(enum.Enum):
        PIPE = "a|b"

    table = {(state, Odd.PIPE): WORKER_TRANSITIONS[state, WorkerInput.READY] for state in PeerState}
    machine = dataclasses.replace(MACHINES[0], inputs=Odd, actions=Action, table=table)
    rendered = render_machine(machine)
    assert "| a\\|b |" in rendered
    assert all(line.count(" | ") == 5 for line in rendered.splitlines() if "a\\|b" in line)


def test_replace_then_extract_gives_the_block_back() -> None:
    text = f"intro\n\n{BEGIN}\nold stuff\n{END}\ntail\n"
    block = render_block()
    replaced = replace_block(text, block)
    assert replaced.startswith("intro\n\n" + BEGIN + "\n\n")
    assert replaced.endswith("\n\n" + END + "\ntail\n")
    assert extract_block(replaced) == block
    assert replace_block(replaced, block) == replaced


@pytest.mark.parametrize(
    "text",
    ["no markers", f"{BEGIN} only", f"{END} {BEGIN}", f"{BEGIN}{BEGIN}{END}", f"{BEGIN}{END}{END}"],
)
def test_bad_markers_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="tables:"):
        extract_block(text)
    with pytest.raises(ValueError, match="tables:"):
        replace_block(text, "x\n")


def test_command_checks_and_writes_a_file(tmp_path: Path) -> None:
    spec = tmp_path / "spec.md"
    spec.write_text(f"# spec\n\n{BEGIN}\n| stale |\n{END}\n", encoding="utf-8")
    said: list[str] = []

    assert main(["--check", str(spec)], out=said.append) == 1
    assert "differ" in said[-1]
    assert main(["--write", str(spec)], out=said.append) == 0
    assert said[-1].endswith("tables rewritten")
    written = spec.read_text(encoding="utf-8")
    assert written.startswith(f"# spec\n\n{BEGIN}\n\n### ")
    assert extract_block(written) == render_block()
    assert main(["--check", str(spec)], out=said.append) == 0
    assert main(["--write", str(spec)], out=said.append) == 0
    assert said[-1].endswith("tables up to date")
    assert spec.read_text(encoding="utf-8") == written


def test_command_prints_the_block() -> None:
    said: list[str] = []
    assert main([], out=said.append) == 0
    assert said == [render_block().rstrip("\n")]
