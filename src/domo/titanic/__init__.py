"""Titanic (9/TSP, ZeroMQ RFC 9): durable requests through a Majordomo broker.

A client hands a request to the Titanic service, which stores it on disk and answers with its
id; Titanic sends it to its service when a worker is there, stores the reply, and the client
fetches it later, even after the broker, the worker, Titanic or the client itself restarted.

- ``protocol``: the service's logic, a sans-IO machine (no I/O, no clock, no ids drawn);
- ``store``: ``Store``, the storage interface, and ``SqliteStore`` (SQLite, WAL);
- ``server``: ``serve_titanic``, the service on Trio (``domo titanic`` runs it);
- ``client``: the client side, runtime-neutral; ``domo.titanic.trio``, ``.asyncio`` and
  ``.sync`` each give a ``TitanicClient`` over that runtime's ``Client``.

The rules are in ``specs/tsp.md``; the tutorial is docs/tutorials/durable-requests.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .protocol import TitanicConfig, TitanicMachine

if TYPE_CHECKING:
    from .client import Fetched, FetchState, TitanicError

__all__ = ["FetchState", "Fetched", "TitanicConfig", "TitanicError", "TitanicMachine"]


def __getattr__(name: str) -> Any:
    # The client side is loaded when asked for: importing the pure machine loads nothing of
    # domo.runtime (whose logging brings threads along).
    if name in ("FetchState", "Fetched", "TitanicError"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'domo.titanic' has no attribute {name!r}")
