"""``domo report`` where it needs no Spark: without the spark extra, and a bad TRACE_DIR.

No module-level skip: these run in a core-only install too (``nox -s tests_all``).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from domo import report


def test_without_the_extra_it_says_how_to_install(tmp_path: Path) -> None:
    """pyspark made unimportable in a child (as in a core-only install): exit 12 and the hint."""
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from domo.cli import main\n"
        f"sys.exit(main(['report', {str(tmp_path)!r}]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == report.EXIT_NO_SPARK == 12
    assert "pip install 'domo[spark]'" in result.stderr


def test_not_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    assert report.run(tmp_path / "missing", stderr=io.StringIO()) == report.EXIT_USAGE
