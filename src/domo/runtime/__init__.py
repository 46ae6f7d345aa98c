"""What domo's runtimes share, whatever their event loop (Trio, asyncio, or none).

- ``errors``: ``DomoError`` and what a client raises; the handler-error reply (MDP-D-23).
- ``replies``: ``Reply`` and how a request's ending event becomes a body or an exception.
- ``handlers``: how a worker handler's answer becomes frames.
- ``pumping``: the broker's flush (send failures become core inputs) and the event log.
- ``pending``: the count of bytes a broker's outbound pipes hold, all peers together (MDP-D-30).

Nothing here does I/O; the runtimes (``domo.trio``, ``domo.asyncio``, ``domo.sync``) own the
sockets and the clock.
"""

from __future__ import annotations

from .errors import (
    ERROR_MARKER,
    ClientClosed,
    DomoError,
    RemoteError,
    RequestError,
    RequestTimeout,
    error_body,
    parse_error_body,
)
from .handlers import Body, HandlerError, Partial, as_frames
from .pumping import EAGAIN, EHOSTUNREACH, SENT, flush_router, log_event
from .replies import REPLY_EVENTS, Reply, final_body, service_name

__all__ = [
    "EAGAIN",
    "EHOSTUNREACH",
    "ERROR_MARKER",
    "REPLY_EVENTS",
    "SENT",
    "Body",
    "ClientClosed",
    "DomoError",
    "HandlerError",
    "Partial",
    "RemoteError",
    "Reply",
    "RequestError",
    "RequestTimeout",
    "as_frames",
    "error_body",
    "final_body",
    "flush_router",
    "log_event",
    "parse_error_body",
    "service_name",
]
