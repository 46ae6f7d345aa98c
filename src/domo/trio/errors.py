"""What the Trio runtime raises to its callers: ``domo.runtime.errors``, shared by every runtime.

``DomoError`` is the root. A request that does not end with a FINAL raises ``RequestError``
(``RequestTimeout`` when the client session gave up after its retries); a FINAL that carries a
worker's handler error (MDP-D-23) raises ``RemoteError``. ``RequestFailed`` is the old name of
``RequestError``, kept as an alias; it is deprecated because the core's event of that name
(``domo.protocol.events.RequestFailed``) is not an exception.
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
    "RequestFailed",
    "RequestTimeout",
    "error_body",
    "parse_error_body",
]

RequestFailed = RequestError  # deprecated alias (see the module docstring)
