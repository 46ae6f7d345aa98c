"""domo: the Majordomo Protocol family, exact to the spec.

``domo.protocol`` holds the sans-IO state machines (no sockets, no clock). Three runtimes drive
them over ZeroMQ with the same names and arguments: ``domo.sync`` (blocking code and threads),
``domo.asyncio`` and ``domo.trio``; ``domo.runtime`` is what they share. ``domo.cli`` is the
``domo`` command. ``domo.call`` sends one request from blocking code.

Every exception domo raises on purpose derives from ``domo.DomoError``.
"""

from __future__ import annotations

from domo.protocol.errors import DomoError

__version__ = "0.1.0"

__all__ = ["DomoError", "__version__", "call"]


def call(
    endpoint: str, service: str | bytes, *frames: bytes, timeout: float = 2.5, retries: int = 3
) -> list[bytes]:
    """Send one request through the broker at ``endpoint``; return the FINAL body.

    Blocking (``domo.sync.Client``, no event loop, so it may be called from any thread, even one
    that runs an event loop, which it then blocks): it retries on timeout and raises
    ``domo.runtime.RequestTimeout`` or ``RemoteError``, both ``DomoError``.
    """
    # Imported here so that importing domo (or domo.protocol) loads no zmq.
    from domo.sync.client import call as blocking_call

    return blocking_call(endpoint, service, *frames, timeout=timeout, retries=retries)
