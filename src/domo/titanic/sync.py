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

from .client import SyncTitanicClient as TitanicClient

__all__ = ["TitanicClient"]
