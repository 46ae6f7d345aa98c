"""An NNG rep0 socket as a broker ``Connection``, for memo01 (MemoDB) peers (``specs/memo01.md``).

memo01's clients and workers are NNG req0 sockets, each request on a context of its own, so the
broker's end is a rep0 socket with a pool of contexts: each context receives one request and
holds it until the broker replies on it (or releases it with no reply, MEMO-18). The pump sees
the rep0 socket as a ROUTER: a received message is ``[token, message]`` and a send is
``(token, message)`` or ``(token,)`` to release. A *token* names the context holding one
request: 8 bytes of the NNG pipe the request came on, then 8 of a request number (MEMO-01). It is
good for one reply; a send to a spent token is ``EHOSTUNREACH``.

The context tasks (``serve``, started beside the pump) only receive and, when a reply cannot go
at once, finish sending it; the pump alone decides what is sent, as on a ZeroMQ ROUTER. The pool
starts at ``initial`` contexts and doubles while fewer than a quarter are free to receive, up to
``limit`` (MEMO-21). Back-pressure: a reply is handed to its context's task, which sends it
when the pipe takes it; while ``hwm`` replies wait so, ``send`` answers ``EAGAIN`` (the core
treats it as ZeroMQ's, MDP-D-15).

Needs the ``nng`` extra (pynng); ``domo.trio`` imports this module only for an ``nng+`` endpoint.
"""

from __future__ import annotations

import itertools
import logging
import socket
from collections import deque
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Final

import pynng
import trio
from pynng import _nng

from domo.protocol.mdp import BodyFrame
from domo.runtime.pumping import EAGAIN, EHOSTUNREACH, SENT

__all__ = ["NNG_SCHEME", "NngConnection", "is_nng", "nng_url"]

logger = logging.getLogger("domo.transport")

NNG_SCHEME: Final = "nng+"  # nng+tcp://host:port, nng+ipc:///path: memo01 on NNG rep0 (MEMO-21)
_lib: Any = _nng.lib
_ffi: Any = _nng.ffi
_SHUTDOWN_WAIT_MS: Final = 100  # a last reply (DISCONNECT) may wait this long at shutdown


def is_nng(endpoint: str) -> bool:
    """Whether ``endpoint`` names an NNG endpoint (``nng+tcp://...``, ``nng+ipc://...``)."""
    return endpoint.startswith(NNG_SCHEME)


def nng_url(endpoint: str) -> str:
    """The NNG URL of an ``nng+`` endpoint."""
    return endpoint[len(NNG_SCHEME) :]


def _send_within(context: pynng.Context, data: bytes, timeout_ms: int) -> int:
    """Send ``data`` on ``context`` if it can go within ``timeout_ms``; NNG's error code."""
    aio_p = _ffi.new("nng_aio **")
    if _lib.nng_aio_alloc(aio_p, _ffi.NULL, _ffi.NULL) != 0:
        return int(_lib.NNG_ENOMEM)
    aio = aio_p[0]
    msg_p = _ffi.new("nng_msg **")
    try:
        if _lib.nng_msg_alloc(msg_p, 0) != 0:
            return int(_lib.NNG_ENOMEM)
        msg = msg_p[0]
        _lib.nng_msg_append(msg, data, len(data))
        _lib.nng_aio_set_msg(aio, msg)
        _lib.nng_aio_set_timeout(aio, timeout_ms)
        _lib.nng_ctx_send(context.context, aio)
        _lib.nng_aio_wait(aio)
        result = int(_lib.nng_aio_result(aio))
        if result != 0:
            _lib.nng_msg_free(msg)  # not taken: still ours
        return result
    finally:
        _lib.nng_aio_free(aio)


class _Slot:
    """One context of the pool and the request it holds, if any."""

    __slots__ = ("context", "decided", "reply")

    def __init__(self, context: pynng.Context) -> None:
        self.context = context
        self.decided = trio.Event()
        self.reply: bytes | None = None  # to be sent by the context's task


class NngConnection:
    """A bound rep0 socket driven as a broker connection; see the module docstring."""

    def __init__(
        self, endpoint: str, *, hwm: int = 10_000, initial: int = 16, limit: int = 10_000
    ) -> None:
        self.endpoint = endpoint
        self._socket = pynng.Rep0()
        try:
            self._listener = self._socket.listen(nng_url(endpoint))
        except BaseException:
            self._socket.close()
            raise
        self._hwm = hwm
        self._initial = initial
        self._limit = limit
        self._inbox: deque[list[BodyFrame]] = deque()
        self._arrived = trio.Event()
        self._held: dict[bytes, _Slot] = {}  # token -> the slot holding its request
        self._slots: list[_Slot] = []
        self._receiving = 0  # slots waiting for a request
        self._sending = 0  # replies handed to context tasks, not yet sent
        self._grow = trio.Event()
        self._numbers = itertools.count(1)
        self._serving = False
        self._scope: trio.CancelScope | None = None
        # NNG pipes that closed while requests of theirs were held: a reply to one of those is
        # EHOSTUNREACH, as a ROUTER's to a peer that left (MDP-D-15), not a send into nothing.
        self._held_per_pipe: dict[bytes, int] = {}
        self._dead_pipes: set[bytes] = set()
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._socket.add_post_pipe_remove_cb(self._on_pipe_removed)

    def bound(self) -> str:
        """The endpoint as bound (a tcp port 0 resolved)."""
        url = nng_url(self.endpoint)
        if url.startswith("tcp://") and url.rsplit(":", 1)[-1] == "0":
            # pynng gives the port as NNG keeps it, in network byte order (nng_sockaddr_in).
            port = socket.ntohs(self._listener.local_address.port)
            return f"{NNG_SCHEME}{url.rsplit(':', 1)[0]}:{port}"
        return self.endpoint

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the context pool until cancelled (start it beside the pump)."""
        self._trio_token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            self._serving = True
            for _ in range(self._initial):
                self._spawn(nursery)
            task_status.started()
            try:
                while True:
                    await self._grow.wait()
                    self._grow = trio.Event()
                    for _ in range(min(len(self._slots), self._limit - len(self._slots))):
                        self._spawn(nursery)
            finally:
                self._serving = False

    def _spawn(self, nursery: trio.Nursery) -> None:
        slot = _Slot(self._socket.new_context())
        self._slots.append(slot)
        nursery.start_soon(self._run_slot, slot)

    async def _run_slot(self, slot: _Slot) -> None:
        while True:
            self._receiving += 1
            try:
                message = await slot.context.arecv_msg()
            finally:
                self._receiving -= 1
            if self._receiving * 4 < len(self._slots) and len(self._slots) < self._limit:
                self._grow.set()  # few contexts left free to receive: double the pool
            pipe = message.pipe.id if message.pipe is not None else 0
            token = (pipe & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + next(self._numbers).to_bytes(
                8, "big"
            )
            slot.decided = trio.Event()
            self._held[token] = slot
            self._held_per_pipe[token[:8]] = self._held_per_pipe.get(token[:8], 0) + 1
            self._inbox.append([token, message.bytes])
            self._arrived.set()
            await slot.decided.wait()
            reply, slot.reply = slot.reply, None
            if reply is not None:
                try:
                    await slot.context.asend(reply)
                except pynng.NNGException as error:  # the pipe went: the reply goes nowhere
                    logger.debug("memo01 reply not sent: %s", error)
                finally:
                    self._sending -= 1
            # A new receive on this context drops a request it holds unanswered (a release).

    # -- Connection --------------------------------------------------------------------------

    async def wait(self, writable: bool) -> None:
        if self._inbox:
            await trio.lowlevel.checkpoint()
            return
        self._arrived = trio.Event()
        await self._arrived.wait()

    def receive(self, limit: int) -> list[list[BodyFrame]]:
        inbox = self._inbox
        return [inbox.popleft() for _ in range(min(limit, len(inbox)))]

    def readable(self) -> bool:
        return bool(self._inbox)

    def _on_pipe_removed(self, pipe: pynng.Pipe) -> None:
        """NNG's callback, on an NNG thread: hand the news to the Trio thread."""
        trio_token = self._trio_token
        if trio_token is None:
            return
        with suppress(trio.RunFinishedError):  # the broker is gone too: nothing to tell
            trio_token.run_sync_soon(self._pipe_gone, pipe.id.to_bytes(8, "big"))

    def _pipe_gone(self, pipe: bytes) -> None:
        if self._held_per_pipe.get(pipe):
            self._dead_pipes.add(pipe)

    def _spend(self, token: bytes, slot: _Slot) -> None:
        del self._held[token]
        pipe = token[:8]
        left = self._held_per_pipe[pipe] - 1
        if left:
            self._held_per_pipe[pipe] = left
        else:
            del self._held_per_pipe[pipe]
            self._dead_pipes.discard(pipe)
        slot.decided.set()

    def send(self, frames: Sequence[BodyFrame]) -> int:
        token = bytes(frames[0])
        slot = self._held.get(token)
        if slot is None:
            return EHOSTUNREACH  # spent or never given: as a ROUTER's unknown peer
        if token[:8] in self._dead_pipes:
            self._spend(token, slot)  # its context is free again; the reply goes nowhere
            return EHOSTUNREACH if len(frames) > 1 else SENT
        if len(frames) > 1:
            data = bytes(frames[1])
            if self._sending >= self._hwm:
                return EAGAIN  # keep the token: the core decides (MDP-D-15)
            if not self._serving:  # shutting down: no task will send it; a short wait
                _send_within(slot.context, data, _SHUTDOWN_WAIT_MS)
            else:
                # Its context task sends it: a rep0 send that fails (a busy pipe, with no wait
                # allowed) also drops the request it answers, so there is no "try now".
                slot.reply = data
                self._sending += 1
        self._spend(token, slot)
        return SENT

    def close(self, linger: float) -> None:
        if self._scope is not None:
            self._scope.cancel()
        for slot in self._slots:
            slot.context.close()  # before the socket: see pynng's Context.__del__
        self._slots.clear()
        self._socket.close()
