"""``TitanicClient`` for blocking code: durable requests through a ``domo.sync.Client``.

::

    with domo.sync.Client("tcp://127.0.0.1:5555") as client:
        titanic = TitanicClient(client)
        request_id = titanic.submit("echo", b"hello")   # stored: it survives a crash
        ...
        fetched = titanic.fetch(request_id)             # PENDING, DONE or UNKNOWN
        if fetched.done:
            print(fetched.body)
            titanic.close(request_id)
"""

from __future__ import annotations

from domo.sync import Client

from .client import (
    Fetched,
    close_request,
    fetch_request,
    parse_close,
    parse_fetch,
    parse_submit,
    submit_request,
)

__all__ = ["TitanicClient"]


class TitanicClient:
    """Submit now, fetch later: 9/TSP over ``client`` (its timeouts and retries apply)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def submit(self, service: str | bytes, *frames: bytes) -> str:
        """Store a request for ``service``; its id once it is on Titanic's disk."""
        return parse_submit(self.client.request(*_flat(submit_request(service, frames))))

    def fetch(self, request_id: str | bytes) -> Fetched:
        """The request's reply if there is one yet (``Fetched.state`` says)."""
        return parse_fetch(self.client.request(*_flat(fetch_request(request_id))))

    def close(self, request_id: str | bytes) -> None:
        """Forget the request and its reply (nothing happens if it is unknown)."""
        parse_close(self.client.request(*_flat(close_request(request_id))))


def _flat(request: tuple[bytes, list[bytes]]) -> tuple[bytes, ...]:
    service, frames = request
    return (service, *frames)
