"""One broker on several sockets: a peer on one bind endpoint reaches a peer on another.

MDP-A-01, MDP-A-02: one ROUTER per endpoint, all feeding one core.

``serve_broker`` binds one ROUTER per endpoint, each served by its own pump; the core knows a
peer as (connection, routing id), so a client on one socket is served by a worker on another,
in either direction and across dialects (an MDP/0.1 REQ client here). Over trio, asyncio and
sync (whose broker is trio's), on real ZeroMQ: tcp loopback and ipc in a temp dir.
"""

from __future__ import annotations

from pathlib import Path

import zmq

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import WorkerRegistered

from .drivers import LIMIT, Events, Runtime, echo

INTERVAL = 0.1
BROKER = BrokerConfig(heartbeat_interval=INTERVAL)
WORKER = WorkerConfig(heartbeat_interval=INTERVAL, reconnect_initial=0.05, reconnect_max=0.2)


def test_clients_reach_workers_on_another_bind_endpoint(runtime: Runtime, tmp_path: Path) -> None:
    events = Events()
    (tcp, ipc), broker = runtime.broker_on(
        ["tcp://127.0.0.1:0", f"ipc://{tmp_path}/b.ipc"], BROKER, events
    )
    assert tcp.startswith("tcp://127.0.0.1:")
    assert ipc.endswith("/b.ipc")
    on_ipc = runtime.worker(ipc, "on-ipc", echo, WORKER)
    on_tcp = runtime.worker(tcp, "on-tcp", echo, WORKER)
    events.wait_for(WorkerRegistered, count=2)
    # Two sockets, two connections: the worker on tcp (connection 0) is its libzmq routing id,
    # the one on ipc (connection 1) a key made for connection 1 (family.peer_key).
    registered = {event.service: event.worker for event in events.of_type(WorkerRegistered)}
    assert len(registered[b"on-tcp"]) == 5
    assert registered[b"on-ipc"].startswith(b"\x00\xffdomo:\x00\x00\x00\x01")
    try:
        with runtime.client(tcp, timeout=5, retries=0) as client:
            assert client.request("on-ipc", b"from tcp") == [b"from tcp"]
            assert client.request("on-tcp", b"same socket") == [b"same socket"]
        with runtime.client(ipc, timeout=5, retries=0) as client:
            assert client.request("on-tcp", b"from ipc") == [b"from ipc"]
            assert client.request("mmi.service", b"on-tcp") == [b"200"]
        # MDP01-11: an MDP/0.1 REQ client on the second socket, a worker on the first.
        with zmq.Context() as context, context.socket(zmq.REQ) as req:
            req.setsockopt(zmq.LINGER, 0)
            req.setsockopt(zmq.RCVTIMEO, int(LIMIT * 1000))
            req.connect(ipc)
            req.send_multipart([b"MDPC01", b"on-tcp", b"old", b"client"])
            assert req.recv_multipart() == [b"MDPC01", b"on-tcp", b"old", b"client"]
    finally:
        on_ipc.stop()
        on_tcp.stop()
        broker.stop()
