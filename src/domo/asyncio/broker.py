"""``serve_broker``: the broker core on pyzmq ROUTERs, one per endpoint, as an asyncio task.

It serves MDP/0.2 and the family's other dialects, as ``domo.trio.serve_broker`` does. Thin on
purpose: every decision is the core's (``domo.protocol.family.FamilyBroker``). Each endpoint has
its own ROUTER (the core's connection 0, 1, ... in the order given) and its own pump task, the
sole user of that socket: it awaits the next message bounded by the broker's next deadline,
drains what else is ready, ticks, and flushes (``domo.runtime.flush_router`` for one socket, a
``RoutedOutbox`` for several: what is for another socket is queued for its pump, which is
interrupted). A full or vanished peer is reported to the core (MDP-D-15). Each ROUTER sets
``ROUTER_MANDATORY`` so that nothing is dropped silently. Cancelling the task is a graceful stop:
``Broker.shutdown`` sends DISCONNECT to every worker (MDP-W-14), it is flushed and the sockets
close with ``linger``.

    started: asyncio.Future[list[str]] = loop.create_future()
    task = asyncio.create_task(serve_broker("tcp://127.0.0.1:0", started=started))
    endpoints = await started
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from domo.curve import CurveServer, ZapHandler
from domo.endpoints import check_endpoint
from domo.protocol import BrokerConfig
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker
from domo.runtime import flush_router, log_event
from domo.runtime.pumping import RoutedOutbox

from ._socket import AsyncConnection

__all__ = ["serve_broker"]

logger = logging.getLogger("domo.broker")
BATCH = 256  # messages handled per wake-up before other tasks get a turn
SLICE = 4  # messages handled between two flushes: replies never wait behind a flood (fairness)


async def serve_broker(
    *endpoints: str,
    config: BrokerConfig | None = None,
    context: zmq.Context[Any] | None = None,
    on_event: Callable[[BrokerEvent], None] | None = None,
    trace_dir: str | None = None,
    hwm: int = 10_000,
    linger: float = 0.5,
    curve: CurveServer | None = None,
    started: asyncio.Future[list[str]] | None = None,
) -> None:
    """Serve MDP/0.2 on ``endpoints`` until cancelled; ``started`` gets the endpoints as bound.

    The other arguments are ``domo.trio.serve_broker``'s: ``trace_dir`` writes request traces
    there (``domo.trace``, needs pyarrow; docs/traces.md); ``curve`` requires CURVE, with a
    ZAP handler (a thread) admitting the keys of its allow-list (docs/security.md).
    """
    if not endpoints:
        raise ValueError("serve_broker needs at least one endpoint")
    for endpoint in endpoints:
        check_endpoint(endpoint, bind=True)  # before libzmq takes a wrapped port
    broker = FamilyBroker(config)  # MDP/0.2 and the family's other dialects
    loop = asyncio.get_running_loop()
    recorder = None
    if trace_dir is not None:
        from domo.trace import TraceRecorder  # pyarrow is an extra; import only when tracing

        recorder = TraceRecorder(
            trace_dir, wall_anchor=time.time() - loop.time(), dialect_of=broker.dialect_of
        )
    ctx: zmq.Context[Any] = zmq.Context() if context is None else context

    def emit(events: Iterable[BrokerEvent]) -> None:
        for event in events:
            log_event(logger, event)
            if on_event is not None:
                on_event(event)
            if recorder is not None:
                recorder.on_event(event)

    routers: list[AsyncConnection] = []
    outbox = RoutedOutbox(
        broker, len(endpoints), lambda connection: routers[connection].interrupt()
    )
    several = len(endpoints) > 1

    async def pump(connection: int, router: AsyncConnection) -> None:
        """Serve one ROUTER, the only task that uses it, until cancelled."""
        receive = broker.receive
        while True:
            await router.wait(broker.next_deadline())
            budget = BATCH
            while True:  # drain: re-read after each flush, replies are often there by then
                now = max(loop.time(), broker.now)
                messages = router.receive(SLICE)
                for peer, *frames in messages:
                    emit(receive(peer, frames, now, connection))
                if not messages:
                    emit(broker.tick(now))
                if several:
                    outbox.flush(connection, router, now, emit)
                else:
                    flush_router(broker, router, now, emit)
                if not messages:
                    break
                budget -= len(messages)
                if budget <= 0:  # a flood must not starve the loop's other tasks
                    budget = BATCH
                    await asyncio.sleep(0)

    zap = None
    try:
        if curve is not None and curve.allow is not None:
            zap = ZapHandler(ctx, curve.allow)
            zap.start()  # before the bind: no connection may be admitted unchecked
        try:
            bound = []
            for endpoint in endpoints:
                router = AsyncConnection(ctx, zmq.ROUTER)
                routers.append(router)
                socket = router.socket
                socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
                # At most max_peer_bytes per pipe, each message at most max_message_bytes
                # (MDP-D-27, MDP-D-25).
                pipe = min(hwm, broker.config.pipe_messages)
                socket.setsockopt(zmq.SNDHWM, pipe)
                socket.setsockopt(zmq.RCVHWM, pipe)
                socket.setsockopt(zmq.MAXMSGSIZE, broker.config.max_message_bytes)
                if curve is not None:
                    curve.apply(socket)
                socket.bind(endpoint)
                bound.append(socket.getsockopt_string(zmq.LAST_ENDPOINT))
            logger.info("broker bound to %s", ", ".join(bound))
            if started is not None:
                started.set_result(bound)
            async with asyncio.TaskGroup() as pumps:
                for connection, router in enumerate(routers):
                    pumps.create_task(pump(connection, router))
        finally:
            try:
                # The pumps have stopped (or never started): this task alone uses the sockets.
                now = max(loop.time(), broker.now)
                emit(broker.shutdown(now))
                outbox.flush_all(routers, now, emit)
            finally:
                for router in routers:
                    router.close(linger)
    finally:
        if zap is not None:
            zap.stop()
        if context is None:
            ctx.term()
        if recorder is not None:
            recorder.close()
