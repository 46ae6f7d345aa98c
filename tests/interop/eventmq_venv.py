"""EventMQ 0.3.13's own virtualenv, made once under ``tmp/cache/`` and shared.

Used by the interop tests (``tests/interop/test_eventmq.py``'s fixture) and by ``nox -s
conformance`` (``python tests/interop/eventmq_venv.py`` makes it and prints its python), so the
pins live in one place. EventMQ is never a domo dependency. Plain Python: no pytest, no domo.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "tmp" / "cache" / "eventmq-0.3.13"
# EventMQ 0.3.13's own pins do not install on 3.11 (pyzmq 18.1.0 has no wheel, future 0.15.2
# fails to import): these are the ones that work (the enderlabs fork's future, today's pyzmq).
PINS = [
    "eventmq==0.3.13",
    "pyzmq",
    "six",
    "monotonic==0.4",
    "croniter==0.3.10",
    "future==0.18.3",
    "psutil==5.6.6",
    "python-dateutil",
]
_OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable")


class Offline(RuntimeError):
    """PyPI cannot be reached, so EventMQ cannot be installed."""


def eventmq_python(venv: Path = VENV) -> Path:
    """The python of a virtualenv with EventMQ 0.3.13 at ``venv``, made if missing or broken.

    Raises ``Offline`` if pip cannot reach PyPI, ``RuntimeError`` if it fails otherwise.
    """
    python = venv / "bin" / "python"
    probe = [
        str(python),
        "-c",
        "import eventmq.jobmanager, eventmq.router, eventmq.client.messages",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", *PINS],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        if any(sign in done.stderr for sign in _OFFLINE):
            raise Offline(
                f"PyPI is unreachable, so EventMQ cannot be installed: {done.stderr[-300:]}"
            )
        raise RuntimeError(f"pip could not install EventMQ 0.3.13:\n{done.stderr}")
    subprocess.run(probe, check=True, timeout=60)
    return python


if __name__ == "__main__":
    print(eventmq_python(Path(sys.argv[1]) if len(sys.argv) > 1 else VENV))
