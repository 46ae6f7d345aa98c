"""The sans-IO core of domo: MDP/0.2 as deterministic state machines.

Nothing in this package does I/O, reads a clock or draws a random number: time is an argument
(``now``, float seconds, never decreasing), messages are sequences of ``bytes`` frames, and every
machine answers with events and an outbox. ``domo.trio`` drives these machines over ZeroMQ; any
other runtime can do the same.

- ``Broker`` (``broker.py``): clients and workers on one ROUTER.
- ``WorkerSession`` (``worker.py``) and ``ClientSession`` (``client.py``): the two peers.
- ``mdp``: the wire format; ``events``: what the machines report; ``errors``: what they raise.

The rules they follow are written down, with ids, in ``specs/mdp-0.2.md``.
"""

from __future__ import annotations

from . import events, mdp
from .broker import Broker, BrokerConfig, PeerState, RequestView, ServiceView, WorkerView
from .client import ClientConfig, ClientSession, ClientState
from .dispatch import RequestState
from .errors import LocalProtocolError, MalformedMessage
from .worker import WorkerConfig, WorkerSession, WorkerState

__all__ = [
    "Broker",
    "BrokerConfig",
    "ClientConfig",
    "ClientSession",
    "ClientState",
    "LocalProtocolError",
    "MalformedMessage",
    "PeerState",
    "RequestState",
    "RequestView",
    "ServiceView",
    "WorkerConfig",
    "WorkerSession",
    "WorkerState",
    "WorkerView",
    "events",
    "mdp",
]
