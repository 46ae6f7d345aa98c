"""Fixtures and helpers for the Trio runtime's tests.

- ``Recorder``: an ``on_event`` hook that keeps every event and lets a test wait for one.
- ``zmq_context``: a shared context (``inproc://`` needs one); the test fails if it left a
  socket of it open.
- ``spawn``: subprocess peers (``tests/trio/peers.py``), killed by PID at teardown.
- After every test, a garbage collection, so a leaked socket's ``ResourceWarning`` fails the test
  that leaked it (see ``collect_garbage``).
"""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
import trio
import zmq

ROOT = Path(__file__).resolve().parents[2]
E = TypeVar("E")


class Recorder(Generic[E]):
    """Collects events (use as ``on_event=``); ``wait_for`` the first one that matches."""

    def __init__(self) -> None:
        self.events: list[tuple[float, E]] = []  # (trio time of arrival, event)
        self._changed = trio.Event()

    def __call__(self, event: E) -> None:
        self.events.append((trio.current_time(), event))
        self._changed.set()

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [event for _, event in self.events if isinstance(event, kind)]

    async def wait_for(self, kind: type[Any], match: Callable[[Any], bool] = bool) -> Any:
        await trio.lowlevel.checkpoint()
        seen = 0
        while True:
            for _, event in self.events[seen:]:
                if isinstance(event, kind) and match(event):
                    return event
            seen = len(self.events)
            self._changed = trio.Event()
            await self._changed.wait()


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    """Fail the test that leaked a socket or context, after letting pyzmq close it.

    Under ``filterwarnings = error`` the ResourceWarning pyzmq issues for an unclosed socket
    would raise inside its ``__del__`` before the socket is closed, and the forgotten socket
    would then block its context's termination forever; so here the warnings are recorded,
    the socket closes, and the test fails with what leaked.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    for warning in caught:
        if not issubclass(warning.category, ResourceWarning):
            warnings.warn_explicit(  # anything else keeps its usual treatment
                warning.message, warning.category, warning.filename, warning.lineno
            )
    assert not leaks, f"leaked: {leaks}"


@pytest.fixture
async def zmq_context() -> AsyncIterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    # pyzmq's own registry of the context's sockets (private, but the only one there is).
    left_open = [repr(s) for s in context._sockets if not s.closed]
    assert not left_open, f"sockets left open: {left_open}"
    # With every socket closed, term() waits at most their linger (0.5 s here). libzmq 4.3.5
    # was seen, rarely (about 1 run in 15 of test_load's streaming test), to block longer
    # with every socket closed; that is what ZmqTransport.aclose bounds too, so wait like it,
    # then abandon the context rather than fail a test whose every reply was checked.
    with trio.move_on_after(10) as waited:
        await trio.to_thread.run_sync(context.term, abandon_on_cancel=True)
    if waited.cancelled_caught:
        print("zmq_context: term() still blocked after 10 s; abandoned", file=sys.stderr)


def free_tcp_port() -> int:
    """A port nothing listens on right now (for a broker that must come back on the same one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Peer:
    """A subprocess from ``tests/trio/peers.py`` and the lines it printed."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.pid = process.pid
        self.lines: list[str] = []
        self._buffer = b""

    async def line(self, prefix: str) -> str:
        """The next line (from the start, then after the last one returned) with ``prefix``."""
        assert self.process.stdout is not None
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                text = raw.decode()
                self.lines.append(text)
                if text.startswith(prefix):
                    return text
            chunk = await self.process.stdout.receive_some()
            if not chunk:
                raise AssertionError(f"peer {self.pid} exited; it said {self.lines}")
            self._buffer += chunk


Spawn = Callable[..., Awaitable[Peer]]


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    peers: list[Peer] = []

    async def start(*args: str) -> Peer:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.trio.peers", *args], stdout=subprocess.PIPE, cwd=ROOT
        )
        peer = Peer(process)
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        if peer.process.returncode is None:
            peer.process.kill()  # by PID: only processes this fixture started
        with trio.fail_after(10), trio.CancelScope(shield=True):
            await peer.process.wait()
            if peer.process.stdout is not None:
                await peer.process.stdout.aclose()
