"""CURVE with an allow-list, over real sockets on loopback (domo.curve, docs/security.md).

The broker requires CURVE and admits the keys of its allow-list (a ZAP handler in its context);
workers and clients connect with the broker's public key and their own key pair. A client whose
key is not on the list, or that does not speak CURVE at all, is never served, while an allowed
client goes on being served at the same time; a reloaded list admits a new key.
"""

from __future__ import annotations

import os
import stat
from functools import partial
from pathlib import Path

import pytest
import trio
import zmq

import domo.asyncio
import domo.sync
from domo.curve import (
    AllowList,
    CurveClient,
    CurveError,
    CurveServer,
    KeyPair,
    load_keypair,
    load_public_key,
    write_keypair,
)
from domo.protocol import BrokerConfig, WorkerConfig
from domo.protocol.events import BrokerEvent, RequestQueued, WorkerRegistered
from domo.trio import Client, RequestTimeout, run_worker, serve_broker

from .conftest import Recorder

pytestmark = pytest.mark.io

BROKER = BrokerConfig(heartbeat_interval=0.5, liveness=3)
WORKER = WorkerConfig(heartbeat_interval=0.5, liveness=3, reconnect_initial=0.05)


async def echo(body: list[bytes]) -> list[bytes]:
    return body


def keys(directory: Path, name: str) -> KeyPair:
    _, secret_file = write_keypair(directory, name)
    return load_keypair(secret_file)


def test_keygen_files_are_zeromq_certificates_and_the_secret_is_private(tmp_path: Path) -> None:
    public_file, secret_file = write_keypair(tmp_path, "broker")
    assert (public_file.name, secret_file.name) == ("broker.key", "broker.key_secret")
    assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
    pair = load_keypair(secret_file)
    assert load_public_key(str(public_file)) == pair.public
    assert load_public_key(pair.public.decode()) == pair.public
    assert zmq.curve_public(pair.secret) == pair.public  # the two keys belong together
    assert "secret=..." in repr(pair)
    assert pair.secret.decode() not in repr(pair)
    with pytest.raises(CurveError, match="exists"):
        write_keypair(tmp_path, "broker")  # never overwritten
    with pytest.raises(CurveError, match="no secret key"):
        load_keypair(public_file)
    with pytest.raises(CurveError, match="Z85"):
        load_public_key("not a key")


def test_allow_list_reads_keys_and_keeps_the_old_list_on_a_bad_reload(tmp_path: Path) -> None:
    one, two = keys(tmp_path, "one"), keys(tmp_path, "two")
    path = tmp_path / "allow"
    path.write_bytes(b"# admitted peers\n\n" + one.public + b"  # one\n")
    allow = AllowList(path)
    assert one.public in allow
    assert two.public not in allow
    path.write_bytes(one.public + b"\n" + two.public + b"\n")
    assert allow.reload()
    assert two.public in allow
    assert len(allow) == 2
    path.write_bytes(b"short\n")
    assert not allow.reload()  # a bad file: the list in force stays
    assert two.public in allow
    with pytest.raises(CurveError, match="line 1"):
        AllowList(path)


async def test_only_allowed_keys_are_served_and_others_never_harm_them(tmp_path: Path) -> None:
    """An allowed client is served; a client with an unknown key, and one without CURVE, are
    never served (their requests never reach the broker), while the allowed one keeps being
    served; after a reload that lists the unknown key, it is served too."""
    broker_keys = keys(tmp_path, "broker")
    worker_keys, alice, mallory = keys(tmp_path, "w"), keys(tmp_path, "a"), keys(tmp_path, "m")
    allow_file = tmp_path / "allow"
    allow_file.write_bytes(worker_keys.public + b"\n" + alice.public + b"\n")
    allow = AllowList(allow_file)
    server = CurveServer(broker_keys, allow)
    events: Recorder[BrokerEvent] = Recorder()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, on_event=events, curve=server)
            [endpoint] = await nursery.start(serve, "tcp://127.0.0.1:0")
            work = partial(
                run_worker, config=WORKER, curve=CurveClient(broker_keys.public, worker_keys)
            )
            await nursery.start(work, endpoint, "echo", echo)
            await events.wait_for(WorkerRegistered)
            served = 0
            refused: list[str] = []

            async def allowed_client() -> None:
                nonlocal served
                async with Client(endpoint, curve=CurveClient(broker_keys.public, alice)) as c:
                    for number in range(40):
                        assert await c.request("echo", b"%d" % number) == [b"%d" % number]
                        served += 1
                        await trio.sleep(0.02)

            async def refused_client(name: str, curve: CurveClient | None) -> None:
                async with Client(endpoint, timeout=0.3, retries=2, curve=curve) as c:
                    with pytest.raises(RequestTimeout):
                        await c.request("echo", b"from " + name.encode())
                refused.append(name)

            async with trio.open_nursery() as clients:
                clients.start_soon(allowed_client)
                clients.start_soon(
                    refused_client, "mallory", CurveClient(broker_keys.public, mallory)
                )
                clients.start_soon(refused_client, "plain", None)
            assert served == 40
            assert sorted(refused) == ["mallory", "plain"]
            # Nothing of theirs reached the core: only alice's 40 requests were accepted.
            assert len(events.of_type(RequestQueued)) == 40
            allow_file.write_bytes(allow_file.read_bytes() + mallory.public + b"\n")
            assert allow.reload()
            async with Client(endpoint, curve=CurveClient(broker_keys.public, mallory)) as c:
                assert await c.request("echo", b"now") == [b"now"]
            nursery.cancel_scope.cancel()


async def test_asyncio_and_blocking_clients_take_curve_too(tmp_path: Path) -> None:
    """The asyncio and blocking runtimes' clients connect with the same CurveClient."""
    broker_keys, client_keys = keys(tmp_path, "broker"), keys(tmp_path, "c")
    allow_file = tmp_path / "allow"
    allow_file.write_bytes(client_keys.public + b"\n")
    server = CurveServer(broker_keys, AllowList(allow_file))
    curve = CurveClient(broker_keys.public, client_keys)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve = partial(serve_broker, config=BROKER, curve=server)
            [endpoint] = await nursery.start(serve, "tcp://127.0.0.1:0")
            work = partial(run_worker, config=WORKER, curve=curve)  # one key for both: allowed
            await nursery.start(work, endpoint, "echo", echo)

            def blocking() -> list[bytes]:
                with domo.sync.Client(endpoint, curve=curve) as client:
                    return client.request("echo", b"sync")

            def with_asyncio() -> list[bytes]:
                import asyncio

                async def ask() -> list[bytes]:
                    async with domo.asyncio.Client(endpoint, curve=curve) as client:
                        return await client.request("echo", b"asyncio")

                return asyncio.run(ask())

            assert await trio.to_thread.run_sync(blocking) == [b"sync"]
            assert await trio.to_thread.run_sync(with_asyncio) == [b"asyncio"]
            nursery.cancel_scope.cancel()


def test_the_asyncio_broker_admits_only_its_allow_list(tmp_path: Path) -> None:
    """domo.asyncio.serve_broker(curve=...) runs the same ZAP handler: an allowed worker and
    client are served, a client with another key is not."""
    import asyncio

    broker_keys, allowed, stranger = keys(tmp_path, "b"), keys(tmp_path, "a"), keys(tmp_path, "s")
    allow_file = tmp_path / "allow"
    allow_file.write_bytes(allowed.public + b"\n")
    server = CurveServer(broker_keys, AllowList(allow_file))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started: asyncio.Future[list[str]] = loop.create_future()
        serve = domo.asyncio.serve_broker(
            "tcp://127.0.0.1:0", config=BROKER, curve=server, started=started
        )
        broker = asyncio.create_task(serve)
        [endpoint] = await started
        curve = CurveClient(broker_keys.public, allowed)
        worker = asyncio.create_task(
            domo.asyncio.run_worker(endpoint, "echo", echo, config=WORKER, curve=curve)
        )
        try:
            async with domo.asyncio.Client(endpoint, curve=curve) as client:
                assert await client.request("echo", b"in") == [b"in"]
            refused = CurveClient(broker_keys.public, stranger)
            async with domo.asyncio.Client(endpoint, timeout=0.3, retries=1, curve=refused) as c:
                with pytest.raises(domo.asyncio.RequestTimeout):
                    await c.request("echo", b"out")
        finally:
            for task in (worker, broker):
                task.cancel()
            await asyncio.gather(worker, broker, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 30))
