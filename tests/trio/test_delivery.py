"""Every accepted request ends in exactly one reported outcome, over real sockets (MDP-D-24).

A client that never reads, with a tiny receive high-water mark and kernel buffer, keeps asking
for large replies until its pipe is full and the broker's sends fail with EAGAIN. The broker's
accounting must match what the client can actually read afterwards: as many FINALs as requests
reported completed, every other accepted request reported dropped, each by its id.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio
import zmq

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import (
    BrokerEvent,
    RequestCompleted,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    WorkerRegistered,
)
from domo.trio import run_worker, serve_broker

from .conftest import Recorder

pytestmark = pytest.mark.io

Context = zmq.Context[zmq.Socket[bytes]]
BODY = 64 * 1024  # each reply: enough to fill the pipe and the kernel buffers quickly
REQUESTS = 150


async def big(body: list[bytes]) -> list[bytes]:
    """Echo the request's number, padded to ``BODY`` bytes."""
    return [body[0], b"x" * BODY]


async def read_until_quiet(socket: zmq.Socket[bytes], quiet: float) -> list[list[bytes]]:
    """Every message ``socket`` receives until none comes for ``quiet`` seconds."""
    messages = []
    while await trio.to_thread.run_sync(socket.poll, int(quiet * 1000)):
        messages.append(socket.recv_multipart())
    return messages


def outcomes(events: Recorder[BrokerEvent]) -> int:
    ended = (RequestCompleted, RequestDropped, RequestExpired)
    return sum(len(events.of_type(kind)) for kind in ended)


async def test_finals_refused_by_a_full_pipe_are_dropped_not_completed(
    tmp_path: Path, zmq_context: Context
) -> None:
    """MDP-D-24, MDP-D-15: completed + dropped == accepted; completed == FINALs the client got;
    each dropped request is named (its id, client-congested, rule MDP-D-15)."""
    events: Recorder[BrokerEvent] = Recorder()
    endpoint = f"ipc://{tmp_path}/broker.ipc"
    config = BrokerConfig(heartbeat_interval=0.5)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=config, context=zmq_context, on_event=events)
            [bound] = await nursery.start(partial(serve, hwm=4), endpoint)
            work = partial(run_worker, config=WorkerConfig(heartbeat_interval=0.5))
            await nursery.start(partial(work, context=zmq_context), bound, "big", big)
            await events.wait_for(WorkerRegistered)
            client = zmq_context.socket(zmq.DEALER)
            try:
                client.setsockopt(zmq.RCVHWM, 2)
                client.setsockopt(zmq.RCVBUF, 16 * 1024)
                client.connect(bound)
                # Ask at a pace the broker keeps up with, so most requests are accepted (one
                # outstanding at a time, MDP-S-02); never read.
                for number in range(REQUESTS):
                    client.send_multipart([b"MDPC02", b"\x01", b"big", b"%d" % number])
                    await trio.sleep(0.004)
                    if events.of_type(RequestDropped) and number > REQUESTS // 2:
                        break
                await trio.sleep(0.2)  # the broker reads what is left of the requests
                await events.wait_for(
                    object, lambda _: outcomes(events) == len(events.of_type(RequestQueued))
                )
                queued = events.of_type(RequestQueued)
                # Now read everything the broker handed to ZeroMQ, until 0.5 s of silence.
                messages = await read_until_quiet(client, 0.5)
            finally:
                client.close(linger=0)
            completed = events.of_type(RequestCompleted)
            dropped = events.of_type(RequestDropped)
            assert all(m[:3] == [b"MDPC02", b"\x03", b"big"] for m in messages)
            received = [m[3] for m in messages]
            assert len(received) == len(completed)  # nothing counted that did not leave
            assert dropped, "the client's pipe never filled: the test proved nothing"
            assert len(set(received)) == len(received)  # each FINAL once (MDP-D-10)
            accepted = sorted(e.request_id for e in queued)
            ended = sorted(e.request_id for e in (*completed, *dropped))
            assert ended == accepted  # one outcome each, none twice, none missing
            assert {(e.reason, e.rule) for e in dropped} == {("client-congested", "MDP-D-15")}
            assert not events.of_type(RequestExpired)
            nursery.cancel_scope.cancel()
