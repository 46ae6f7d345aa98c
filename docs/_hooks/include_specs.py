"""MkDocs hook: publish ../specs/*.md as specs/*.md without moving them into docs/.

The spec files live at the top of the repository (tests cite them there); the site shows them
under ``specs/`` so that ``docs/*.md`` links like ``../specs/mdp-0.2.md`` resolve unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

SPECS = Path(__file__).resolve().parents[2] / "specs"


def on_files(files: Files, config: Any) -> Files:
    """Add every specs/*.md to the site's files, with its source left where it is."""
    for path in sorted(SPECS.glob("*.md")):
        files.append(File.generated(config, f"specs/{path.name}", abs_src_path=str(path)))
    return files


# A link in docs/*.md or specs/*.md to a repository file outside the site (``../benchmarks/x.c``)
# has no page to point to on the site: it is shown as the file's path instead.
_REPO_LINK = re.compile(r"\[([^\]]+)\]\(\.\./(?!specs/|docs/)([^)#\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point repository-relative links of the top-level pages at their place on the site."""
    src = page.file.src_uri
    if "/" in src and not src.startswith("specs/"):
        return markdown
    if src.startswith("specs/"):
        markdown = markdown.replace("](../docs/", "](../")
    else:
        markdown = markdown.replace("](../specs/", "](specs/")
    return _REPO_LINK.sub(lambda m: f"{m.group(1)} (`{m.group(2)}` in the repository)", markdown)
