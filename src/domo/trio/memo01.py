"""memo01 (MemoDB's protocol, ``specs/memo01.md``) clients and workers for Trio, over pynng.

For a MemoDB user who wants both ends in Python: ``Memo01Client`` sends JOBs and returns their
RESULTs, ``run_memo01_worker`` serves a set of services. They speak to ``domo broker``'s
``nng+tcp://`` or ``nng+ipc://`` endpoint (give the URL without ``nng+``), or to any memo01
broker, and build and read every message with the same codec the broker uses
(``domo.protocol.dialects.memo01``), so both ends follow one reading of the seed.

Each call and each worker has its own NNG req0 context, as memo01 says: many clients and workers
share one socket. NNG resends a request that got no reply (MEMO-16 makes the broker run an
identical resent JOB once). Needs the ``nng`` extra: ``pip install 'domo[nng]'``.

::

    async with Memo01Client("tcp://127.0.0.1:5556") as client:
        result = await client.call("reverse", b"hello", timeout=5.0)

    async def reverse(service: str, payload: bytes) -> bytes:
        return payload[::-1]

    await run_memo01_worker("tcp://127.0.0.1:5556", ["reverse"], reverse)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self

import pynng
import trio

from domo.protocol.dialects.memo01 import MessageType, encode, parse, service_order
from domo.protocol.errors import DomoError, MalformedMessage

__all__ = ["Memo01Client", "Memo01Error", "Memo01Handler", "run_memo01_worker"]

logger = logging.getLogger("domo.memo01")

Memo01Handler = Callable[[str, bytes], Awaitable[bytes]]


class Memo01Error(DomoError):
    """A memo01 call failed: no RESULT in time, or the broker's reply was not a RESULT."""


class Memo01Client:
    """memo01 JOBs over one NNG req0 socket, one context per call; use ``async with``.

    ``resend``: seconds NNG waits for a reply before it resends the JOB (the broker runs a
    resent JOB once, MEMO-16). ``tls``: a client ``pynng.TLSConfig`` (its own certificate, the
    broker's to trust) for a ``tls+tcp://`` URL: a broker's ``nng+tls+tcp://`` endpoint
    (docs/security.md).
    """

    def __init__(
        self, url: str, *, resend: float = 60.0, tls: pynng.TLSConfig | None = None
    ) -> None:
        self.url = url
        self._resend = resend
        self._tls = tls
        self._socket: pynng.Req0 | None = None

    async def __aenter__(self) -> Self:
        self._socket = pynng.Req0(resend_time=int(self._resend * 1000))
        if self._tls is not None:
            self._socket.tls_config = self._tls
        self._socket.dial(self.url, block=False)  # NNG reconnects until the broker is there
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def call(
        self,
        service: str,
        payload: bytes = b"",
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 - the JOB's own field (MEMO-04), sent on
    ) -> bytes:
        """Send one JOB for ``service`` and return its RESULT's payload.

        ``timeout`` is the JOB's timeout (how long a worker may take once it has the job,
        MEMO-13) and also how long this call waits in all; ``Memo01Error`` if nothing came by
        then (memo01 has no error reply: the broker stays silent, MEMO-18).
        """
        if self._socket is None:
            raise DomoError("Memo01Client is used inside 'async with'")
        job = encode(
            MessageType.JOB, b"", payload, service=service, timeout_ms=max(1, round(timeout * 1000))
        )
        context = self._socket.new_context()
        try:
            with trio.move_on_after(timeout) as waited:
                await context.asend(job)
                data = await context.arecv()
            if waited.cancelled_caught:
                raise Memo01Error(f"no RESULT for {service!r} within {timeout:g} s")
        finally:
            context.close()
        try:
            reply = parse(data, from_broker=True)
        except MalformedMessage as error:
            raise Memo01Error(f"the broker's reply is not memo01: {error}") from None
        if reply.type is not MessageType.RESULT:
            raise Memo01Error(f"expected RESULT, got {reply.type.name}")
        return reply.payload


async def run_memo01_worker(
    url: str,
    services: Sequence[str],
    handler: Memo01Handler,
    *,
    concurrency: int = 1,
    tls: pynng.TLSConfig | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``services`` at the memo01 broker on ``url`` with ``handler`` until cancelled.

    ``handler(service, payload)`` returns the RESULT's payload. ``concurrency`` workers share
    one socket, a context each (each does one job at a time, MEMO-11). A HEARTBEAT is answered
    at once (MEMO-15); after a DISCONNECT (a broker restart, MEMO-10) the worker starts again
    with READY. If the handler raises, the job gets no RESULT: the worker sends DISCONNECT, so
    the broker hands the job to another worker at once (MEMO-08, MDP-D-08) instead of waiting
    for its timeout, and comes back with READY. ``tls``: as ``Memo01Client``'s, for a
    ``tls+tcp://`` URL.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    ready = encode(MessageType.READY, services=tuple(sorted(services, key=service_order)))
    parse(ready)  # the service set is valid (MEMO-03), or this raises now
    with pynng.Req0(resend_time=-1) as socket:  # -1: the broker holds requests; no resend
        if tls is not None:  # a tls+tcp:// URL: the broker's nng+tls+tcp:// endpoint
            socket.tls_config = tls
        socket.dial(url, block=False)
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(_serve, socket, ready, handler)
            task_status.started()


async def _serve(socket: pynng.Req0, ready: bytes, handler: Memo01Handler) -> None:
    context = socket.new_context()
    try:
        request = ready
        while True:
            await context.asend(request)
            try:
                message = parse(await context.arecv(), from_broker=True)
            except MalformedMessage as error:
                logger.warning("memo01 broker sent garbage (%s); starting again", error)
                request = ready
                continue
            if message.type is MessageType.JOB:
                try:
                    result = await handler(message.service, message.payload)
                except Exception:
                    logger.exception("memo01 handler failed for %r; leaving", message.service)
                    request = encode(MessageType.DISCONNECT, message.id)
                    continue
                request = encode(MessageType.RESULT, message.id, result)
            elif message.type is MessageType.HEARTBEAT:
                request = encode(MessageType.HEARTBEAT, message.id)
            else:  # DISCONNECT (or anything unexpected): start again
                request = ready
    finally:
        context.close()
