"""The NNG endpoint held to the ZeroMQ one's standard (issue 27): TLS with client certificates
on an allow-list, a receive size bounded by ``max_message_bytes``, the peer blamed for garbage.

Real pynng sockets on loopback; certificates made in the test with ``cryptography``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pynng")
pytest.importorskip("cbor2")
pytest.importorskip("cryptography")

import pynng
import trio

from domo.curve import CurveError, CurveServer, KeyPair, NngTls
from domo.eventlog import describe
from domo.protocol.events import ProtocolViolation
from domo.protocol.memo01 import Memo01Broker
from domo.trio import serve_broker
from domo.trio._nng import BACKTRACE_ROOM, MEMO_HEADER_ROOM, NngConnection

from ..chaos.hostile import make_certificate, tls_client
from ..chaos.hostile_peers import free_port

pytestmark = [pytest.mark.io]


async def received(conn: NngConnection, count: int) -> list[list[bytes]]:
    """The next ``count`` requests (a closed pipe's notice, a message of no frames, MEMO-23,
    is not one)."""
    messages: list[list[bytes]] = []
    while len(messages) < count:
        await conn.wait(False)
        got = conn.receive(count - len(messages))
        messages += [[bytes(f) for f in m] for m in got if len(m) > 1]
    return messages


async def answered(url: str, tls: pynng.TLSConfig, payload: bytes, wait: float) -> bytes | None:
    """One request from a fresh req0 socket with ``tls``; its reply, or None within ``wait``."""
    with pynng.Req0(tls_config=tls) as socket:
        socket.dial(url, block=False)
        with trio.move_on_after(wait):
            await socket.asend(payload)
            reply: bytes = await socket.arecv()
            return reply
    return None


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    for name in ("localhost", "alice", "mallory"):
        make_certificate(tmp_path, name)
    (tmp_path / "allowed.crt").write_text((tmp_path / "alice.crt").read_text())
    return tmp_path


async def test_tls_admits_listed_certificates_only_and_reloads(certs: Path) -> None:
    """Finding 1: no certificate, or one not on the list: never heard; the listed one is. A
    reload that swaps the list shuts the old peer out and lets the new one in."""
    tls = NngTls(certs / "localhost.pem", certs / "allowed.crt")
    assert len(tls) == 1
    port = free_port()
    conn = NngConnection(f"nng+tls+tcp://127.0.0.1:{port}", tls=tls, initial=4)
    url = f"tls+tcp://127.0.0.1:{port}"

    async def echo(messages: list[list[bytes]]) -> None:
        for token, body in messages:
            conn.send([token, body.upper()])

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)

            async def serve() -> None:
                while True:
                    await echo(await received(conn, 1))

            nursery.start_soon(serve)
            assert await answered(url, tls_client(certs, "alice"), b"alice", 5) == b"ALICE"
            assert await answered(url, tls_client(certs, None), b"nobody", 1.0) is None
            assert await answered(url, tls_client(certs, "mallory"), b"mallory", 1.0) is None
            (certs / "allowed.crt").write_text((certs / "mallory.crt").read_text())
            assert tls.reload()
            assert await answered(url, tls_client(certs, "mallory"), b"mallory", 5) == b"MALLORY"
            assert await answered(url, tls_client(certs, "alice"), b"alice", 1.0) is None
            (certs / "allowed.crt").write_text("not a certificate\n")
            assert not tls.reload()  # a bad file: the list in force stays
            assert await answered(url, tls_client(certs, "mallory"), b"again", 5) == b"AGAIN"
            nursery.cancel_scope.cancel()
    conn.close(0)


def test_tls_files_are_checked(certs: Path) -> None:
    with pytest.raises(CurveError, match="private key"):
        NngTls(certs / "localhost.crt", certs / "allowed.crt")
    with pytest.raises(CurveError, match="no PEM certificate"):
        NngTls(certs / "localhost.pem", certs / "localhost.key")
    with pytest.raises(ValueError, match="needs TLS settings"):
        NngConnection(f"nng+tls+tcp://127.0.0.1:{free_port()}")


async def test_serve_broker_refuses_curve_with_a_plain_nng_endpoint(tmp_path: Path) -> None:
    """Finding 1: CURVE does not reach NNG: a plain NNG endpoint beside it is refused."""
    curve = CurveServer(KeyPair(b"a" * 40, b"b" * 40), None)
    with pytest.raises(ValueError, match="CURVE does not cover NNG"):
        await serve_broker("tcp://127.0.0.1:0", f"nng+ipc://{tmp_path}/m.ipc", curve=curve)


async def test_a_message_over_the_bound_is_not_taken_in(tmp_path: Path) -> None:
    """Finding 2: NNG's receive size is max_message_bytes plus the longest memo01 header; a
    longer message closes its peer's connection before the broker holds it."""
    url = f"ipc://{tmp_path}/s.ipc"
    conn = NngConnection(f"nng+{url}", max_message_bytes=1000, initial=2)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            with pynng.Req0(dial=url, resend_time=-1) as req, req.new_context() as context:
                await context.asend(b"x" * (1000 + MEMO_HEADER_ROOM + BACKTRACE_ROOM + 1))
                with trio.move_on_after(0.5):
                    await received(conn, 1)
                    raise AssertionError("a message over the bound was taken in")
            with pynng.Req0(dial=url, resend_time=-1) as req, req.new_context() as context:
                await context.asend(b"y" * (1000 + MEMO_HEADER_ROOM))  # just fits
                ((_, body),) = await received(conn, 1)
            assert body[:1] == b"y"
            assert not conn.readable()
            nursery.cancel_scope.cancel()
    conn.close(0)


def test_garbage_on_nng_is_blamed_on_its_peer() -> None:
    """Finding 8: not "the broker broke MEMO-01": the NNG pipe it came on is the peer."""
    broker = Memo01Broker(memo_connections={1})
    token = bytes(range(16))
    events = broker.receive(token, [b"not cbor"], 0.0, connection=1)
    (violation,) = [e for e in events if isinstance(e, ProtocolViolation)]
    assert violation.peer == token[:8]
    assert "the broker broke" not in describe(violation)
    assert describe(violation).startswith("ProtocolViolation: peer 0001020304050607 broke MEMO-")
