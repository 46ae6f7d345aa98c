"""memo01 clients and workers written from MemoDB's protocol text with pynng and cbor2 alone.

They share no code with domo's memo01 layer (``domo.protocol.dialects.memo01``): the header is
built and read here with cbor2 directly, so a misreading of the seed in domo shows up as a
disagreement, not as the same mistake on both ends. A worker is one req0 context (one job at a
time); several workers or clients may share one socket, each on its own context, as the seed says.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import cbor2
import pynng
import trio

READY, JOB, RESULT, HEARTBEAT, DISCONNECT = 1, 2, 3, 4, 5


def header_and_payload(data: bytes) -> tuple[list[object], bytes]:
    """Split one memo01 message into its CBOR header and the payload after it."""
    stream = io.BytesIO(data)
    header = cbor2.CBORDecoder(stream).decode()
    assert isinstance(header, list), header
    assert header[0] == "memo01", header
    return header, data[stream.tell() :]


def message(*header: object, payload: bytes = b"") -> bytes:
    return cbor2.dumps(list(header), canonical=True) + payload


@dataclass
class WorkerLog:
    """What a test worker saw: every header from the broker, and its ids."""

    headers: list[list[object]] = field(default_factory=list)
    ids: list[bytes] = field(default_factory=list)
    jobs: int = 0
    registered: trio.Event = field(default_factory=trio.Event)

    def types(self) -> list[object]:
        return [header[1] for header in self.headers]


@contextmanager
def closing_context(socket: pynng.Socket) -> Iterator[pynng.Context]:
    """A new context of ``socket``, closed at the end unless the socket closed it already."""
    context = socket.new_context()
    try:
        yield context
    finally:
        with suppress(pynng.Closed):
            context.close()


Handler = Callable[[str, bytes], Awaitable[bytes]]


async def memo_worker(
    socket: pynng.Socket,
    services: list[str],
    handler: Handler,
    log: WorkerLog,
    *,
    answer_heartbeats: bool = True,
    leave_after: int | None = None,
) -> None:
    """A memo01 worker on its own context of ``socket`` until cancelled (or it leaves).

    READY with the services sorted length-first; a JOB is answered with RESULT (the handler's
    bytes), a HEARTBEAT with HEARTBEAT, a DISCONNECT with a new READY. ``leave_after``: the
    RESULT of that many jobs carries the leaving flag, and the worker stops at the DISCONNECT.
    """
    ordered = sorted(services, key=lambda name: (len(name.encode()), name.encode()))
    with closing_context(socket) as context:
        await context.asend(message("memo01", READY, b"", ordered))
        while True:
            header, payload = header_and_payload(await context.arecv())
            log.headers.append(header)
            kind, ident = header[1], header[2]
            assert isinstance(ident, bytes)
            if kind == DISCONNECT:
                if leave_after is not None and log.jobs >= leave_after:
                    return
                await context.asend(message("memo01", READY, b"", ordered))
                continue
            if ident not in log.ids:
                log.ids.append(ident)
            log.registered.set()
            if kind == HEARTBEAT:
                if not answer_heartbeats:
                    await trio.sleep_forever()
                await context.asend(message("memo01", HEARTBEAT, ident))
            elif kind == JOB:
                service = header[3]
                assert isinstance(service, str)
                assert service in services
                assert isinstance(header[4], int)
                assert header[4] > 0
                reply = await handler(service, payload)
                log.jobs += 1
                leaving = leave_after is not None and log.jobs >= leave_after
                tail = [True] if leaving else []
                await context.asend(message("memo01", RESULT, ident, *tail, payload=reply))
            else:
                raise AssertionError(f"a worker does not expect {header}")


async def memo_call(
    socket: pynng.Socket, service: str, payload: bytes, timeout_ms: int = 5000
) -> bytes:
    """One memo01 JOB on a context of its own; the RESULT's payload."""
    with closing_context(socket) as context:
        await context.asend(message("memo01", JOB, b"", service, timeout_ms, payload=payload))
        header, reply = header_and_payload(await context.arecv())
        assert header == ["memo01", RESULT, b""], header
        return reply
