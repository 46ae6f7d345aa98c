"""The NNG rep0 connection the broker's pump drives (MEMO-01, MEMO-19, MEMO-21), alone.

A received request is ``[token, message]``; a token takes one reply or one release; a spent
token is EHOSTUNREACH, like a ROUTER's unknown peer; a reply the socket cannot take yet (``hwm``
replies waiting) is EAGAIN with the token kept; the context pool grows with the requests held.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pynng")

import pynng
import trio

from domo.runtime.pumping import EAGAIN, EHOSTUNREACH, SENT
from domo.trio._nng import NngConnection

pytestmark = [pytest.mark.io]


async def received(conn: NngConnection, count: int) -> list[list[bytes]]:
    messages: list[list[bytes]] = []
    while len(messages) < count:
        await conn.wait(False)
        messages += [[bytes(f) for f in m] for m in conn.receive(count - len(messages))]
    return messages


async def test_memo_01_tokens_replies_releases_and_a_growing_pool(tmp_path: Path) -> None:
    """MEMO-01, MEMO-21."""
    url = f"ipc://{tmp_path}/c.ipc"
    conn = NngConnection(f"nng+{url}", hwm=100, initial=2, limit=100)
    assert conn.bound() == f"nng+{url}"
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            with pynng.Req0(dial=url) as req:
                replies: dict[int, bytes] = {}

                async def ask(i: int) -> None:
                    with req.new_context() as context:
                        await context.asend(b"q%d" % i)
                        replies[i] = await context.arecv()

                async with trio.open_nursery() as askers:
                    for i in range(6):  # more than the 2 contexts the pool starts with
                        askers.start_soon(ask, i)
                    messages = await received(conn, 6)
                    tokens = {m[1]: m[0] for m in messages}
                    assert sorted(tokens) == [b"q%d" % i for i in range(6)]
                    assert all(len(token) == 16 for token in tokens.values())
                    for body, token in tokens.items():
                        assert conn.send([token, body.upper()]) == SENT
                        assert conn.send([token, b"again"]) == EHOSTUNREACH  # spent
                assert replies == {i: b"Q%d" % i for i in range(6)}
                # A release frees the context with no reply: the asker hears nothing.
                with req.new_context() as context:
                    await context.asend(b"drop me")
                    ((token, body),) = await received(conn, 1)
                    assert conn.send([token]) == SENT
                    with trio.move_on_after(0.3) as waited:
                        await context.arecv()
                    assert waited.cancelled_caught
            nursery.cancel_scope.cancel()
    conn.close(0)


async def test_memo_19_reply_beyond_hwm_is_eagain_and_the_token_kept(tmp_path: Path) -> None:
    """MEMO-19: back-pressure as a ROUTER's EAGAIN; the core decides what it means."""
    url = f"ipc://{tmp_path}/h.ipc"
    conn = NngConnection(f"nng+{url}", hwm=0, initial=1, limit=4)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            with pynng.Req0(dial=url) as req, req.new_context() as context:
                await context.asend(b"q")
                ((token, _),) = await received(conn, 1)
                assert conn.send([token, b"reply"]) == EAGAIN
                assert conn.send([token]) == SENT  # still held: it can be released
            nursery.cancel_scope.cancel()
    conn.close(0)


async def test_memo_19_reply_to_a_closed_pipe_is_ehostunreach(tmp_path: Path) -> None:
    """MEMO-19: the peer went away (its NNG pipe closed): a reply to its held request is
    EHOSTUNREACH, as a ROUTER's to a peer that left, and the token is spent."""
    url = f"ipc://{tmp_path}/p.ipc"
    conn = NngConnection(f"nng+{url}", hwm=10, initial=1, limit=4)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            req = pynng.Req0(dial=url)
            context = req.new_context()
            await context.asend(b"q")
            ((token, _),) = await received(conn, 1)
            context.close()
            req.close()  # its pipe closes; NNG tells the connection from its own thread
            while token[:8] not in conn._dead_pipes:  # noqa: ASYNC110 - NNG's callback
                await trio.sleep(0.01)
            assert conn.send([token, b"reply"]) == EHOSTUNREACH
            assert conn.send([token, b"reply"]) == EHOSTUNREACH  # spent now
            nursery.cancel_scope.cancel()
    conn.close(0)


async def test_memo_21_a_tcp_port_0_is_reported_as_bound() -> None:
    """MEMO-21: ``nng+tcp://...:0`` reports the port the listener has, in host byte order:
    a client dials it and is served (pynng gives it in network byte order)."""
    conn = NngConnection("nng+tcp://127.0.0.1:0", hwm=10, initial=1, limit=10)
    bound = conn.bound()
    port = int(bound.rsplit(":", 1)[1])
    assert bound == f"nng+tcp://127.0.0.1:{port}"
    assert port != 0
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            url = f"tcp://127.0.0.1:{port}"
            with pynng.Req0(dial=url, block_on_dial=True) as req, req.new_context() as context:
                await context.asend(b"ping")
                [[token, body]] = await received(conn, 1)
                assert body == b"ping"
                assert conn.send([token, b"pong"]) == SENT
                assert await context.arecv() == b"pong"
            nursery.cancel_scope.cancel()
    conn.close(0)
