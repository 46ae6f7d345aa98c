"""domo's asyncio runtime: the sans-IO MDP/0.2 core driven over pyzmq on asyncio's
event loop (``_socket.py`` says why not through ``zmq.asyncio``).

- ``Client``: requests with timeouts, retries, streaming replies and up to ``concurrency`` in
  flight; ``async with`` (``client.py``).
- ``run_worker(endpoint, service, handler)``: serve a service with an async handler, until
  cancelled (``worker.py``); its sessions run in a ``TaskGroup``.
- ``serve_broker(*endpoints)``: a broker on one ROUTER, until cancelled (``broker.py``).

The names, arguments and errors are those of ``domo.trio`` and ``domo.sync``; every exception
derives from ``domo.DomoError``. (This package is ``domo.asyncio``; it imports the standard
library's ``asyncio`` by its absolute name, which a package of the same name inside ``domo``
does not shadow.)
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

from .broker import serve_broker
from .client import Client, ReplyStream
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
    "run_worker",
    "serve_broker",
]
