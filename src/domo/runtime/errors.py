"""What every runtime raises to its callers, and the handler-error reply convention (MDP-D-23).

``DomoError`` (``domo.DomoError``) is the root of every exception domo raises on purpose, the
core's ``LocalProtocolError`` and ``MalformedMessage`` included. A request that does not end with
a usable FINAL raises ``RequestError``: ``RequestTimeout`` when the client session gave up after
its retries, ``RemoteError`` when the FINAL reports the worker's handler error. The names differ
from the core's events on purpose (``domo.protocol.events.RequestFailed`` is an event, not an
exception).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from domo.protocol.errors import DomoError

__all__ = [
    "ERROR_MARKER",
    "ClientClosed",
    "DomoError",
    "RemoteError",
    "RequestError",
    "RequestTimeout",
    "error_body",
    "parse_error_body",
]

# MDP-D-23: a FINAL body of exactly three frames whose first is this marker reports a handler
# error: [marker, exception type name, message], both UTF-8. The NUL bytes make a clash with an
# ordinary reply unlikely; domo's clients raise it as RemoteError.
ERROR_MARKER: Final = b"\x00domo-error\x00"


class ClientClosed(DomoError):
    """The ``Client`` was closed while the request was in progress (or before it began)."""


class RequestError(DomoError):
    """A request ended without a usable FINAL.

    ``reason`` is the core's ``RequestFailed.reason`` (``"retries-exhausted"``,
    ``"timeout-after-partial"``) or ``"remote-error"``.
    """

    def __init__(self, service: bytes, attempts: int, reason: str, detail: str = "") -> None:
        message = f"request to {service!r} failed after {attempts} attempt(s): {reason}"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.service = service
        self.attempts = attempts
        self.reason = reason


class RequestTimeout(RequestError):
    """No FINAL arrived in time, after every retry the client session allows (MDP-C-08)."""


class RemoteError(RequestError):
    """The worker's handler raised; ``error_type`` and ``message`` describe the exception."""

    def __init__(self, service: bytes, attempts: int, error_type: str, message: str) -> None:
        super().__init__(service, attempts, "remote-error", f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


def error_body(error: BaseException) -> list[bytes]:
    """The FINAL body reporting ``error`` (MDP-D-23)."""
    name = type(error).__name__.encode()
    return [ERROR_MARKER, name, str(error).encode("utf-8", "replace")]


def parse_error_body(body: Sequence[bytes]) -> tuple[str, str] | None:
    """``(error_type, message)`` if ``body`` is an error reply, else None."""
    if len(body) != 3 or body[0] != ERROR_MARKER:
        return None
    return bytes(body[1]).decode("utf-8", "replace"), bytes(body[2]).decode("utf-8", "replace")
