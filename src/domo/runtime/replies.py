"""What a client runtime does with its session's events, whatever its event loop.

``Reply`` is one reply handed to a reader; ``final_body`` turns the event that ended a request
into the FINAL body or the exception the caller gets; ``service_name`` is the one spelling of a
service argument (``str`` or ``bytes``); ``REPLY_EVENTS`` are the events a request's reader takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from domo.protocol.events import ClientEvent, FinalReceived, PartialReceived, RequestFailed

from .errors import ClientClosed, RemoteError, RequestTimeout, parse_error_body

__all__ = ["REPLY_EVENTS", "Reply", "final_body", "service_name"]

REPLY_EVENTS = (PartialReceived, FinalReceived, RequestFailed)  # what a request's reader gets


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply to a request: a PARTIAL (``final`` false) or the FINAL."""

    body: list[bytes]
    final: bool


def service_name(service: str | bytes) -> bytes:
    """A service argument as the bytes on the wire (a ``str`` must be ASCII)."""
    return service.encode("ascii") if isinstance(service, str) else service


def final_body(service: bytes, event: ClientEvent) -> list[bytes]:
    """The body of the FINAL that ended a request, or raise the error that ended it instead."""
    if isinstance(event, RequestFailed):
        if event.reason == "cancelled":
            raise ClientClosed("the client was closed")
        raise RequestTimeout(service, event.attempts, event.reason)
    assert isinstance(event, FinalReceived)
    body = list(event.body)
    error = parse_error_body(body)
    if error is not None:
        raise RemoteError(service, event.attempt, *error)
    return body
