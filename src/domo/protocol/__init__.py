"""The sans-IO core of domo: the Majordomo family as deterministic state machines.

Nothing in this package does I/O, reads a clock or draws a random number: time is an argument
(``now``, float seconds, never decreasing), messages are sequences of ``bytes`` frames, and every
machine answers with events and an outbox. ``domo.trio`` drives these machines over ZeroMQ; any
other runtime can do the same.

- ``FamilyBroker`` (``family.py``): the broker of every dialect (MDP/0.2, MDP/0.1,
  majortomo's, REQ clients behind proxies, DCP, eMQP, and one's own) on any number of sockets,
  over the neutral routing core ``Broker`` (``broker.py``), which serves MDP/0.2 on one ROUTER
  by itself; ``CoreCommand`` (``commands.py``) is what they say to each other.
- ``WorkerSession`` (``worker.py``) and ``ClientSession`` (``client.py``): MDP/0.2's two peers.
- ``mdp``: MDP/0.2's wire format; ``events``: what the machines report; ``errors``: what they
  raise; ``dialects`` and ``layers``: the family's codecs and stateful dialects.

The rules they follow are written down, with ids, in ``specs/`` (``mdp-0.2.md``, ``family.md``
and one file per dialect).
"""

from __future__ import annotations

from . import events, mdp
from .broker import Broker, BrokerConfig, PeerState, RequestView, ServiceView, WorkerView
from .client import ClientConfig, ClientSession, ClientState
from .commands import Command, CoreCommand, Role
from .dispatch import RequestState
from .errors import LocalProtocolError, MalformedMessage
from .family import FamilyBroker
from .worker import WorkerConfig, WorkerSession, WorkerState

__all__ = [
    "Broker",
    "BrokerConfig",
    "ClientConfig",
    "ClientSession",
    "ClientState",
    "Command",
    "CoreCommand",
    "FamilyBroker",
    "LocalProtocolError",
    "MalformedMessage",
    "PeerState",
    "RequestState",
    "RequestView",
    "Role",
    "ServiceView",
    "WorkerConfig",
    "WorkerSession",
    "WorkerState",
    "WorkerView",
    "events",
    "mdp",
]
