"""domo's Trio runtime: the sans-IO MDP/0.2 core driven over ZeroMQ (pyzmq) with Trio.

- ``serve_broker(*endpoints)``: a broker on one ROUTER (``broker.py``); ``Drain`` to stop it
  without losing what is in flight (``_drain.py``, MDP-D-34).
- ``Client``: requests, with timeouts, retries and streaming replies (``client.py``);
  ``call()`` for synchronous scripts.
- ``run_worker(endpoint, service, handler)``: serve a service with an async handler
  (``worker.py``; ``help(run_worker)`` has the handler contract), with ``WorkerConfig`` for its
  timing and ``Partial`` for replies streamed from a generator.
- ``errors``: ``DomoError`` and its subclasses; the handler-error reply convention (MDP-D-23).
- ``Transport`` / ``ZmqTransport``: the seam that ``domo.trio.testing.FakeNetwork`` replaces;
  its ``Connection`` (``wait``, ``receive``, ``send`` -> ``SENT``/``EAGAIN``/``EHOSTUNREACH``)
  also serves hand-framed peers.

Every protocol decision is the core's (``domo.protocol``); this layer moves frames between
sockets and the machines and sleeps until the next socket event or the core's next deadline
(``_pump.py``).
"""

from __future__ import annotations

from ._drain import Drain
from ._transport import EAGAIN, EHOSTUNREACH, SENT, Connection, Transport, ZmqTransport
from .broker import serve_broker
from .client import Client, Reply, ReplyStream, call
from .errors import (
    ClientClosed,
    DomoError,
    RemoteError,
    RequestError,
    RequestTimeout,
)
from .worker import Body, Handler, Partial, WorkerConfig, run_worker

__all__ = [
    "EAGAIN",
    "EHOSTUNREACH",
    "SENT",
    "Body",
    "Client",
    "ClientClosed",
    "Connection",
    "DomoError",
    "Drain",
    "Handler",
    "Partial",
    "RemoteError",
    "Reply",
    "ReplyStream",
    "RequestError",
    "RequestTimeout",
    "Transport",
    "WorkerConfig",
    "ZmqTransport",
    "call",
    "run_worker",
    "serve_broker",
]
