"""``TitanicClient`` for Trio: durable requests through a ``domo.trio.Client``.

::

    async with domo.trio.Client("tcp://127.0.0.1:5555") as client:
        titanic = TitanicClient(client)
        request_id = await titanic.submit("echo", b"hello")   # stored: it survives a crash
        ...
        fetched = await titanic.fetch(request_id)             # PENDING, DONE or UNKNOWN
        if fetched.done:
            print(fetched.body)
            await titanic.close(request_id)
"""

from __future__ import annotations

from domo.trio import Client

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

    async def submit(self, service: str | bytes, *frames: bytes) -> str:
        """Store a request for ``service``; its id once it is on Titanic's disk."""
        return parse_submit(await self.client.request(*_flat(submit_request(service, frames))))

    async def fetch(self, request_id: str | bytes) -> Fetched:
        """The request's reply if there is one yet (``Fetched.state`` says)."""
        return parse_fetch(await self.client.request(*_flat(fetch_request(request_id))))

    async def close(self, request_id: str | bytes) -> None:
        """Forget the request and its reply (nothing happens if it is unknown)."""
        parse_close(await self.client.request(*_flat(close_request(request_id))))


def _flat(request: tuple[bytes, list[bytes]]) -> tuple[bytes, ...]:
    service, frames = request
    return (service, *frames)
