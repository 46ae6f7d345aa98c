"""The two kinds of error the sans-IO core raises.

A misbehaving *remote* peer never makes the core raise: it produces an event and the state change
the spec asks for. Exceptions are only for the two cases below.
"""

from __future__ import annotations

__all__ = ["DomoError", "LocalProtocolError", "MalformedMessage"]


class DomoError(Exception):
    """The root of every exception domo raises on purpose (``domo.DomoError``)."""


class LocalProtocolError(DomoError):
    """The local application misused the API (for example, sent a FINAL while not busy).

    Raised before any state changes, so the machine is still usable afterwards.
    """


class MalformedMessage(DomoError, ValueError):
    """A multipart message does not follow the wire format of the protocol.

    ``reason`` says in plain words what is wrong with it, and ``rule`` names the rule of
    ``specs/mdp-0.2.md`` that it breaks.
    """

    def __init__(self, reason: str, rule: str = "MDP-W-08") -> None:
        super().__init__(reason)
        self.reason = reason
        self.rule = rule
