"""``run_worker``: serve one MDP/0.2 service with an async handler, as a Trio task.

The handler contract (also in ``help(run_worker)`` and ``help(Handler)``): a handler gets the
request body (a list of frames, ``list[bytes]``) and answers in one of two ways.

- An ``async def`` returning the FINAL body: ``bytes`` (one frame) or a sequence of ``bytes``.
- An ``async def`` generator (or any async iterator) that yields bodies:

  - ``yield Partial(body)`` sends a PARTIAL at once (a progress report, a chunk of a stream);
  - a plain ``yield body`` is a FINAL if it is the last value, else a PARTIAL. Whether it was
    the last is known only when the next value comes or the generator ends, so a plain value
    leaves when that happens: yield ``Partial`` for anything the client should see right away;
  - the generator must yield at least one plain value or ``Partial``; when it ends, its last
    plain value is the FINAL (if every value was a ``Partial``, the FINAL is empty: ``[]``
    frames is not valid, so it is one empty frame, ``[b""]``).

The handler runs in a task apart from the one that owns the session's socket, so the session
keeps heartbeating while it works (MDP-H-04), as long as the handler awaits: run blocking or
CPU-bound work with ``trio.to_thread.run_sync``, or the whole process (and its heartbeats)
stalls. Each session has one handler task for all its requests (a task per request would cost
more than the rest of a request's handling); each request's handler runs in a fresh copy of
the worker's context, so context variables behave as if it had a task of its own.

If the handler raises (or returns something that is not a body), the worker logs the
traceback and answers with an error FINAL that ``domo.trio.Client`` raises as ``RemoteError``;
the worker stays registered (MDP-D-23). If the session gives the request up (broker lost or
DISCONNECT, ``RequestAbandoned``) the handler is cancelled. The worker then reconnects on a new
socket after the session's backoff (MDP-W-17, MDP-D-18).

``concurrency=N`` runs N independent sessions, each with its own socket: N requests at a time.
Cancelling ``run_worker`` sends DISCONNECT on every session (a request in progress is handed
back to the broker, MDP-D-22) and closes the sockets.

``examples/progress_worker.py`` is a runnable worker that streams PARTIALs this way.
"""

from __future__ import annotations

import contextvars
import logging
import math
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar, cast

import trio
import zmq

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import WorkerConfig, WorkerSession, mdp
from domo.protocol.events import RequestAbandoned, RequestReceived, WorkerEvent
from domo.runtime.handlers import Body, HandlerError, Partial
from domo.runtime.handlers import as_frames as _frames

from ._pump import SessionPump, log_event
from ._transport import Connection, Transport, ZmqTransport
from .errors import error_body

__all__ = ["Body", "Handler", "Partial", "WorkerConfig", "run_worker"]

logger = logging.getLogger("domo.worker")

T = TypeVar("T")


class Handler(Protocol):
    """What ``run_worker`` calls for each request: ``handler(body) -> reply``.

    ``body`` is the request's frames (``list[bytes]``). The handler is either an ``async def``
    returning the FINAL body (``bytes`` or a sequence of ``bytes``), or an ``async def``
    generator: each ``yield Partial(body)`` is sent as a PARTIAL at once; a plain ``yield body``
    is the FINAL if it is the last value, else a PARTIAL sent when the next value comes. A
    handler that raises is answered with an error FINAL (``RemoteError`` at the client) and the
    worker keeps serving. See ``domo.trio.worker``'s docstring and ``examples/progress_worker.py``.
    """

    def __call__(
        self, body: list[bytes], /
    ) -> Awaitable[Body] | AsyncIterator[Body] | AsyncIterator[Body | Partial]: ...


async def run_worker(
    endpoint: str | Sequence[str],
    service: str | bytes,
    handler: Handler,
    *,
    concurrency: int = 1,
    config: WorkerConfig | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
    transport: Transport | None = None,
    on_event: Callable[[WorkerEvent], None] | None = None,
    on_broker_heard: Callable[[], None] | None = None,
    linger: float = 0.5,
    curve: CurveClient | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``service`` at the broker on ``endpoint`` with ``handler`` until cancelled.

    ``endpoint`` may be several brokers' endpoints: each session connects to the first, and to
    the next each time it gives a connection up (the broker silent for ``liveness`` heartbeat
    intervals, or a DISCONNECT from it), round the list (failover, MDP-D-28).

    ``handler(body)`` gets each request's frames (``list[bytes]``) and answers either by
    returning the FINAL body (``bytes`` or a sequence of ``bytes``) from an ``async def``, or
    from an ``async def`` generator: ``yield Partial(body)`` sends a PARTIAL at once, and the
    last plain ``yield body`` is the FINAL (an earlier plain value goes out as a PARTIAL when the
    next one comes). If it raises, the client gets an error reply (``RemoteError``) and the
    worker keeps serving. Blocking work belongs in ``trio.to_thread.run_sync`` so heartbeats go
    on. A runnable example: ``examples/progress_worker.py``.

    Use ``nursery.start(run_worker, ...)``: it returns once the sessions are started (not yet
    registered: the broker may be down; the worker connects and retries until it answers).

    ``config`` (a ``WorkerConfig``) sets heartbeat and reconnection timing (it must match the
    broker's). ``concurrency`` is how many requests run at once, one session each. ``on_event``
    sees every event of every session. ``on_broker_heard`` is called when a session hears from
    the broker for the first time on a new socket (its first HEARTBEAT or request): until then
    nothing shows the broker is there, since READY gets no answer. ``context`` (for
    ``inproc://``) or ``transport`` (for ``domo.trio.testing``) replace the default fresh ZeroMQ
    context. ``curve`` (``domo.curve.CurveClient``: the broker's public key and this worker's
    key pair) encrypts the connection to a broker that requires CURVE (docs/security.md).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    name = service.encode("ascii") if isinstance(service, str) else service
    net = transport if transport is not None else ZmqTransport(context, curve=curve)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                session = WorkerSession(name, config)
                serving = _Serving(session, handler, on_event)
                ring = EndpointRing(endpoint)  # each session moves on by itself (MDP-D-28)
                pump = SessionPump(
                    session,
                    partial(_connect_next, net, ring),
                    serving.on_event,
                    session.disconnect,
                    linger,
                    on_broker_heard,
                )
                serving.pump = pump
                nursery.start_soon(serving.run)
                nursery.start_soon(pump.run)
            task_status.started()
    finally:
        await net.aclose()


def _connect_next(net: Transport, ring: EndpointRing) -> Connection[bytes]:
    return net.connect(ring.next())


class _Serving:
    """Runs the handler for the requests of one session, one after another, in one task.

    The pump hands each request over through a memory channel: a task that waits there costs
    less than a task spawned per request. A handler that the session gives up is cancelled
    through the cancel scope around the loop, which is then entered anew.
    """

    pump: SessionPump[WorkerEvent]

    def __init__(
        self,
        session: WorkerSession,
        handler: Handler,
        on_event: Callable[[WorkerEvent], None] | None,
    ) -> None:
        self.session = session
        self._handler = handler
        self._on_event = on_event
        self._send, self._requests = trio.open_memory_channel[RequestReceived](math.inf)
        self._scope = trio.CancelScope()
        self._busy = False  # the handler is running

    def on_event(self, event: WorkerEvent) -> None:
        log_event(logger, event)
        if self._on_event is not None:
            self._on_event(event)
        if isinstance(event, RequestReceived):
            self._send.send_nowait(event)
        elif isinstance(event, RequestAbandoned) and self._busy:
            self._scope.cancel()

    async def run(self) -> None:
        """Serve requests until cancelled with the worker."""
        while True:
            with trio.CancelScope() as self._scope:
                while True:
                    request = await self._requests.receive()
                    if self.session.current_request != request.number:
                        continue  # abandoned before its turn came
                    self._busy = True
                    try:
                        final = await self._answer(request)
                    finally:
                        self._busy = False
                    if final is not None:
                        self.pump.catch_up()  # the loop may have been held up meanwhile
                        if self.session.current_request == request.number:
                            self.pump.call(self.session.send_final, final)

    async def _answer(self, request: RequestReceived) -> mdp.Frames | None:
        """The FINAL body, an error body if the handler failed, None if abandoned.

        The handler runs in a copy of the worker's context, fresh for each request, as it
        would in a task of its own: a context variable one request sets is not seen by the next.
        """
        context = contextvars.copy_context()
        try:
            result = context.run(self._handler, list(request.body))
            # A coroutine is told apart first: the AsyncIterator ABC's isinstance is slow.
            if type(result) is types.CoroutineType or not isinstance(result, AsyncIterator):
                return _frames(await _in_context(context, result))
            held: mdp.Frames | None = None
            yielded = False
            try:
                while True:
                    try:
                        value = await _in_context(context, result.__anext__())
                    except StopAsyncIteration:
                        break
                    yielded = True
                    if held is not None:
                        # A value came after it: the held one was not the FINAL.
                        if not await self._send_partial(request, held):
                            return None
                        held = None
                    if isinstance(value, Partial):
                        if not await self._send_partial(request, _frames(value.body)):
                            return None
                    else:
                        held = _frames(value)
            finally:
                close = getattr(result, "aclose", None)  # an async generator's cleanup, now
                if close is not None:
                    await _in_context(context, close())
            if not yielded:
                raise HandlerError("the handler's generator yielded nothing")
            return held if held is not None else (b"",)
        except Exception as error:
            logger.exception("handler for %r failed", self.session.service)
            return tuple(error_body(error))

    async def _send_partial(self, request: RequestReceived, frames: mdp.Frames) -> bool:
        """Send a PARTIAL for ``request``; False if the session gave the request up."""
        self.pump.catch_up()  # the loop may have been held up meanwhile
        if self.session.current_request != request.number:
            return False
        self.pump.call(self.session.send_partial, frames)
        await self.pump.drained()  # don't queue faster than the socket sends
        return True


@types.coroutine
def _in_context(context: contextvars.Context, awaitable: Awaitable[T]) -> Generator[Any, Any, T]:
    """Await ``awaitable`` in the calling task, with each of its steps run in ``context``.

    What the awaitable yields (Trio's traps) passes up to the task unchanged, and what the task
    is sent or thrown (a result, ``Cancelled``) passes down, as with ``await``.
    """
    steps = awaitable.__await__()
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            if error is None:
                yielded = context.run(steps.send, value)
            else:
                yielded = context.run(steps.throw, error)
        except StopIteration as done:
            return cast(T, done.value)
        try:
            value, error = (yield yielded), None
        except GeneratorExit:
            context.run(steps.close)  # its cleanup runs in its context too
            raise
        except BaseException as exc:
            value, error = None, exc
