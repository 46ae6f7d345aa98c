"""domo: the Majordomo Protocol family, exact to the spec.

``domo.protocol`` holds the sans-IO state machines (no sockets, no clock); ``domo.trio`` drives
them over ZeroMQ with Trio; ``domo.cli`` is the ``domo`` command. ``domo.call`` sends one request
from synchronous code.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "call"]


def call(
    endpoint: str, service: str | bytes, *frames: bytes, timeout: float = 2.5, retries: int = 3
) -> list[bytes]:
    """Send one request through the broker at ``endpoint``; return the FINAL body.

    Runs Trio for the one request (so it cannot be called from async code), retries on timeout
    like ``domo.trio.Client``, and raises ``domo.trio.RequestTimeout`` or ``RemoteError``.
    """
    # Imported here so that importing domo (or domo.protocol) loads neither trio nor zmq.
    from domo.trio.client import call as call_with_trio

    return call_with_trio(endpoint, service, *frames, timeout=timeout, retries=retries)
