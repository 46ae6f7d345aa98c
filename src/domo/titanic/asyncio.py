"""``TitanicClient`` for asyncio: durable requests through a ``domo.asyncio.Client``.

::

    async with domo.asyncio.Client("tcp://127.0.0.1:5555") as client:
        titanic = TitanicClient(client)
        request_id = await titanic.submit("echo", b"hello")   # stored: it survives a crash
        ...
        fetched = await titanic.fetch(request_id)             # PENDING, DONE or UNKNOWN
        if fetched.done:
            print(fetched.body)
            await titanic.close(request_id)
"""

from __future__ import annotations

import asyncio

from .client import AsyncRequests, AsyncTitanicClient

__all__ = ["TitanicClient"]


class TitanicClient(AsyncTitanicClient):
    """``AsyncTitanicClient`` on asyncio: ``wait`` sleeps with ``asyncio.sleep``."""

    def __init__(self, client: AsyncRequests) -> None:
        super().__init__(client, sleep=asyncio.sleep)
