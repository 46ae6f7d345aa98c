"""The documents say what the program does: every exit code where the docs list them, and
citations of public documents only (never a folder outside the repository)."""

from __future__ import annotations

import re

from domo import report
from domo.cli import EXIT_CODES

from .processes import ROOT

# Every code some command exits with, and 143 (call stopped by SIGTERM: 128 + 15, beside 130).
ALL_CODES = sorted({code for table in EXIT_CODES.values() for code, _ in table} | {143})


def section(path: str, heading: str) -> str:
    """The text of ``path`` under ``heading``, up to the next heading of the same level."""
    text = (ROOT / path).read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    end = text.find(f"\n{level} ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def table_codes(text: str) -> list[int]:
    """The codes of a Markdown table whose first column is ``| 0 |`` or ``| 130, 143 |``."""
    codes = []
    for cells in re.findall(r"^\| ([\d, ]+) \|", text, re.MULTILINE):
        codes += [int(code) for code in cells.split(",")]
    return codes


def test_readme_lists_every_exit_code() -> None:
    text = (ROOT / "README.md").read_text()
    listed = text[text.index("Exit codes, one meaning each:") : text.index("`domo COMMAND --help`")]
    # "0 ok (...), 1 a bug (...), ..., 10 to 14 ..., 130 and 143 ...": each item after ": " or ", ".
    codes: list[int] = []
    for first, to, also in re.findall(r"(?:: |, )(\d+)(?: to (\d+)| and (\d+))?\s[a-z`(]", listed):
        codes += range(int(first), int(to or first) + 1)
        codes += [int(also)] if also else []
    codes.sort()
    assert codes == ALL_CODES


def test_cli_md_lists_every_exit_code() -> None:
    assert sorted(table_codes(section("docs/cli.md", "## Exit codes"))) == ALL_CODES


def test_report_md_exit_codes_are_the_programs() -> None:
    shown = table_codes(section("docs/report.md", "## Errors and exit codes"))
    assert shown == [code for code, _ in report.EXIT_CODES]


def test_fuzz_md_exit_codes_are_the_programs() -> None:
    fuzz_codes = {code for code, _ in EXIT_CODES["fuzz"]}
    text = (ROOT / "docs" / "fuzz.md").read_text()
    sentences = re.findall(r"Exit codes(?: are [^(]*)?:? ?\(?([^.]*)", text)
    assert sentences
    for sentence in sentences:
        said = {int(code) for code in re.findall(r"(?:^|, )(\d+) (?=[a-zA-Z`])", sentence)}
        assert said <= fuzz_codes, sentence


def test_documents_cite_public_sources_only() -> None:
    """The specs and docs cite RFCs and projects by name: ``../shared/...`` is the team's
    workspace, which is not part of the repository."""
    pages = [ROOT / "README.md", *(ROOT / "specs").glob("*.md"), *(ROOT / "docs").rglob("*.md")]
    for page in pages:
        text = page.read_text()
        for stale in ("shared/seeds", "../shared/", "team's workspace"):
            assert stale not in text, f"{page.relative_to(ROOT)} cites {stale!r}"
