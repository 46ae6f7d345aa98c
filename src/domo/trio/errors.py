"""What the Trio runtime raises to its callers: ``domo.runtime.errors``, shared by every runtime.

``DomoError`` is the root. A request that does not end with a FINAL raises ``RequestError``
(``RequestTimeout`` when the client session gave up after its retries); a FINAL that carries a
worker's handler error (MDP-D-23) raises ``RemoteError``. (``RequestError`` was once named
``RequestFailed``; that name is the core's event, ``domo.protocol.events.RequestFailed``, and no
exception has it any more.)
"""

from __future__ import annotations

from domo.runtime.errors import (
    ERROR_MARKER,
    ClientClosed,
    DomoError,
    RemoteError,
    RequestError,
    RequestTimeout,
    error_body,
    parse_error_body,
)

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
