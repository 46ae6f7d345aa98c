"""``run_worker``: serve one MDP/0.2 service with a blocking handler.

A handler gets the request body (a list of frames) and answers in one of two ways:

- a function returning the FINAL body: ``bytes`` (one frame) or a sequence of ``bytes``;
- a generator function: every value it yields is a body; the last one is the FINAL and every
  earlier one a PARTIAL (each PARTIAL goes out when its successor is ready). A generator that
  yields nothing is a handler error.

If the handler raises, the worker logs the traceback and answers with an error FINAL that the
clients raise as ``RemoteError``; it stays registered (MDP-D-23).

The design: the handler runs in the thread that called ``run_worker`` (so it may use
thread-bound things, and Ctrl-C stops it), and the session's socket is serviced in that thread
between requests. While a handler runs, a heartbeat thread takes the socket (under a lock; a
ZeroMQ socket is used by one thread at a time) whenever the session has a timer due, reads what
the broker sent and ticks the session, so heartbeats keep going both ways however long the
handler takes (MDP-H-04). That thread wakes on its own clock (a few times per heartbeat
interval), never per request, so a request costs no thread switch. A request the session gives up
while its handler runs (broker lost, DISCONNECT) cannot be interrupted: its answer is dropped.

``concurrency=N`` runs N sessions, each with its own socket and thread: N requests at a time.
``run_worker`` returns when ``stop`` is set (or raises what interrupted it, such as
``KeyboardInterrupt``), after sending DISCONNECT on every session (a request in progress is handed
back to the broker, MDP-D-22). ``on_event`` is called from the thread that holds the session.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeAlias

import zmq

from domo.curve import CurveClient
from domo.endpoints import EndpointRing
from domo.protocol import WorkerConfig, WorkerSession, mdp
from domo.protocol.events import ReconnectRequired, RequestReceived, WorkerEvent
from domo.runtime import (
    Body,
    HandlerError,
    Partial,
    as_frames,
    error_body,
    log_event,
    service_name,
)
from domo.runtime.liveness import heard_at, receive_waiting

from ._socket import readable, receive, send

__all__ = ["Body", "Handler", "Partial", "run_worker"]

logger = logging.getLogger("domo.worker")

Handler: TypeAlias = Callable[[list[bytes]], Body | Iterator[Body] | Iterator[Body | Partial]]

_POLLIN: Final = int(zmq.POLLIN)  # ints: an enum costs a Python call per operation
_POLLOUT: Final = int(zmq.POLLOUT)
_poll: Any = zmq.zmq_poll


_STOP_CHECK: Final = 0.1  # seconds: how soon a set ``stop`` is noticed by an idle worker
BATCH: Final = 256
_PLAIN: Final = (bytes, list, tuple)  # a handler's plain answers, told apart without the ABC


def run_worker(
    endpoint: str | Sequence[str],
    service: str | bytes,
    handler: Handler,
    *,
    concurrency: int = 1,
    config: WorkerConfig | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
    on_event: Callable[[WorkerEvent], None] | None = None,
    on_broker_heard: Callable[[], None] | None = None,
    linger: float = 0.5,
    curve: CurveClient | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve ``service`` at the broker on ``endpoint`` with ``handler`` until ``stop`` is set.

    ``config`` sets heartbeat and reconnection timing (it must match the broker's). ``context``
    (for ``inproc://``) replaces the fresh ZeroMQ context made (and terminated) here.
    ``on_event`` sees every event of every session; ``on_broker_heard`` is called when a session
    first hears from the broker on a new socket. A generator handler's ``yield Partial(body)`` is
    sent at once (``domo.runtime.handlers``). ``curve`` (``domo.curve.CurveClient``) encrypts
    the connection to a CURVE broker. ``endpoint`` may be several brokers' endpoints, in
    failover order (MDP-D-28): each session moves to the next when it gives a connection up (the
    broker silent for ``liveness`` intervals, or its DISCONNECT).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    name = service_name(service)
    stop = stop if stop is not None else threading.Event()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context() if context is None else context
    try:
        servings = [
            _Serving(
                WorkerSession(name, config),
                ctx,
                endpoint,
                handler,
                on_event,
                linger,
                stop,
                on_broker_heard,
                curve,
            )
            for _ in range(concurrency)
        ]
        if concurrency == 1:
            servings[0].run()
            return
        threads = [threading.Thread(target=s.run, name=f"domo.worker {name!r}") for s in servings]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(_STOP_CHECK)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    finally:
        if context is None:
            ctx.term()


class _Serving:
    """One session: its socket, its requests and its heartbeat thread (see the module)."""

    def __init__(
        self,
        session: WorkerSession,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str | Sequence[str],
        handler: Handler,
        on_event: Callable[[WorkerEvent], None] | None,
        linger: float,
        stop: threading.Event,
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
        self._linger = linger
        self._stop = stop
        self._curve = curve
        self._lock = threading.Lock()  # whoever holds it may use the socket and the session
        self._socket: zmq.Socket[bytes] | None = None
        self._reconnect_at: float | None = -math.inf  # None: keep this socket
        self._unsent: deque[tuple[bytes, ...]] = deque()
        self._requests: deque[RequestReceived] = deque()
        self._busy = False  # a handler runs: the heartbeat thread services the socket
        self._done = threading.Event()

    def run(self) -> None:
        heartbeat = threading.Thread(target=self._heartbeats, name="domo.worker heartbeats")
        heartbeat.daemon = True
        heartbeat.start()
        self._lock.acquire()
        try:
            while not self._stop.is_set():
                if self._reconnect_at is not None and not self._reconnect():
                    continue
                self._wait_and_step()
                while self._requests:
                    self._serve(self._requests.popleft())
        finally:
            try:
                self._handle(self.session.disconnect(self._now()))
            finally:
                if self._socket is not None:
                    self._close()
                self._lock.release()
                self._done.set()
                heartbeat.join()

    # -- in the thread that holds the lock -----------------------------------------------------

    def _now(self) -> float:
        return max(time.monotonic(), self.session.now)

    def _reconnect(self) -> bool:
        """Open a new socket once ``reconnect_at`` has come; False if it has not yet."""
        assert self._reconnect_at is not None
        wait = self._reconnect_at - time.monotonic()
        if wait > 0:
            self._stop.wait(min(wait, _STOP_CHECK))
            return False
        self._reconnect_at = None
        socket = self._socket = self._context.socket(zmq.DEALER)
        if self._curve is not None:
            self._curve.apply(socket)
        socket.connect(self._endpoints.next())  # failover: MDP-D-28
        self._heard = False
        self._handle(self.session.connected(self._now()))
        self._flush(socket)  # READY; the wait sends only what a full pipe left (``_unsent``)
        return True

    def _wait_and_step(self) -> None:
        """Sleep until a message, the session's deadline or a ``stop`` check; then step.

        Everything the session queues is flushed where it was queued (``_reconnect``,
        ``_step``, ``_reply``), so only what a full pipe left in ``_unsent`` waits here.
        """
        socket = self._socket
        assert socket is not None
        full = bool(self._unsent) and not self._flush(socket)
        timeout = _STOP_CHECK
        deadline = self.session.next_deadline()
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < timeout:
                timeout = left
        ms = math.ceil(timeout * 1000) if timeout > 0 else 0
        ready = _poll([(socket, _POLLIN | _POLLOUT if full else _POLLIN)], ms)
        self._step(socket, bool(ready) and bool(ready[0][1] & _POLLIN))

    def _step(self, socket: zmq.Socket[bytes], ready: bool = False) -> None:
        """Read what is ready, tick the session if nothing was, and send what it queued.

        ``ready``: the wait has just seen a message. Only that one is read then: the next wait
        returns at once if another is there (it reads EVENTS first), which costs less than
        reading EVENTS here after every request.
        """
        session = self.session
        now = time.monotonic()
        last = session.now
        if last > now:
            now = last
        # A message found waiting was heard in time, even if this thread woke late: the
        # heartbeat thread, say, starved on a loaded machine (domo.runtime.liveness).
        received = 0
        if ready:
            expires = session.broker_expires_at
            heard = now if expires is None or now < expires else heard_at(expires, last, now)
            self._handle(session.receive(receive(socket), heard))
            received = 1
        else:
            while received < BATCH and readable(socket):
                self._handle(receive_waiting(session, receive(socket), now))
                received += 1
        if session.now != now:  # nothing was read, or a late batch: fire what is due now
            self._handle(session.tick(now))
        if received and not self._heard:
            self._heard = True
            if self._on_broker_heard is not None:
                self._on_broker_heard()
        self._flush(socket)
        if self._reconnect_at is not None:
            self._close()

    def _catch_up(self, now: float) -> None:
        """Past the broker's expiry (this thread and the heartbeat thread held up longer than
        the broker's span): read what waits in the socket first, heard in time."""
        expires = self.session.broker_expires_at
        socket = self._socket
        if expires is not None and now >= expires and socket is not None:
            self._step(socket)

    def _handle(self, events: list[WorkerEvent]) -> None:
        for event in events:
            if isinstance(event, ReconnectRequired):
                self._reconnect_at = event.reconnect_at
            elif isinstance(event, RequestReceived):
                self._requests.append(event)
            log_event(logger, event)
            if self._on_event is not None:
                self._on_event(event)

    def _flush(self, socket: zmq.Socket[bytes]) -> bool:
        """Send the session's outbox; False if the pipe is full (EAGAIN): the rest waits."""
        unsent = self._unsent
        unsent.extend(self.session.take_outgoing())
        while unsent:
            if not send(socket, unsent[0]):
                return False
            unsent.popleft()
        return True

    def _close(self) -> None:
        socket, self._socket = self._socket, None
        assert socket is not None
        self._unsent.extend(self.session.take_outgoing())
        last_words = bool(self._unsent)  # a DISCONNECT, say, that must still go out
        try:
            self._flush(socket)
        finally:
            self._unsent.clear()
            # Without last words, linger 0: stale messages of a socket given up must not reach
            # a broker that comes back while the socket lingers.
            socket.close(linger=int(self._linger * 1000) if last_words else 0)

    def _reply(self, number: int, method: Callable[..., list[WorkerEvent]], body: Any) -> bool:
        """Queue a PARTIAL or the FINAL and send it; False if the request was given up."""
        session = self.session
        if session.current_request != number:
            return False
        now = time.monotonic()
        if session.now > now:
            now = session.now
        expires = session.broker_expires_at
        if expires is not None and now >= expires:
            self._catch_up(now)
            if session.current_request != number:
                return False  # what was waiting made the session give the request up
            now = self._now()
        events = method(body, now)
        if events:  # a FINAL in time has none
            self._handle(events)
        socket = self._socket
        if socket is not None:
            self._flush(socket)
            if self._reconnect_at is not None:
                self._close()
        return True

    def _serve(self, request: RequestReceived) -> None:
        """Run the handler with the lock released; send its answer with the lock held."""
        number = request.number
        if self.session.current_request != number:
            return  # abandoned before its turn came
        final = self._answer(request)
        self._reply(number, self.session.send_final, final)

    def _answer(self, request: RequestReceived) -> mdp.Frames:
        """The FINAL body, or an error body if the handler failed."""
        try:
            self._busy = True  # the heartbeat thread services the socket meanwhile
            self._lock.release()
            try:
                result = self._handler(list(request.body))
                # bytes, list, tuple first: the Iterator ABC's isinstance costs ~1 us
                if isinstance(result, _PLAIN) or not isinstance(result, Iterator):
                    return as_frames(result)
                held: mdp.Frames | None = None
                yielded = False
                for value in result:
                    yielded = True
                    # A held value is a PARTIAL now that another came; a Partial goes at once.
                    partials = [] if held is None else [held]
                    held = None
                    if isinstance(value, Partial):
                        partials.append(as_frames(value.body))
                    else:
                        held = as_frames(value)
                    for partial in partials:
                        with self._lock:
                            if not self._reply(request.number, self.session.send_partial, partial):
                                getattr(result, "close", lambda: None)()
                                return ()
                if not yielded:
                    raise HandlerError("the handler's generator yielded nothing")
                return held if held is not None else (b"",)
            finally:
                self._lock.acquire()
                self._busy = False
        except Exception as error:
            logger.exception("handler for %r failed", self.session.service)
            return tuple(error_body(error))

    # -- the heartbeat thread ------------------------------------------------------------------

    def _heartbeats(self) -> None:
        """While a handler runs, service the socket when the session has a timer due."""
        period = self.session.config.heartbeat_interval / 4
        while not self._done.wait(period):
            if not self._busy or not self._lock.acquire(blocking=False):
                continue
            try:
                deadline = self.session.next_deadline()
                socket = self._socket
                if (
                    self._busy
                    and socket is not None
                    and deadline is not None
                    and (deadline <= time.monotonic() or readable(socket))
                ):
                    self._step(socket)
            except Exception:
                logger.exception("heartbeat thread of %r failed", self.session.service)
            finally:
                self._lock.release()
