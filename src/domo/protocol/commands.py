"""The routing core's neutral commands: what a message of any dialect means, without its frames.

``Role`` (a client's or a worker's side), ``Command`` (register, request, partial, final,
heartbeat, leave: ``design.md`` section 7) and ``CoreCommand``, one command with what it
carries. The same record goes both ways: a dialect's codec decodes a peer's message into one
(``Broker.command`` takes it), and the core's outbox holds one for each message to a dialect
peer, which that peer's codec encodes (``specs/family.md``, FAM-10). ``CORE_CODES`` is MDP/0.2's
code for each, the core's own fast path. Kept apart from ``broker`` and ``dialects`` so that
both can import it and neither imports the other for it; ``domo.protocol.dialects`` re-exports
every name.

A body is a sequence of frames, relayed as they are; it may be empty, and may hold empty frames
(FAM-10): each codec says what its dialect can carry.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, NamedTuple

from .mdp import Relayed

__all__ = ["CORE_CODES", "HEARTBEAT", "LEAVE", "Command", "CoreCommand", "Role"]


class Role(Enum):
    """The side of a peer: the sender of a message the broker takes, or the receiver of one it
    sends."""

    # Members are singletons: hash by identity, in C (they key per-message tables).
    __hash__ = object.__hash__

    CLIENT = "client"
    WORKER = "worker"


class Command(Enum):
    """The core's commands by what they do (``design.md`` section 7), whatever a dialect
    calls them or however it frames them."""

    __hash__ = object.__hash__

    REGISTER = "register"  # a worker offers a service (READY)
    REQUEST = "request"  # a client asks; the broker hands it to a worker
    PARTIAL = "partial"  # part of a reply
    FINAL = "final"  # the last reply (REPLY in MDP/0.1)
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"  # DISCONNECT, either way


class CoreCommand(NamedTuple):
    """One message of any dialect as the routing core takes it or sends it, without frames.

    - ``role``: the side of the peer it comes from (``Broker.command``) or goes to (the core's
      outbox).
    - ``command``: what it does.
    - ``service``: REGISTER's service; a client's REQUEST; a reply to a client (the service it
      asked); a REQUEST to a worker (the service it registered for).
    - ``address``: a worker's PARTIAL or FINAL: the client it answers (as the broker gave it in
      the REQUEST); a REQUEST to a worker: the client's address, to be returned as it came.
    - ``body``: REQUEST, PARTIAL and FINAL: the frames of the body, relayed as they are, any
      number of them (FAM-10).

    A named tuple: made per message on a dialect peer's path, so it must be cheap.
    """

    role: Role
    command: Command
    service: bytes = b""
    address: bytes = b""
    body: Relayed = ()


# What the core sends a worker that carries nothing: one record each, shared.
HEARTBEAT: Final = CoreCommand(Role.WORKER, Command.HEARTBEAT)
LEAVE: Final = CoreCommand(Role.WORKER, Command.LEAVE)

# MDP/0.2's form of each command, by the side of the peer it comes from or goes to: the core's
# own fast path (``specs/mdp-0.2.md``) and the ``mdp02`` codec.
CORE_CODES: dict[tuple[Role, Command], bytes] = {
    (Role.WORKER, Command.REGISTER): b"\x01",
    (Role.WORKER, Command.REQUEST): b"\x02",
    (Role.WORKER, Command.PARTIAL): b"\x03",
    (Role.WORKER, Command.FINAL): b"\x04",
    (Role.WORKER, Command.HEARTBEAT): b"\x05",
    (Role.WORKER, Command.LEAVE): b"\x06",
    (Role.CLIENT, Command.REQUEST): b"\x01",
    (Role.CLIENT, Command.PARTIAL): b"\x02",
    (Role.CLIENT, Command.FINAL): b"\x03",
}
