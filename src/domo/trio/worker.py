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

Each session has one task that owns its socket and runs its handler: it waits on the socket,
reads a REQUEST, runs the handler for it in place and sends the FINAL itself, so a request costs
one wake-up of one task (a second task, handed each request, measured a third more CPU per
request). While the handler awaits, the session's timer task (which sleeps until the session's
next deadline, and otherwise only wakes the socket's task to tick) reads what the broker sent,
ticks the session and sends its heartbeats, so the session keeps heartbeating however long the
handler works (MDP-H-04), as long as it awaits: run blocking or CPU-bound work with
``trio.to_thread.run_sync``, or the whole process (and its heartbeats) stalls. Each request's
handler runs in a fresh copy of the worker's context, so context variables behave as if it had
a task of its own.

If the handler raises (or returns something that is not a body), the worker logs the
traceback and answers with an error FINAL that ``domo.trio.Client`` raises as ``RemoteError``;
the worker stays registered (MDP-D-23). If the session gives the request up (broker lost or
DISCONNECT, ``RequestAbandoned``: seen by the timer while the handler runs, so at its next
deadline at the latest) the handler is cancelled. The worker then reconnects on a new
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
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar, cast

import trio
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
from domo.runtime.handlers import Body, HandlerError, Partial
from domo.runtime.handlers import as_frames as _frames
from domo.runtime.liveness import receive_waiting

from ._pump import BATCH, log_event
from ._transport import SENT, Connection, Transport, ZmqTransport
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
                ring = EndpointRing(endpoint)  # each session moves on by itself (MDP-D-28)
                serving = _Serving(
                    WorkerSession(name, config),
                    partial(_connect_next, net, ring),
                    handler,
                    on_event,
                    linger,
                    on_broker_heard,
                )
                nursery.start_soon(serving.run)
                nursery.start_soon(serving.time)
            task_status.started()
    finally:
        await net.aclose()


def _connect_next(net: Transport, ring: EndpointRing) -> Connection[bytes]:
    return net.connect(ring.next())


class _Serving:
    """One session: the task that owns its socket and runs its handler, and its timer task.

    ``run`` waits on the socket (with no deadline: the timer keeps the session's) until a
    REQUEST comes, runs the handler in place and sends its FINAL. ``time`` sleeps until the
    session's next deadline; then, if ``run`` waits on the socket, it wakes it (``run`` ticks
    the session itself); if ``run`` is in a handler, it reads the socket, ticks the session and
    sends what it queued itself: the two never use the socket at once (one runs only while the
    other is suspended, and the timer never waits on the socket). A request the session gives
    up cancels ``run``'s scope, and with it the handler.
    """

    def __init__(
        self,
        session: WorkerSession,
        open_connection: Callable[[], Connection[bytes]],
        handler: Handler,
        on_event: Callable[[WorkerEvent], None] | None,
        linger: float,
        on_heard: Callable[[], None] | None,
    ) -> None:
        self.session = session
        self._open = open_connection
        self._handler = handler
        self._on_event = on_event
        self._linger = linger
        self._on_heard = on_heard
        self.heard = False  # a message arrived on the current socket
        self._conn: Connection[bytes] | None = None
        self._pending: deque[tuple[bytes, ...]] = deque()  # taken from the outbox, not sent
        self._reconnect_at: float | None = -math.inf  # None: keep this socket
        self._requests: deque[RequestReceived] = deque()
        self._scope: trio.CancelScope | None = None  # ``run``'s, while it owns a socket
        self._waiting: trio.CancelScope | None = None  # ``run``'s wait on the socket, in it
        self._busy = False  # ``run`` is in a handler
        self._connected = trio.Event()  # set while the session has a socket

    # -- the socket's task ---------------------------------------------------------------------

    async def run(self) -> None:
        """Own the socket and serve requests until cancelled; then DISCONNECT and close."""
        try:
            while True:
                if self._reconnect_at is not None:
                    await trio.sleep_until(self._reconnect_at)
                    self._reconnect_at = None
                    self._conn = self._open()
                    self.heard = False
                    self._connected.set()
                    self._handle(self.session.connected(trio.current_time()))
                assert self._conn is not None
                with trio.CancelScope() as scope:  # cancelled to end a handler given up
                    self._scope = scope
                    await self._serve_socket(self._conn)
                self._scope = None
                if self._given_up():
                    self._close()  # (a handler may have been ended for it)
        finally:
            self._scope = None
            try:
                self._handle(self.session.disconnect(trio.current_time()))
            finally:
                # Whatever a hook raised, the socket closes: an open one blocks its context's
                # termination forever.
                if self._conn is not None:
                    self._close()
                self._connected.set()  # the timer's wait ends

    def _given_up(self) -> bool:
        """The session has given up the socket it still has."""
        return self._reconnect_at is not None and self._conn is not None

    async def _serve_socket(self, conn: Connection[bytes]) -> None:
        """Until the session gives ``conn`` up or the scope is cancelled."""
        while True:
            self._step(conn)
            while self._requests and self._reconnect_at is None:
                await self._serve(conn, self._requests.popleft())
            if self._reconnect_at is not None:
                return  # ``run`` closes the socket
            # A scope of its own, which the timer cancels to wake the wait: cancelling one that
            # outlives the wait could end a handler that a message woke this task for, in the
            # same turn (the cancellation would be delivered at the handler's first await).
            with trio.CancelScope() as waiting:
                self._waiting = waiting
                try:
                    await conn.wait(bool(self._pending))
                finally:
                    self._waiting = None

    async def _serve(self, conn: Connection[bytes], request: RequestReceived) -> None:
        """Run the handler for ``request`` here and send its FINAL (unless given up)."""
        number = request.number
        if self.session.current_request != number:
            return  # abandoned before its turn came
        self._busy = True
        try:
            final = await self._answer(request)
        finally:
            self._busy = False
        now = trio.current_time()
        expires = self.session.broker_expires_at
        if expires is not None and now >= expires:
            # The loop was held up past the broker's expiry (a handler that blocked it): what
            # waits in the socket was heard in time (runtime.liveness); read it first.
            for message in conn.receive(BATCH):
                self._handle(receive_waiting(self.session, message, now))
        if final is not None and self.session.current_request == number:
            self._handle(self.session.send_final(final, now))
            self._flush(conn)

    def _step(self, conn: Connection[bytes]) -> None:
        """Read what is ready, tick the session, send what it queued."""
        now = trio.current_time()
        session = self.session
        messages = conn.receive(BATCH)
        if messages and not self.heard:
            self.heard = True
            if self._on_heard is not None:
                self._on_heard()
        for message in messages:  # heard in time, even if this task woke late
            self._handle(receive_waiting(session, message, now))
        if session.now != now:  # nothing was read, or a late batch: fire what is due now
            self._handle(session.tick(now))
        self._flush(conn)

    def _handle(self, events: list[WorkerEvent]) -> None:
        for event in events:
            if isinstance(event, ReconnectRequired):
                self._reconnect_at = event.reconnect_at
                self._connected = trio.Event()
                self._pending.clear()  # they belonged to the socket being given up
            elif isinstance(event, RequestReceived):
                self._requests.append(event)
            elif isinstance(event, RequestAbandoned) and self._busy and self._scope is not None:
                self._scope.cancel()  # the handler's request is given up: it ends
            log_event(logger, event)
            if self._on_event is not None:
                self._on_event(event)

    def _flush(self, conn: Connection[bytes]) -> bool:
        """Send the session's outbox; False if the pipe is full (EAGAIN): the rest waits."""
        pending = self._pending
        pending.extend(self.session.take_outgoing())
        while pending:
            if conn.send(pending[0]) != SENT:
                return False  # kept for when there is room (a DEALER has a single pipe)
            pending.popleft()
        return True

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        assert conn is not None
        self._pending.extend(self.session.take_outgoing())
        last_words = bool(self._pending)  # a DISCONNECT, say, that must still go out
        try:
            self._flush(conn)
        finally:
            self._pending.clear()
            # Without last words, linger 0: stale messages of a socket given up must not reach
            # a broker that comes back while the socket lingers (it would register a dead one).
            conn.close(self._linger if last_words else 0.0)

    # -- the timer's task ----------------------------------------------------------------------

    async def time(self) -> None:
        """Until cancelled: at each of the session's deadlines, wake ``run`` or stand in for it.

        The deadline only moves later (the last message sent and heard only move on), so a
        sleep until the one read last is never late; an early wake-up finds nothing due.
        """
        while True:
            conn = self._conn
            deadline = self.session.next_deadline()
            if conn is None or deadline is None:
                await self._connected.wait()  # reconnecting (or closed: set for good)
                if self._conn is None:
                    await trio.sleep_forever()
                continue
            await trio.sleep_until(deadline)
            if self._conn is not conn:
                continue
            if self._waiting is not None:
                self._waiting.cancel()  # ``run`` wakes, ticks and waits again
            elif self._busy:
                self._step(conn)  # the handler runs: heartbeats both ways go on here
                if self._reconnect_at is not None and self._scope is not None:
                    self._scope.cancel()  # the socket is given up: ``run`` ends the handler

    # -- the handler ---------------------------------------------------------------------------

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
        conn = self._conn
        if self.session.current_request != request.number or conn is None:
            return False
        self._handle(self.session.send_partial(frames, trio.current_time()))
        # A stream of PARTIALs keeps this task from waiting on the socket: read it as it goes
        # (the broker's heartbeats, a DISCONNECT), and don't queue faster than the socket sends.
        self._step(conn)
        while self._pending and self._conn is conn:
            await conn.wait(True)
            self._step(conn)
        await trio.lowlevel.checkpoint()
        return self.session.current_request == request.number


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
