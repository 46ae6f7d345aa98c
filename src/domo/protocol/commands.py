"""The routing core's neutral commands: what a message of any dialect means, without its frames.

``Role`` (a client's or a worker's side), ``Command`` (register, request, partial, final,
heartbeat, leave: ``design.md`` section 7), ``CoreCommand`` (one command with what it carries,
as ``Broker.command`` takes it) and ``CORE_CODES`` (the core's MDP/0.2 code for each). Kept apart
from ``broker`` and ``dialects`` so that both can import it and neither imports the other for
it. ``domo.protocol.dialects`` re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .mdp import Relayed

__all__ = ["CORE_CODES", "Command", "CoreCommand", "Role"]


class Role(Enum):
    """What a claimed message makes its sender."""

    CLIENT = "client"
    WORKER = "worker"


class Command(Enum):
    """The core's commands by what they do (``design.md`` section 7), whatever a dialect
    calls them or however it frames them."""

    REGISTER = "register"  # a worker offers a service (READY)
    REQUEST = "request"  # a client asks; the broker hands it to a worker
    PARTIAL = "partial"  # part of a reply
    FINAL = "final"  # the last reply (REPLY in MDP/0.1)
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"  # DISCONNECT, either way


@dataclass(frozen=True, slots=True)
class CoreCommand:
    """One message of any dialect as the routing core takes it, without its frames
    (``Broker.command``): who sends it, which command, and what it carries.

    - ``service``: REGISTER's service, a client REQUEST's service.
    - ``address``: a worker's PARTIAL or FINAL: the client it answers (as the broker gave it in
      the REQUEST).
    - ``body``: REQUEST, PARTIAL and FINAL: the frames of the body, relayed as they are.
    """

    role: Role
    command: Command
    service: bytes = b""
    address: bytes = b""
    body: Relayed = ()


# The core's own form of each command, by the side of the peer it comes from or goes to: today
# the routing core speaks MDP/0.2 (``specs/mdp-0.2.md``), so these are RFC 18's codes.
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
