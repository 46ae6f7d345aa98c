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

import trio

from .client import AsyncRequests, AsyncTitanicClient

__all__ = ["TitanicClient"]


class TitanicClient(AsyncTitanicClient):
    """``AsyncTitanicClient`` on trio: ``wait`` sleeps with ``trio.sleep``."""

    def __init__(self, client: AsyncRequests) -> None:
        super().__init__(client, sleep=trio.sleep)
