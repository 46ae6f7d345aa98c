"""``run_worker``: serve one MDP/0.2 service with an async handler, as a Trio task.

A handler gets the request body (a list of frames) and answers in one of two ways:

- an ``async def`` returning the FINAL body: ``bytes`` (one frame) or a sequence of ``bytes``;
- an ``async def`` generator (or any async iterator): every value it yields is a body; the
  last one is the FINAL and every earlier one a PARTIAL. The runtime learns that a value was not
  the last when the next one is yielded, so each PARTIAL goes out when its successor is ready
  (or the generator ends).
  A generator that yields nothing is a handler error.

Each request's handler runs in its own task, so the session keeps heartbeating while it works
(MDP-H-04), as long as the handler awaits: run blocking or CPU-bound work with
``trio.to_thread.run_sync``, or the whole process (and its heartbeats) stalls.

If the handler raises (or returns something that is not a body), the worker logs the
traceback and answers with an error FINAL that ``domo.trio.Client`` raises as ``RemoteError``;
the worker stays registered (MDP-D-23). If the session gives the request up (broker lost or
DISCONNECT, ``RequestAbandoned``) the handler is cancelled. The worker then reconnects on a new
socket after the session's backoff (MDP-W-17, MDP-D-18).

``concurrency=N`` runs N independent sessions, each with its own socket: N requests at a time.
Cancelling ``run_worker`` sends DISCONNECT on every session (a request in progress is handed
back to the broker, MDP-D-22) and closes the sockets.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeAlias

import trio
import zmq

from domo.protocol import WorkerConfig, WorkerSession, mdp
from domo.protocol.events import RequestAbandoned, RequestReceived, WorkerEvent

from ._pump import SessionPump, log_event
from ._transport import Transport, ZmqTransport
from .errors import error_body

__all__ = ["Body", "Handler", "run_worker"]

logger = logging.getLogger("domo.worker")

Body: TypeAlias = bytes | Sequence[bytes]
Handler: TypeAlias = Callable[[list[bytes]], Awaitable[Body] | AsyncIterator[Body]]


class HandlerError(Exception):
    """A handler broke the handler contract (for example, a generator that yielded nothing)."""


async def run_worker(
    endpoint: str,
    service: str | bytes,
    handler: Handler,
    *,
    concurrency: int = 1,
    config: WorkerConfig | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
    transport: Transport | None = None,
    on_event: Callable[[WorkerEvent], None] | None = None,
    linger: float = 0.5,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` at the broker on ``endpoint`` with ``handler`` until cancelled.

    ``config`` sets heartbeat and reconnection timing (it must match the broker's). ``on_event``
    sees every event of every session. ``context`` (for ``inproc://``) or ``transport`` (for
    ``domo.trio.testing``) replace the default fresh ZeroMQ context.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    name = service.encode("ascii") if isinstance(service, str) else service
    net = transport if transport is not None else ZmqTransport(context)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                session = WorkerSession(name, config)
                serving = _Serving(session, handler, nursery, on_event)
                pump = SessionPump(
                    session,
                    lambda: net.connect(endpoint),
                    serving.on_event,
                    session.disconnect,
                    linger,
                )
                serving.pump = pump
                nursery.start_soon(pump.run)
            task_status.started()
    finally:
        await net.aclose()


class _Serving:
    """Runs the handler for the requests of one session."""

    pump: SessionPump[WorkerEvent]

    def __init__(
        self,
        session: WorkerSession,
        handler: Handler,
        nursery: trio.Nursery,
        on_event: Callable[[WorkerEvent], None] | None,
    ) -> None:
        self.session = session
        self._handler = handler
        self._nursery = nursery
        self._on_event = on_event
        self._scope: trio.CancelScope | None = None

    def on_event(self, event: WorkerEvent) -> None:
        log_event(logger, event)
        if self._on_event is not None:
            self._on_event(event)
        if isinstance(event, RequestReceived):
            self._nursery.start_soon(self._serve, event)
        elif isinstance(event, RequestAbandoned) and self._scope is not None:
            self._scope.cancel()

    async def _serve(self, request: RequestReceived) -> None:
        if self.session.current_request != request.number:
            return  # abandoned before its task started
        with trio.CancelScope() as scope:
            self._scope = scope
            final = await self._answer(request)
            if final is not None and self.session.current_request == request.number:
                self.pump.call(self.session.send_final, final)
        if self._scope is scope:
            self._scope = None

    async def _answer(self, request: RequestReceived) -> mdp.Frames | None:
        """The FINAL body, an error body if the handler failed, None if abandoned."""
        try:
            result = self._handler(list(request.body))
            if not isinstance(result, AsyncIterator):
                return _frames(await result)
            held: mdp.Frames | None = None
            try:
                async for value in result:
                    if held is not None:
                        if self.session.current_request != request.number:
                            return None
                        self.pump.call(self.session.send_partial, held)
                        await self.pump.drained()  # don't queue faster than the socket sends
                    held = _frames(value)
            finally:
                close = getattr(result, "aclose", None)  # an async generator's cleanup, now
                if close is not None:
                    await close()
            if held is None:
                raise HandlerError("the handler's generator yielded nothing")
            return held
        except Exception as error:
            logger.exception("handler for %r failed", self.session.service)
            return tuple(error_body(error))


def _frames(value: object) -> mdp.Frames:
    """A handler's answer as frames; raises if it is not a valid body."""
    return (value,) if isinstance(value, bytes) else mdp.check_body(value)
