"""``run_worker``: serve one MDP/0.2 service with an async handler, as an asyncio task.

A handler gets the request body (a list of frames) and answers in one of two ways:

- an ``async def`` returning the FINAL body: ``bytes`` (one frame) or a sequence of ``bytes``;
- an ``async def`` generator: every value it yields is a body; the last one is the FINAL and every
  earlier one a PARTIAL (each PARTIAL goes out when its successor is ready). A generator that
  yields nothing is a handler error.

Each session has two tasks in a ``TaskGroup``: one owns the socket (it awaits the next message,
bounded by the session's deadline, so heartbeats go out while the handler works, MDP-H-04), the
other runs the handler for one request after another and sends the reply itself. Run blocking
work with ``asyncio.to_thread``, or the loop (and the heartbeats) stalls. If the handler raises,
the worker answers with an error FINAL (MDP-D-23) and stays registered. If the session gives the
request up (broker lost, DISCONNECT), the handler is cancelled; the worker reconnects after the
session's backoff (MDP-W-17, MDP-D-18).

``concurrency=N`` runs N sessions, each with its own socket. Cancelling ``run_worker`` sends
DISCONNECT on every session (a request in progress goes back to the broker, MDP-D-22) and closes
the sockets.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import zmq

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import WorkerConfig, WorkerSession, mdp
from domo.protocol.events import (
    ReconnectRequired,
    RequestAbandoned,
    RequestReceived,
    WorkerEvent,
)
from domo.runtime import (
    SENT,
    Body,
    HandlerError,
    Partial,
    as_frames,
    error_body,
    log_event,
    service_name,
)
from domo.runtime.liveness import receive_waiting

from ._socket import AsyncConnection

__all__ = ["Body", "Handler", "Partial", "run_worker"]

logger = logging.getLogger("domo.worker")

Handler: TypeAlias = Callable[
    [list[bytes]], Awaitable[Body] | AsyncIterator[Body] | AsyncIterator[Body | Partial]
]
BATCH = 256


async def run_worker(
    endpoint: str | Sequence[str],
    service: str | bytes,
    handler: Handler,
    *,
    concurrency: int = 1,
    config: WorkerConfig | None = None,
    context: zmq.Context[Any] | None = None,
    on_event: Callable[[WorkerEvent], None] | None = None,
    on_broker_heard: Callable[[], None] | None = None,
    linger: float = 0.5,
    curve: CurveClient | None = None,
) -> None:
    """Serve ``service`` at the broker on ``endpoint`` with ``handler`` until cancelled.

    ``config`` sets heartbeat and reconnection timing (it must match the broker's). ``on_event``
    sees every event of every session; ``on_broker_heard`` is called when a session first hears
    from the broker on a new socket (READY gets no answer: until then nothing shows the broker
    is there). A generator handler's ``yield Partial(body)`` is sent at once
    (``domo.runtime.handlers``). ``context`` (for ``inproc://``) replaces the fresh
    ``zmq.Context`` made (and terminated) here (a ``zmq.asyncio.Context`` will do too).
    ``curve`` (``domo.curve.CurveClient``) encrypts the connection to a CURVE broker.
    ``endpoint`` may be several brokers' endpoints, in failover order (MDP-D-28). Each session moves
    to the next when it gives a connection up (the broker silent for ``liveness`` intervals, or its
    DISCONNECT).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    name = service_name(service)
    ctx: zmq.Context[Any] = zmq.Context() if context is None else context
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                serving = _Serving(
                    WorkerSession(name, config),
                    ctx,
                    endpoint,
                    handler,
                    on_event,
                    on_broker_heard,
                    curve,
                )
                group.create_task(serving.run(linger))
    finally:
        if context is None:
            ctx.term()


class _Serving:
    """One session: the task that owns its socket and the task that runs its handler."""

    def __init__(
        self,
        session: WorkerSession,
        context: zmq.Context[Any],
        endpoint: str | Sequence[str],
        handler: Handler,
        on_event: Callable[[WorkerEvent], None] | None,
        on_broker_heard: Callable[[], None] | None = None,
        curve: CurveClient | None = None,
    ) -> None:
        self.session = session
        self._on_broker_heard = on_broker_heard
        self._heard = False  # a message arrived on the current socket
        self._context = context
        self._endpoints = EndpointRing(endpoint)
        self._handler = handler
        self._on_event = on_event
        self._socket: AsyncConnection | None = None
        self.curve = curve  # CURVE settings for each new socket
        self._reconnect_at: float | None = -math.inf
        self._unsent: deque[tuple[bytes, ...]] = deque()
        self._requests: asyncio.Queue[RequestReceived] = asyncio.Queue()
        self._handler_task: asyncio.Task[None] | None = None
        self._busy = False
        self._loop = asyncio.get_running_loop()

    async def run(self, linger: float) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self._handler_task = group.create_task(self._serve())
                await self._pump()
        finally:
            try:
                self._handle(self.session.disconnect(self._now()))
            finally:
                if self._socket is not None:
                    self._close(linger)

    def _now(self) -> float:
        return max(self._loop.time(), self.session.now)

    async def _pump(self) -> None:
        while True:
            if self._reconnect_at is not None:
                delay = self._reconnect_at - self._loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                self._reconnect_at = None
                self._socket = AsyncConnection(self._context, zmq.DEALER)
                if self.curve is not None:
                    self.curve.apply(self._socket.socket)
                self._socket.socket.connect(self._endpoints.next())  # failover: MDP-D-28
                self._heard = False
                self._handle(self.session.connected(self._now()))
            socket = self._socket
            assert socket is not None
            full = not self._flush(socket)
            await socket.wait(self.session.next_deadline(), writable=full)
            if self._socket is not socket:
                continue  # the handler task's reply made the session give the socket up
            now = self._now()
            messages = socket.receive(BATCH)
            if messages and not self._heard:
                self._heard = True
                if self._on_broker_heard is not None:
                    self._on_broker_heard()
            session = self.session
            for message in messages:  # heard in time, even if the loop woke late
                self._handle(receive_waiting(session, message, now))
            if session.now != now:  # nothing was read, or a late batch: fire what is due now
                self._handle(session.tick(now))
            self._flush(socket)
            if self._reconnecting():
                self._close(0.0)

    def _reconnecting(self) -> bool:
        """The session has given its socket up (an event just handled said so)."""
        return self._reconnect_at is not None

    def _handle(self, events: list[WorkerEvent]) -> None:
        for event in events:
            if isinstance(event, ReconnectRequired):
                self._reconnect_at = event.reconnect_at
            elif isinstance(event, RequestReceived):
                self._requests.put_nowait(event)
            elif isinstance(event, RequestAbandoned) and self._busy:
                assert self._handler_task is not None
                self._handler_task.cancel()  # the handler's request is given up
            log_event(logger, event)
            if self._on_event is not None:
                self._on_event(event)

    def _flush(self, socket: AsyncConnection) -> bool:
        unsent = self._unsent
        unsent.extend(self.session.take_outgoing())
        while unsent:
            if socket.send(unsent[0]) != SENT:
                return False
            unsent.popleft()
        return True

    def _close(self, linger: float) -> None:
        socket, self._socket = self._socket, None
        assert socket is not None
        self._unsent.extend(self.session.take_outgoing())
        last_words = bool(self._unsent)
        try:
            self._flush(socket)
        finally:
            self._unsent.clear()
            socket.close(linger if last_words else 0.0)

    def _reply(self, number: int, method: Callable[..., list[WorkerEvent]], body: Any) -> bool:
        """Queue a PARTIAL or the FINAL and send it; False if the request was given up."""
        if self.session.current_request != number:
            return False
        now = self._now()
        socket = self._socket
        expires = self.session.broker_expires_at
        if expires is not None and now >= expires and socket is not None:
            # The loop was held up past the broker's expiry (a handler that blocked it): what
            # waits in the socket was heard in time (runtime.liveness); read it first.
            for message in socket.receive(BATCH):
                self._handle(receive_waiting(self.session, message, now))
            if self.session.current_request != number:
                return False
        self._handle(method(body, now))
        socket = self._socket
        if socket is not None:
            if not self._flush(socket):
                socket.wake()  # the pump waits for room (POLLOUT) on its next turn
            elif self._reconnecting():
                self._close(0.0)
        return True

    async def _serve(self) -> None:
        """Run the handler for each request in turn; a given-up request's handler is cancelled."""
        while True:
            request = await self._requests.get()
            if self.session.current_request != request.number:
                continue
            self._busy = True
            try:
                final = await self._answer(request)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                assert task is not None
                if self.session.current_request == request.number or not task.uncancel() == 0:
                    raise  # the worker is being cancelled, not just this request
                continue
            finally:
                self._busy = False
            self._reply(request.number, self.session.send_final, final)

    async def _answer(self, request: RequestReceived) -> mdp.Frames:
        try:
            result = self._handler(list(request.body))
            if not isinstance(result, AsyncIterator):
                return as_frames(await result)
            held: mdp.Frames | None = None
            yielded = False
            try:
                async for value in result:
                    yielded = True
                    if held is not None and not self._reply(
                        request.number, self.session.send_partial, held
                    ):
                        raise asyncio.CancelledError
                    held = None
                    if isinstance(value, Partial):  # sent at once, not held
                        if not self._reply(
                            request.number, self.session.send_partial, as_frames(value.body)
                        ):
                            raise asyncio.CancelledError
                    else:
                        held = as_frames(value)
            finally:
                close = getattr(result, "aclose", None)
                if close is not None:
                    await close()
            if not yielded:
                raise HandlerError("the handler's generator yielded nothing")
            return held if held is not None else (b"",)
        except Exception as error:
            logger.exception("handler for %r failed", self.session.service)
            return tuple(error_body(error))
