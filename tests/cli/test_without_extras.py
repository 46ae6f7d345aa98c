"""The commands that need an extra, run where it is not installed: exit 2 and how to install it,
never a traceback. The extra is made unimportable in a child process (``sys.modules[name] =
None``), as in a core-only install; no module-level skip, so these run there too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from domo.cli import EXIT_USAGE


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["status"], "domo status"),
        (["broker", "--bind", "tcp://127.0.0.1:0", "--metrics", "127.0.0.1:0"], "domo broker: "),
    ],
)
def test_metrics_commands_without_the_extra_say_how_to_install(argv: list[str], what: str) -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from domo.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.startswith(what), done.stderr
    assert "needs prometheus-client" in done.stderr
    assert "pip install 'domo[metrics]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""  # the broker stopped before binding anything
