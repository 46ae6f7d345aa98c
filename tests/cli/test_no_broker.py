"""``domo call`` and ``domo worker`` pointed where no broker is: nothing listening, or an HTTP
server on the port. Each says what is there, soon (``domo.cli._probe``); the call exits 9
within about a second and a half instead of after every retry (11 s with the defaults), and the
worker keeps trying but says it is not connected, and why."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from domo.cli import EXIT_UNREACHABLE

from .conftest import QUICK_BEATS, StartDomo, run_domo
from .test_cli import _free_port

pytestmark = pytest.mark.io


@pytest.fixture
def http_endpoint() -> Iterator[str]:
    """A real HTTP server on a loopback port (Python's own), as a tcp:// endpoint."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


async def test_call_with_nothing_listening_says_so_at_once() -> None:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    done = await run_domo("call", "echo", "hi", "--connect", endpoint)
    assert (done.code, done.stdout) == (EXIT_UNREACHABLE, ""), done
    assert done.stderr == (
        f"domo call: cannot reach a broker at {endpoint}: nothing listens there (connection "
        "refused): is "
        "`domo broker` running, on that port?\n"
    )
    assert done.elapsed < 8.0  # 0.3 s + 1 s of refusals, and a Python start on a loaded machine


async def test_call_to_an_http_server_says_it_is_not_a_broker(http_endpoint: str) -> None:
    done = await run_domo("call", "echo", "hi", "--connect", http_endpoint)
    assert (done.code, done.stdout) == (EXIT_UNREACHABLE, ""), done
    assert done.stderr.startswith(
        f"domo call: cannot reach a broker at {http_endpoint}: something listens"
    )
    assert "it is not a ZeroMQ broker (an HTTP server, or another protocol" in done.stderr
    assert done.elapsed < 8.0


async def test_worker_at_an_http_server_never_says_connected(
    domo: StartDomo, http_endpoint: str
) -> None:
    worker = await domo("worker", "echo", "--connect", http_endpoint, *QUICK_BEATS)
    first = await worker.line("domo worker:")
    assert first == f"domo worker: waiting for the broker at {http_endpoint}"
    said = await worker.line("cannot reach a broker at", "stderr", time_limit=15)
    assert f"cannot reach a broker at {http_endpoint} (still trying" in said
    assert "it is not a ZeroMQ broker (an HTTP server" in said
    stderr = "\n".join(worker.lines("stderr"))
    assert "connected: the broker" not in stderr
    assert "nothing heard from the broker" not in stderr  # the probe said it better
    assert worker.lines() == [first]  # never "serving"
