"""The runtime over ``FakeNetwork`` in virtual time: heartbeats, expiry, backoff, retries, errors.

Every test runs the real ``serve_broker``, ``run_worker`` and ``Client`` (the same pumps as over
ZeroMQ) on an in-memory network under ``autojump_clock``, so timings are exact: a delivery takes
no virtual time, and each check compares times with ``==``. ``net.packets`` is the wire trace:
every message, when it was sent, and whether it was dropped.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import (
    BrokerEvent,
    ReconnectRequired,
    RequestAbandoned,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestQueued,
    RequestRedispatched,
    WorkerDisconnected,
    WorkerEvent,
    WorkerExpired,
    WorkerRegistered,
)
from domo.protocol.mdp import BodyFrame
from domo.trio import (
    Client,
    DomoError,
    Partial,
    RemoteError,
    RequestTimeout,
    run_worker,
    serve_broker,
)
from domo.trio._transport import Connection
from domo.trio.errors import ERROR_MARKER
from domo.trio.testing import FakeNetwork, Packet

from .conftest import Recorder

EP = "fake://broker"
INTERVAL = 1.0
LIVENESS = 3
SPAN = INTERVAL * LIVENESS
BROKER = BrokerConfig(heartbeat_interval=INTERVAL, liveness=LIVENESS)
WORKER = WorkerConfig(heartbeat_interval=INTERVAL, liveness=LIVENESS)

READY = (b"MDPW02", b"\x01")
HEARTBEAT = (b"MDPW02", b"\x05")
DISCONNECT = (b"MDPW02", b"\x06")


async def echo(body: list[bytes]) -> list[bytes]:
    return body


async def slow_echo(body: list[bytes]) -> list[bytes]:
    await trio.sleep(float(body[0]))
    return body


async def start_broker(
    nursery: trio.Nursery, net: FakeNetwork, events: Recorder[BrokerEvent] | None = None
) -> None:
    await nursery.start(partial(serve_broker, config=BROKER, transport=net, on_event=events), EP)


async def start_worker(
    nursery: trio.Nursery,
    net: FakeNetwork,
    service: str,
    handler: Callable[..., object],
    events: Recorder[WorkerEvent] | None = None,
    config: WorkerConfig = WORKER,
) -> None:
    serve = partial(run_worker, config=config, transport=net, on_event=events)
    await nursery.start(serve, EP, service, handler)


def sent(net: FakeNetwork, head: tuple[bytes, ...], *, to_router: bool) -> list[Packet]:
    """Delivered packets in one direction whose frames start with ``head``."""
    return [
        p
        for p in net.packets
        if p.to_router == to_router and p.delay is not None and p.frames[: len(head)] == head
    ]


async def test_worker_expires_exactly_at_liveness_times_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-D-04, MDP-H-05: the broker drops a silent worker at last_heard + liveness*interval;
    MDP-H-07, MDP-D-07: and sends it nothing more, not even DISCONNECT; MDP-H-06: the worker
    in turn gives the silent broker up at its own boundary and reconnects."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()
    worker_events: Recorder[WorkerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            await start_worker(nursery, net, "echo", echo, worker_events)
            registered = await broker_events.wait_for(WorkerRegistered)
            await trio.sleep(2.5)
            net.policy = lambda p: None if p.to_router else 0.0  # the worker falls silent
            expired = await broker_events.wait_for(WorkerExpired)
            last_heard = max(p.at for p in net.packets if p.to_router and p.delay is not None)
            assert expired.worker == registered.worker
            assert expired.last_heard == last_heard
            assert expired.at == last_heard + SPAN
            to_worker = [p for p in net.packets if not p.to_router]
            assert all(p.at <= expired.at for p in to_worker)
            assert all(p.frames != DISCONNECT for p in to_worker)
            lost = await worker_events.wait_for(ReconnectRequired)
            assert lost.reason == "broker-lost"
            assert lost.at == max(p.at for p in to_worker) + SPAN
            nursery.cancel_scope.cancel()


async def test_heartbeats_flow_while_the_handler_is_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-H-04, MDP-H-02: a worker busy for 10 intervals keeps heartbeating (its handler runs in
    its own task), the broker keeps it, and the FINAL arrives when the handler ends."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            await start_worker(nursery, net, "slow", slow_echo)
            await broker_events.wait_for(WorkerRegistered)
            async with Client(EP, timeout=30.0, transport=net) as client:
                start = trio.current_time()
                assert await client.request("slow", b"10") == [b"10"]
                assert trio.current_time() - start == 10.0
            busy = [p.at for p in sent(net, HEARTBEAT, to_router=True) if start < p.at < start + 10]
            assert len(busy) >= 9
            assert all(b - a == INTERVAL for a, b in itertools.pairwise(busy))
            from_broker = [
                p.at for p in sent(net, HEARTBEAT, to_router=False) if start < p.at < start + 10
            ]
            assert len(from_broker) >= 9
            assert not broker_events.of_type(WorkerExpired)
            nursery.cancel_scope.cancel()


async def test_reconnect_backoff_doubles_up_to_the_bound_and_resets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-D-18, MDP-H-06, MDP-W-17: while the broker never answers, each connection ends at
    READY + liveness*interval and the next READY, on a new socket (identity), follows after
    0.25, 0.5, 1, 2, 2 s; once a broker answers, the backoff starts again from 0.25 s."""
    net = FakeNetwork(policy=lambda p: None if p.to_router else 0.0)
    worker_events: Recorder[WorkerEvent] = Recorder()
    config = WorkerConfig(INTERVAL, LIVENESS, reconnect_initial=0.25, reconnect_max=2.0)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            await start_worker(nursery, net, "echo", echo, worker_events, config)
            await trio.sleep(25.0)
            readies = [p for p in net.packets if p.frames == (*READY, b"echo")]
            gaps = [b.at - a.at for a, b in itertools.pairwise(readies)]
            assert gaps[:5] == [SPAN + 0.25, SPAN + 0.5, SPAN + 1.0, SPAN + 2.0, SPAN + 2.0]
            assert len({p.peer for p in readies}) == len(readies)
            reasons = {e.reason for e in worker_events.of_type(ReconnectRequired)}
            assert reasons == {"broker-lost"}

            net.policy = None  # the broker hears the worker again
            registered = len(readies) + 1
            await trio.sleep(SPAN + 2.0 + 0.5)
            readies = [p for p in net.packets if p.frames == (*READY, b"echo")]
            assert len(readies) == registered
            async with Client(EP, transport=net) as client:
                assert await client.request("echo", b"hi") == [b"hi"]

            net.policy = lambda p: None if p.to_router else 0.0
            lost = len(worker_events.of_type(ReconnectRequired))
            again = await worker_events.wait_for(
                ReconnectRequired, lambda _: len(worker_events.of_type(ReconnectRequired)) > lost
            )
            assert again.reconnect_at - again.at == 0.25
            nursery.cancel_scope.cancel()


async def test_client_retries_on_new_sockets_then_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-C-08, MDP-D-19: no reply within ``timeout``: close, reopen, resend, ``retries``
    times, then ``RequestTimeout`` exactly at (retries + 1) * timeout; the Client stays usable."""
    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            await start_worker(nursery, net, "echo", echo)
            with pytest.raises(DomoError, match="async with"):
                await Client(EP, transport=net).request("echo", b"x")
            async with Client(EP, timeout=1.0, retries=2, transport=net) as client:
                start = trio.current_time()
                with pytest.raises(RequestTimeout) as failure:
                    await client.request("nobody", b"x")
                assert trio.current_time() - start == 3.0
                assert failure.value.attempts == 3
                assert failure.value.reason == "retries-exhausted"
                assert failure.value.service == b"nobody"
                attempts = sent(net, (b"MDPC02", b"\x01", b"nobody"), to_router=True)
                assert [p.at - start for p in attempts] == [0.0, 1.0, 2.0]
                assert len({p.peer for p in attempts}) == 3
                assert await client.request("echo", b"after") == [b"after"]
            nursery.cancel_scope.cancel()


async def test_client_resend_recovers_a_lost_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-C-08: the first REQUEST is lost on the wire; the resend after ``timeout`` succeeds."""
    lost: list[Packet] = []

    def lose_first_request(packet: Packet) -> float | None:
        if packet.frames[:2] == (b"MDPC02", b"\x01") and not lost:
            lost.append(packet)
            return None
        return 0.0

    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            await start_worker(nursery, net, "echo", echo)
            async with Client(EP, timeout=1.5, retries=1, transport=net) as client:
                net.policy = lose_first_request
                start = trio.current_time()
                assert await client.request("echo", b"once") == [b"once"]
                assert trio.current_time() - start == 1.5
                assert len(lost) == 1
            nursery.cancel_scope.cancel()


async def test_a_stray_reply_between_requests_is_not_taken_for_the_next_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-D-20, MDP-C-06: a broker that sends a second FINAL after the first request ended; it
    reaches the idle session before the next request is sent, and is dropped, not taken for
    that request's reply (the session reads its socket before each request)."""
    net = FakeNetwork()
    router, _ = net.bind([EP], 1000)

    async def broker_with_a_duplicate_final() -> None:
        answered = 0
        while True:
            await router.wait(False)
            for peer, *frames in router.receive(10):
                answered += 1
                service = frames[2]
                router.send((peer, b"MDPC02", b"\x03", service, b"answer %d" % answered))
                if answered == 1:
                    await trio.sleep(0.1)
                    router.send((peer, b"MDPC02", b"\x03", service, b"stray"))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker_with_a_duplicate_final)
            async with Client(EP, timeout=5, retries=0, transport=net) as client:
                assert await client.request("echo", b"x") == [b"answer 1"]
                await trio.sleep(1)  # the stray FINAL is now waiting on the idle socket
                assert await client.request("echo", b"y") == [b"answer 2"]
            nursery.cancel_scope.cancel()
            router.close(0)


async def test_cancelled_request_leaves_the_client_usable_on_a_new_socket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-C-07, MDP-C-08: a request cancelled by the caller's scope is given up and its socket
    replaced, so its late FINAL cannot be taken for the next request's."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            await start_worker(nursery, net, "slow", slow_echo)
            async with Client(EP, timeout=30.0, transport=net) as client:
                with trio.move_on_after(1.0) as scope:
                    await client.request("slow", b"4")
                assert scope.cancelled_caught
                start = trio.current_time()
                assert await client.request("slow", b"0") == [b"0"]
                assert trio.current_time() - start == 3.0  # after the first handler's 4 s
            old, new = [q.client for q in broker_events.of_type(RequestQueued)]
            assert old != new
            finals = sent(net, (b"MDPC02", b"\x03"), to_router=False)
            assert [(p.peer, p.frames[3]) for p in finals] == [(new, b"0")]  # old socket is gone
            nursery.cancel_scope.cancel()


async def test_abandoned_request_cancels_its_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-H-06: the worker loses the broker while busy; the session abandons the request and the
    runtime cancels the handler at that instant; MDP-D-08: the broker re-dispatches it once the
    old connection expires, and the client gets exactly one FINAL."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()
    worker_events: Recorder[WorkerEvent] = Recorder()
    runs: list[str] = []

    async def tracked(body: list[bytes]) -> list[bytes]:
        runs.append("start")
        try:
            await trio.sleep(5.0)
        except trio.Cancelled:
            runs.append(f"cancelled at {trio.current_time()}")
            raise
        runs.append("done")
        return body

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            await start_worker(nursery, net, "job", tracked, worker_events)
            first = await broker_events.wait_for(WorkerRegistered)
            delivered: list[Packet] = []

            def cut_after_request(packet: Packet) -> float | None:
                # Once the first connection has its REQUEST, nothing from the broker reaches it.
                if packet.to_router or packet.peer != first.worker:
                    return 0.0
                if delivered:
                    return None
                if packet.frames[:2] == (b"MDPW02", b"\x02"):
                    delivered.append(packet)
                return 0.0

            net.policy = cut_after_request
            async with Client(EP, timeout=30.0, transport=net) as client:
                assert await client.request("job", b"x") == [b"x"]
            abandoned = worker_events.of_type(RequestAbandoned)
            assert [a.reason for a in abandoned] == ["broker-lost"]
            assert runs == ["start", f"cancelled at {abandoned[0].at}", "start", "done"]
            redispatched = broker_events.of_type(RequestRedispatched)
            assert [r.lost_worker for r in redispatched] == [first.worker]
            assert len(broker_events.of_type(RequestCompleted)) == 1
            nursery.cancel_scope.cancel()


async def failing(body: list[bytes]) -> list[bytes]:
    raise ValueError(f"cannot handle {body[0]!r}")


async def silent_generator(body: list[bytes]) -> AsyncIterator[bytes]:
    if body[0] == b"never":
        return
    yield body[0]


async def partial_then_error(body: list[bytes]) -> AsyncIterator[bytes]:
    yield b"one"
    yield b"two"
    raise RuntimeError("stream broke")


async def not_a_body(body: list[bytes]) -> str:
    return "text is not bytes"


async def test_handler_errors_reach_the_client_and_spare_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-D-23: a handler that raises, returns a non-body or yields nothing answers with the
    error FINAL; domo's Client raises RemoteError at once; the worker stays registered."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            for service, handler in [
                ("fail", failing),
                ("gen", silent_generator),
                ("stream", partial_then_error),
                ("text", not_a_body),
            ]:
                await start_worker(nursery, net, service, handler)
            async with Client(EP, timeout=30.0, transport=net) as client:
                start = trio.current_time()
                with pytest.raises(RemoteError) as raised:
                    await client.request("fail", b"x")
                assert (raised.value.error_type, raised.value.message) == (
                    "ValueError",
                    "cannot handle b'x'",
                )
                assert (raised.value.service, raised.value.reason) == (b"fail", "remote-error")
                with pytest.raises(RemoteError) as raised:
                    await client.request("gen", b"never")
                assert raised.value.error_type == "HandlerError"
                assert await client.request("gen", b"ok") == [b"ok"]
                with pytest.raises(RemoteError) as raised:
                    await client.request("text", b"x")
                assert raised.value.error_type == "LocalProtocolError"
                replies = []

                async def read_stream() -> None:
                    async with client.stream("stream", b"x") as stream:
                        async for reply in stream:
                            replies.append(reply)

                with pytest.raises(RemoteError) as raised:
                    await read_stream()
                assert [(r.body, r.final) for r in replies] == [([b"one"], False)]
                assert raised.value.message == "stream broke"
                assert trio.current_time() == start  # no timeout, no retry
            finals = sent(net, (b"MDPC02", b"\x03", b"fail"), to_router=False)
            assert finals[0].frames[3:] == (ERROR_MARKER, b"ValueError", b"cannot handle b'x'")
            assert not broker_events.of_type(WorkerDisconnected)
            assert len(broker_events.of_type(WorkerRegistered)) == 4
            nursery.cancel_scope.cancel()


async def counting(body: list[bytes]) -> AsyncIterator[bytes]:
    for index in range(int(body[0])):
        if index:
            await trio.sleep(1.0)
        yield b"%d" % index


async def test_generator_yields_become_partials_and_the_last_one_the_final(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-R-01, MDP-C-05: yields 0, 1, 2 one second apart reach the client as PARTIAL 0 and 1
    and FINAL 2; a PARTIAL leaves when the next value is yielded (the runtime must know it was
    not the last)."""
    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            await start_worker(nursery, net, "count", counting)
            async with Client(EP, transport=net) as client:
                start = trio.current_time()
                seen = []
                async with client.stream("count", b"3") as stream:
                    async for reply in stream:
                        seen.append((trio.current_time() - start, reply.body, reply.final))
                assert seen == [
                    (1.0, [b"0"], False),
                    (2.0, [b"1"], False),
                    (2.0, [b"2"], True),
                ]
                assert await client.request("count", b"1") == [b"0"]
            nursery.cancel_scope.cancel()


async def progress(body: list[bytes]) -> AsyncIterator[bytes | Partial]:
    yield Partial(b"starting")
    await trio.sleep(2.0)  # within the client's 2.5 s reply timeout
    yield Partial([b"halfway", b"50%"])
    await trio.sleep(2.0)
    yield b"done"


async def test_a_partial_yielded_as_such_leaves_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-R-01: ``yield Partial(body)`` reaches the client when it is yielded, not when the
    handler yields again: "starting" is seen at once, not 2 s later with the next value."""
    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            await start_worker(nursery, net, "progress", progress)
            async with Client(EP, transport=net) as client:
                start = trio.current_time()
                seen = []
                async with client.stream("progress", b"") as stream:
                    async for reply in stream:
                        seen.append((trio.current_time() - start, reply.body, reply.final))
                assert seen == [
                    (0.0, [b"starting"], False),
                    (2.0, [b"halfway", b"50%"], False),
                    (4.0, [b"done"], True),
                ]
            nursery.cancel_scope.cancel()


async def only_partials(body: list[bytes]) -> AsyncIterator[Partial]:
    yield Partial(b"a")
    yield Partial(b"b")


async def test_a_generator_of_partials_only_ends_with_an_empty_final(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A generator that yields only ``Partial``s: each is a PARTIAL, and its end is a FINAL of
    one empty frame (a FINAL must have a body, MDP-R-01)."""
    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            await start_worker(nursery, net, "partials", only_partials)
            async with Client(EP, transport=net) as client:
                async with client.stream("partials", b"") as stream:
                    seen = [(reply.body, reply.final) async for reply in stream]
                assert seen == [([b"a"], False), ([b"b"], False), ([b""], True)]
            nursery.cancel_scope.cancel()


async def test_broker_shutdown_disconnects_workers_who_join_the_next_broker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-W-14: a cancelled broker sends DISCONNECT to its workers; MDP-W-17: each reconnects
    on a new socket after the backoff and registers with the broker bound next."""
    net = FakeNetwork()
    worker_events: Recorder[WorkerEvent] = Recorder()
    second: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_worker(nursery, net, "echo", echo, worker_events)
            async with trio.open_nursery() as broker_scope:
                await start_broker(broker_scope, net)
                await trio.sleep(1.5)
                broker_scope.cancel_scope.cancel()
            stopped = trio.current_time()
            disconnects = sent(net, DISCONNECT, to_router=False)
            assert [p.at for p in disconnects] == [stopped]
            reconnect = await worker_events.wait_for(ReconnectRequired)
            assert (reconnect.reason, reconnect.at) == ("broker-disconnect", stopped)
            await start_broker(nursery, net, second)
            registered = await second.wait_for(WorkerRegistered)
            assert registered.worker != disconnects[0].peer
            async with Client(EP, transport=net) as client:
                assert await client.request("echo", b"back") == [b"back"]
            nursery.cancel_scope.cancel()


async def test_stopping_a_busy_worker_hands_its_request_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-D-22, MDP-W-12: cancelling run_worker while busy sends DISCONNECT; the broker
    re-dispatches the request to another worker and the client gets one FINAL."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()

    async def second(body: list[bytes]) -> list[bytes]:
        return [b"second", *body]

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            first = trio.CancelScope()

            async def first_worker(task_status: trio.TaskStatus[None]) -> None:
                with first:
                    serve = partial(run_worker, config=WORKER, transport=net)
                    await serve(EP, "job", slow_echo, task_status=task_status)

            await nursery.start(first_worker)
            registered = await broker_events.wait_for(WorkerRegistered)
            async with Client(EP, timeout=30.0, transport=net) as client:
                replies: list[list[bytes]] = []

                async def ask() -> None:
                    replies.append(await client.request("job", b"5"))

                async with trio.open_nursery() as requests:
                    requests.start_soon(ask)
                    await broker_events.wait_for(RequestDispatched)
                    first.cancel()
                    await start_worker(nursery, net, "job", second)
                assert replies == [[b"second", b"5"]]
            gone = broker_events.of_type(WorkerDisconnected)
            assert [(g.worker, g.reason) for g in gone] == [
                (registered.worker, "worker-disconnect")
            ]
            assert len(broker_events.of_type(RequestRedispatched)) == 1
            assert len(broker_events.of_type(RequestCompleted)) == 1
            nursery.cancel_scope.cancel()


async def test_client_and_worker_concurrency_run_that_many_sessions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-C-07, MDP-A-06: one request per socket, so a Client with concurrency=3 uses three
    sockets and a fourth request waits for a free session; run_worker with concurrency=4
    registers four workers (four sockets) that work at the same time."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            serve = partial(run_worker, config=WORKER, transport=net, concurrency=4)
            await nursery.start(serve, EP, "slow", slow_echo)
            await broker_events.wait_for(
                WorkerRegistered, lambda _: len(broker_events.of_type(WorkerRegistered)) == 4
            )
            async with Client(EP, concurrency=3, timeout=30.0, transport=net) as client:
                start = trio.current_time()
                done: dict[int, float] = {}

                async def ask(index: int) -> None:
                    assert await client.request("slow", b"1", b"%d" % index) == [
                        b"1",
                        b"%d" % index,
                    ]
                    done[index] = trio.current_time() - start

                async with trio.open_nursery() as requests:
                    for index in range(4):
                        requests.start_soon(ask, index)
            assert sorted(done.values()) == [1.0, 1.0, 1.0, 2.0]
            assert len({q.client for q in broker_events.of_type(RequestQueued)}) == 3
            workers = {d.worker for d in broker_events.of_type(RequestDispatched)}
            assert len(workers) == 4  # least recently used: the fourth goes to an idle one
            nursery.cancel_scope.cancel()


async def firehose(body: list[bytes]) -> AsyncIterator[bytes]:
    for index in range(int(body[0])):
        yield b"%d" % index


async def test_a_client_that_does_not_read_is_dropped_not_waited_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-D-15: the broker's pipe to a client that never reads fills up (hwm 10); the pump
    reports EAGAIN (peer_congested), the request is dropped, the worker's remaining PARTIALs are
    discarded, and the worker serves the next client."""
    net = FakeNetwork()
    broker_events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, transport=net, on_event=broker_events)
            await nursery.start(partial(serve, hwm=10), EP)
            await start_worker(nursery, net, "hose", firehose)
            await broker_events.wait_for(WorkerRegistered)
            mute = net.connect(EP)  # a raw client socket that never reads
            mute.send([b"MDPC02", b"\x01", b"hose", b"100"])
            dropped = await broker_events.wait_for(RequestDropped)
            assert dropped.reason == "client-congested"
            async with Client(EP, transport=net) as client:
                assert await client.request("hose", b"2") == [b"1"]
            to_mute = [p for p in net.packets if not p.to_router and p.peer == dropped.client]
            assert [p.frames[3] for p in to_mute] == [b"%d" % i for i in range(10)]
            mute.close(0)
            nursery.cancel_scope.cancel()


async def test_delayed_network_delays_every_hop(autojump_clock: trio.testing.MockClock) -> None:
    """The FakeNetwork's delay hook: with 0.25 s per message, a request takes exactly four hops
    (client, broker, worker, broker, client), and heartbeats still keep the worker alive
    (MDP-H-02)."""
    net = FakeNetwork(policy=lambda packet: 0.25)
    broker_events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net, broker_events)
            await start_worker(nursery, net, "echo", echo)
            await broker_events.wait_for(WorkerRegistered)
            async with Client(EP, transport=net) as client:
                for index in range(3):
                    start = trio.current_time()
                    assert await client.request("echo", b"%d" % index) == [b"%d" % index]
                    assert trio.current_time() - start == 1.0
                    await trio.sleep(5.0)
            assert not broker_events.of_type(WorkerExpired)
            nursery.cancel_scope.cancel()


class _RecordingNetwork(FakeNetwork):
    """A FakeNetwork that keeps every connection it made, to check that each was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[Any] = []

    def bind(self, endpoints: Sequence[str], hwm: int) -> tuple[Connection[BodyFrame], list[str]]:
        conn, bound = super().bind(endpoints, hwm)
        self.made.append(conn)
        return conn, bound

    def connect(self, endpoint: str) -> Connection[bytes]:
        conn = super().connect(endpoint)
        self.made.append(conn)
        return conn


async def test_a_hook_that_raises_at_shutdown_still_closes_every_socket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An ``on_event`` hook that raises while the broker and a busy worker shut down: both
    errors reach the caller, and every socket is closed all the same (an open ZeroMQ socket
    would block its context's termination forever)."""
    net = _RecordingNetwork()
    stopping = False

    def hook(event: object) -> None:
        if stopping:
            raise RuntimeError(f"hook failed on {type(event).__name__}")

    async def one_request() -> None:
        async with Client(EP, transport=net) as client:
            await client.request("slow", b"10")

    expected = pytest.RaisesGroup(RuntimeError, RuntimeError, flatten_subgroups=True)
    with trio.fail_after(60), expected:
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, transport=net, on_event=hook)
            await nursery.start(serve, EP)
            work = partial(run_worker, config=WORKER, transport=net, on_event=hook)
            await nursery.start(work, EP, "slow", slow_echo)
            nursery.start_soon(one_request)
            await trio.sleep(1.0)  # the request is with the worker's handler
            stopping = True
            nursery.cancel_scope.cancel()
    assert len(net.made) == 3  # the broker's ROUTER, the worker's DEALER, the client's DEALER
    assert all(conn.closed for conn in net.made)


async def test_a_stream_reader_slower_than_the_timeout_makes_it_time_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """MDP-C-05, MDP-C-08, MDP-D-19: the timeout counts from the last reply the reader was
    handed. The worker sends two PARTIALs and the FINAL within 0.75 s; a reader that waits
    0.5 s after each reply (timeout 1 s) gets them all; one that waits 2 s after the first
    PARTIAL gets ``RequestTimeout`` (timeout-after-partial, no resend) on its next read."""
    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            await start_worker(nursery, net, "count", quick_count)
            async with Client(EP, timeout=1.0, retries=1, transport=net) as client:
                start = trio.current_time()
                seen = []
                async with client.stream("count", b"3") as stream:
                    async for reply in stream:
                        seen.append((trio.current_time() - start, reply.body, reply.final))
                        await trio.sleep(0.5)
                assert seen == [(0.5, [b"0"], False), (1.0, [b"1"], False), (1.5, [b"2"], True)]
                start = trio.current_time()
                async with client.stream("count", b"3") as stream:
                    first = await stream.__anext__()
                    assert (trio.current_time() - start, first.body) == (0.5, [b"0"])
                    await trio.sleep(2.0)
                    with pytest.raises(RequestTimeout) as failure:
                        await stream.__anext__()
                    assert trio.current_time() - start == 2.5
                    assert failure.value.reason == "timeout-after-partial"
                requests = sent(net, (b"MDPC02", b"\x01", b"count"), to_router=True)
                assert len(requests) == 2  # one per stream: a PARTIAL was seen, no resend
                assert await client.request("count", b"1") == [b"0"]
            nursery.cancel_scope.cancel()


async def quick_count(body: list[bytes]) -> AsyncIterator[bytes]:
    for index in range(int(body[0])):
        await trio.sleep(0.25)
        yield b"%d" % index


REQUEST_TAG: contextvars.ContextVar[bytes] = contextvars.ContextVar("REQUEST_TAG", default=b"")


async def test_each_request_runs_its_handler_in_a_fresh_context(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A context variable that one request's handler sets is not seen by the next request's
    handler on the same session, as if each ran in a task of its own; the worker's own context
    (set before ``run_worker``) is seen by all."""

    async def tagging(body: list[bytes]) -> list[bytes]:
        before = REQUEST_TAG.get()
        REQUEST_TAG.set(body[0])
        await trio.sleep(0.1)
        return [before, REQUEST_TAG.get()]

    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_broker(nursery, net)
            REQUEST_TAG.set(b"worker")  # copied into the worker's tasks when they start
            await start_worker(nursery, net, "tag", tagging)
            REQUEST_TAG.set(b"")
            async with Client(EP, transport=net) as client:
                assert await client.request("tag", b"first") == [b"worker", b"first"]
                assert await client.request("tag", b"second") == [b"worker", b"second"]
            nursery.cancel_scope.cancel()
