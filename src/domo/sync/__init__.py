"""domo's blocking runtime: the sans-IO MDP/0.2 core over plain pyzmq, no event loop.

- ``Client``: requests from any thread, with timeouts, retries, streaming replies and a pool
  of sessions for concurrent callers (``client.py``); ``call()`` for one request.
- ``run_worker(endpoint, service, handler)``: serve a service with a plain function or
  generator (``worker.py``); heartbeats keep going while the handler runs.

The broker is ``domo.trio.serve_broker`` or ``domo.asyncio.serve_broker`` (a broker serves many
peers at once, which wants an event loop). The names, arguments and errors are those of
``domo.trio`` and ``domo.asyncio``; every exception derives from ``domo.DomoError``.
"""

from __future__ import annotations

from domo.runtime import (
    Body,
    ClientClosed,
    DomoError,
    Partial,
    RemoteError,
    Reply,
    RequestError,
    RequestTimeout,
)

from .client import Client, ReplyStream, call
from .worker import Handler, run_worker

__all__ = [
    "Body",
    "Client",
    "ClientClosed",
    "DomoError",
    "Handler",
    "Partial",
    "RemoteError",
    "Reply",
    "ReplyStream",
    "RequestError",
    "RequestTimeout",
    "call",
    "run_worker",
]
