"""``domo keygen`` and CURVE on the command line: broker, worker and call in real processes.

The broker is a subprocess with ``--curve-secret-file`` and ``--curve-allow-file``; SIGHUP makes
it re-read the allow-list, which is how a new key is admitted without a restart.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from domo.cli import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

from .conftest import QUICK_BEATS, StartDomo, run_domo

pytestmark = pytest.mark.io


async def keygen(directory: Path, name: str) -> str:
    """``domo keygen NAME --dir DIRECTORY``; returns the public key it printed."""
    done = await run_domo("keygen", name, "--dir", str(directory))
    assert done.code == EXIT_OK, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("public key: ")]
    return line.removeprefix("public key: ")


async def test_keygen_writes_a_pair_and_never_overwrites(tmp_path: Path) -> None:
    public = await keygen(tmp_path, "node")
    assert len(public) == 40
    assert f'public-key = "{public}"' in (tmp_path / "node.key").read_text()
    secret_file = tmp_path / "node.key_secret"
    assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
    assert "secret-key" in secret_file.read_text()
    again = await run_domo("keygen", "node", "--dir", str(tmp_path))
    assert again.code == EXIT_USAGE
    assert "exists; not overwritten" in again.stderr


async def test_curve_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    await keygen(tmp_path, "broker")
    allow = tmp_path / "allow"
    allow.write_text("not-a-key\n")
    secret = str(tmp_path / "broker.key_secret")
    done = await run_domo("broker", "--curve-secret-file", secret, "--curve-allow-file", str(allow))
    assert done.code == EXIT_USAGE
    assert "line 1" in done.stderr
    done = await run_domo("broker", "--curve-allow-file", str(allow))
    assert done.code == EXIT_USAGE
    assert "needs --curve-secret-file" in done.stderr
    done = await run_domo("call", "echo", "--curve-secret-file", secret)
    assert done.code == EXIT_USAGE
    assert "needs --curve-server-key" in done.stderr


async def test_sighup_reload_admits_a_newly_allowed_key(domo: StartDomo, tmp_path: Path) -> None:
    """A subprocess broker with an allow-list: the worker and client on it are served, a client
    with another key is not; after the key is added and the broker gets SIGHUP, it is."""
    await keygen(tmp_path, "broker")
    worker_key = await keygen(tmp_path, "worker")
    await keygen(tmp_path, "alice")
    bob_key = await keygen(tmp_path, "bob")
    allow = tmp_path / "allow"
    allow.write_text(f"# who may connect\n{worker_key}  # the echo worker\n")
    broker = await domo(
        "broker",
        "--bind",
        "tcp://127.0.0.1:0",
        *QUICK_BEATS,
        "--curve-secret-file",
        str(tmp_path / "broker.key_secret"),
        "--curve-allow-file",
        str(allow),
    )
    endpoint = (await broker.line("domo broker: listening on ")).split()[-2]
    server_key = str(tmp_path / "broker.key")
    await domo(
        "worker",
        "echo",
        "--connect",
        endpoint,
        *QUICK_BEATS,
        "--curve-server-key",
        server_key,
        "--curve-secret-file",
        str(tmp_path / "worker.key_secret"),
    )
    await broker.line("WorkerRegistered:", "stderr")

    async def call(name: str) -> int:
        done = await run_domo(
            "call",
            "echo",
            name,
            "--connect",
            endpoint,
            "--timeout",
            "1",
            "--retries",
            "0",
            "--curve-server-key",
            server_key,
            "--curve-secret-file",
            str(tmp_path / f"{name}.key_secret"),
        )
        assert done.stdout == ("" if done.code else f"{name}\n")
        return done.code

    # Not on the list: refused, never served; domo call sees the refusal (exit 9, at once).
    assert await call("bob") == EXIT_UNREACHABLE
    await broker.line("is not on the allow-list", "stderr")
    allow.write_text(allow.read_text() + f"{bob_key}  # bob\n")
    broker.signal(signal.SIGHUP)
    await broker.line("allow-list reloaded", "stderr")
    assert await call("bob") == EXIT_OK
    assert await call("alice") == EXIT_UNREACHABLE  # still not listed
    broker.signal(signal.SIGTERM)
    assert await broker.exit_code() == EXIT_OK
