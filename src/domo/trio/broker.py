"""``serve_broker``: the broker core on ZeroMQ ROUTERs, one per endpoint, as a Trio task.

It serves MDP/0.2 and the other dialects of the family (``domo.protocol.family``): MDP/0.1,
majortomo's, clients behind REQ sockets and proxies, and DagBox's DCP v1. Each endpoint gets its
own ROUTER (the broker's connection 0, 1, ... in the order given) and its own pump task, the one
that reads it; a client on one endpoint reaches a worker on another, since they share one core
(the core knows a peer as (connection, routing id)), and the pump that hears the message sends
it on the other socket at once (every pump runs on this thread).

Run it in a nursery; it binds, reports the endpoints it actually bound, and serves until
cancelled::

    async with trio.open_nursery() as nursery:
        endpoints = await nursery.start(serve_broker, "tcp://127.0.0.1:0", "ipc:///tmp/b.ipc")
        ...
        nursery.cancel_scope.cancel()

Cancelling it is a graceful stop: the core gives up its requests and sends DISCONNECT to every
worker (``Broker.shutdown``, MDP-W-14), those are flushed, the socket closes with a short linger
and the context (if the broker made it) is terminated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from domo.curve import CurveServer, NngTls, ZapHandler
from domo.protocol import BrokerConfig
from domo.protocol.events import BrokerEvent, ConnectionClosed
from domo.protocol.mdp import BodyFrame
from domo.runtime.pumping import RoutedOutbox
from domo.runtime.serving import NNG_EXTRA_HINT, NNG_SCHEME, Admit, BrokerService, require_nng

from ._drain import Drain
from ._pump import RouterPump
from ._transport import Connection, Transport, ZmqConnection, ZmqTransport

__all__ = ["NNG_EXTRA_HINT", "NNG_SCHEME", "require_nng", "serve_broker"]


logger = logging.getLogger("domo.broker")
NNG_TLS_SCHEME = "nng+tls+tcp://"  # memo01 on NNG's TLS transport, client certificates required


def _check_nng_security(
    endpoints: Iterable[str], curve: CurveServer | None, nng_tls: NngTls | None
) -> None:
    """No NNG endpoint may serve unauthenticated peers beside CURVE ones (issue 27): under
    CURVE each must be TLS; a TLS endpoint needs its certificates."""
    for endpoint in endpoints:
        if not endpoint.startswith(NNG_SCHEME):
            continue
        tls = endpoint.startswith(NNG_TLS_SCHEME)
        if curve is not None and not tls:
            raise ValueError(
                f"{endpoint}: CURVE does not cover NNG endpoints; under CURVE serve memo01 on "
                "nng+tls+tcp:// with client certificates (docs/security.md)"
            )
        if tls and nng_tls is None:
            raise ValueError(f"{endpoint}: an nng+tls+tcp:// endpoint needs nng_tls")


# What a closed connection may mean (MDP-D-31): libzmq reports a connection it closed for a frame
# over ZMQ_MAXMSGSIZE exactly as one its peer closed, so both are said.
CLOSED_REASON = (
    "by its peer, or by ZeroMQ for a frame over max_message_bytes (MDP-D-25); ZeroMQ does not "
    "tell which"
)


async def _report_closed(
    conn: ZmqConnection[BodyFrame], emit: Callable[[Iterable[BrokerEvent]], None]
) -> None:
    """Report each connection of ``conn``'s socket that closes, as ``ConnectionClosed``, until
    cancelled (MDP-D-31); the monitor is stopped and closed on the way out (by its ``close``)."""
    monitor = conn.watch_closed()
    try:
        while True:
            await monitor.wait(False)
            for message in monitor.receive(64):
                event = parse_monitor_message(list(message))
                if event["event"] != zmq.EVENT_DISCONNECTED:
                    continue
                endpoint = event["endpoint"].decode("utf-8", "replace")
                emit([ConnectionClosed(endpoint, CLOSED_REASON, "MDP-D-31", trio.current_time())])
    finally:
        monitor.close(0)


async def serve_broker(
    *endpoints: str,
    config: BrokerConfig | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
    transport: Transport | None = None,
    on_event: Callable[[BrokerEvent], None] | None = None,
    trace_dir: str | None = None,
    hwm: int = 10_000,
    linger: float = 0.5,
    curve: CurveServer | None = None,
    admit: Admit | None = None,
    nng_tls: NngTls | None = None,
    drain: Drain | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve MDP/0.2 on ``endpoints`` (any mix of tcp://, ipc://, inproc://) until cancelled.

    Each endpoint is bound by a ROUTER of its own, served by a pump task of its own. An
    ``nng+tcp://`` or ``nng+ipc://`` endpoint is an NNG rep0 socket serving memo01 (MemoDB's
    protocol, specs/memo01.md; needs ``pip install 'domo[nng]'``), on the same core: a memo01
    client reaches workers of every dialect and a memo01 worker serves every client.

    ``task_status.started`` receives the endpoints as bound (a ``:0`` or ``*`` port resolved).
    ``on_event`` sees every event of the core, in order, for logging or metrics; it must not
    block. ``hwm`` caps the ROUTER's send and receive high-water mark, per peer, which is
    ``config.pipe_messages`` if that is lower (the default: ``max_peer_bytes`` over
    ``max_message_bytes``, MDP-D-27); a peer that does not read is reported to the core when its
    pipe is full (MDP-D-15). ZeroMQ refuses any frame over ``config.max_message_bytes``. The
    messages of 64 KiB or more that the ROUTERs hold, not yet written to the network, are at most
    ``config.max_pending_bytes`` all together (MDP-D-30).
    An NNG endpoint's socket is shared by all its peers, so it takes ``hwm`` as given, for its
    replies waiting to be sent and its pool of contexts.
    ``context`` (for ``inproc://``) or ``transport`` (for ``domo.trio.testing``) replace the
    default fresh context.
    ``trace_dir``: write request traces there (``domo.trace``, needs pyarrow; docs/traces.md).
    ``curve`` (``domo.curve.CurveServer``): CURVE on every endpoint, with the broker's key pair;
    if it has an allow-list, a ZAP handler in the broker's context admits only those client and
    worker keys (``AllowList.reload`` re-reads it; docs/security.md). CURVE does not reach NNG:
    with ``curve`` given, every NNG endpoint must be ``nng+tls+tcp://`` (``ValueError`` if not).
    ``nng_tls`` (``domo.curve.NngTls``): the certificates of ``nng+tls+tcp://`` endpoints, which
    admit only peers whose client certificate its allow-list vouches for.
    ``drain`` (``domo.trio.Drain``): once begun, new requests are refused and the ones taken
    finish (MDP-D-34); the caller cancels this task after ``drain.finished`` (or its time).
    ``admit(frames, now)``, if given, sees each message (routing id removed) before the core
    and drops it by answering False: the gate of a Binary Star pair (``domo.binarystar``).
    """
    _check_nng_security(endpoints, curve, nng_tls)
    service = BrokerService(
        endpoints,
        config,
        on_event=on_event,
        trace_dir=trace_dir,
        admit=admit,
        wall_offset=time.time() - trio.current_time(),
        logger=logger,
    )
    broker, emit = service.broker, service.emit
    if curve is not None and transport is not None:
        raise ValueError("curve applies to the default ZeroMQ transport, not to a given one")
    limits = broker.config
    # A ZeroMQ pipe is one peer's: it holds at most max_peer_bytes (MDP-D-27). An NNG socket
    # is every peer's at once (a context per request in flight), so it keeps ``hwm``.
    socket_hwm = hwm
    hwm = service.pipe_messages(hwm)
    net = (
        transport
        if transport is not None
        else ZmqTransport(
            context,
            curve=curve,
            max_message_bytes=limits.max_message_bytes,
            max_pending_bytes=limits.max_pending_bytes,
        )
    )
    zap = None
    conns: list[Connection[BodyFrame]] = []
    try:
        if curve is not None and curve.allow is not None:
            assert isinstance(net, ZmqTransport)
            zap = ZapHandler(net.context, curve.allow)
            zap.start()  # before the bind: no connection may be admitted unchecked
        bound: list[str] = []
        nng_conns: list[Any] = []
        watched: list[ZmqConnection[BodyFrame]] = []
        for endpoint in endpoints:
            if endpoint.startswith(NNG_SCHEME):
                from ._nng import NngConnection  # pynng: the nng extra, checked above

                nng_conn = NngConnection(
                    endpoint,
                    hwm=socket_hwm,
                    limit=socket_hwm,
                    max_message_bytes=limits.max_message_bytes,
                    tls=nng_tls if endpoint.startswith(NNG_TLS_SCHEME) else None,
                    per_pipe=limits.max_client_requests,  # FAM-07: memo01's client is its pipe
                    on_event=emit,
                    held_bytes=broker.core.held_bytes,
                    max_peer_bytes=limits.max_peer_bytes,  # MDP-D-27, per NNG connection
                    max_pending_bytes=limits.max_pending_bytes,  # MDP-D-30
                )
                conns.append(nng_conn)
                nng_conns.append(nng_conn)
                bound.append(nng_conn.bound())
                continue
            conn, as_bound = net.bind([endpoint], hwm)
            conns.append(conn)
            bound += as_bound
            if isinstance(conn, ZmqConnection):
                watched.append(conn)
        pumps: list[RouterPump] = []
        outbox = RoutedOutbox(
            broker, len(conns), lambda connection: pumps[connection].wake(), shared=conns
        )
        pumps += [
            RouterPump(broker, conn, emit, index, outbox if len(conns) > 1 else None)
            for index, conn in enumerate(conns)
        ]
        for index, conn in enumerate(conns):
            if isinstance(conn, ZmqConnection):  # a worker's REQUEST is not counted (MDP-D-30)
                conn.uncounted = partial(broker.only_serves, connection=index)
        try:
            logger.info("broker bound to %s", ", ".join(bound))
            task_status.started(bound)
            async with trio.open_nursery() as nursery:
                for nng_conn in nng_conns:  # their context pools, beside their pumps
                    await nursery.start(nng_conn.serve)
                for pump in pumps:
                    nursery.start_soon(pump.run)
                for conn in watched:  # closed connections are reported (MDP-D-31)
                    nursery.start_soon(_report_closed, conn, emit)
                if drain is not None:
                    nursery.start_soon(drain.run, broker.core)
        finally:
            # The pumps have stopped: this task is now the only user of every socket.
            service.stop(trio.current_time(), partial(outbox.flush_all, conns, emit=emit))
    finally:
        try:
            for conn in conns:
                conn.close(linger)  # even if an on_event hook raised
        finally:
            if zap is not None:
                zap.stop()  # its socket closes before the context is terminated
            await net.aclose()
            service.close()
