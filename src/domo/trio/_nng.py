"""An NNG rep0 socket as a broker ``Connection``, for memo01 (MemoDB) peers (``specs/memo01.md``).

memo01's clients and workers are NNG req0 sockets, each request on a context of its own, so the
broker's end is a rep0 socket with a pool of contexts: each context receives one request and
holds it until the broker replies on it (or releases it with no reply, MEMO-18). The pump sees
the rep0 socket as a ROUTER: a received message is ``[token, message]`` and a send is
``(token, message)`` or ``(token,)`` to release. A *token* names the context holding one
request: 8 bytes of the NNG pipe the request came on, then 8 of a request number (MEMO-01). It is
good for one reply; a send to a spent token is ``EHOSTUNREACH``.

``serve`` (started beside the pump) keeps the pool: each context is always receiving, holding
a request for the broker, or sending the reply to it, and NNG's completions are handled on the
Trio thread as they come, with no task per context; the pump alone decides what is sent, as on a
ZeroMQ ROUTER, and its ``send`` starts NNG's at once. The pool starts at ``initial`` contexts and
doubles while fewer than a quarter are free to receive, up to ``limit`` (MEMO-21).
Back-pressure: a reply goes when its pipe takes it; while ``hwm`` replies wait so, ``send``
answers ``EAGAIN`` (the core treats it as ZeroMQ's, MDP-D-15).

Bounds and authentication: NNG takes in no message longer than the broker's
``max_message_bytes`` plus room for the longest memo01 header (``MEMO_HEADER_ROOM``) and req0's
backtrace; a peer that
sends one has its connection closed before the broker holds it (as ZeroMQ's ``ZMQ_MAXMSGSIZE``,
MDP-D-25). ``nng+tls+tcp://`` endpoints speak NNG's TLS transport with client certificates
required, from a ``domo.curve.NngTls`` (CURVE, being ZeroMQ's, does not reach this socket).

Needs the ``nng`` extra (pynng); ``domo.trio`` imports this module only for an ``nng+`` endpoint.
"""

from __future__ import annotations

import itertools
import logging
import socket
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, Final

import pynng
import trio
from pynng import _nng
from pynng._aio import _aio_map

from domo.curve import CurveError, NngTls
from domo.protocol.dialects.memo01 import parse
from domo.protocol.errors import MalformedMessage
from domo.protocol.events import BrokerEvent, ConnectionClosed, RequestRefused
from domo.protocol.mdp import BodyFrame
from domo.runtime.pumping import EAGAIN, EHOSTUNREACH, SENT

__all__ = [
    "BACKTRACE_ROOM",
    "MEMO_HEADER_ROOM",
    "NNG_SCHEME",
    "NngConnection",
    "is_nng",
    "is_tls",
    "nng_url",
    "tls_server_config",
]

logger = logging.getLogger("domo.transport")

NNG_SCHEME: Final = "nng+"  # nng+tcp://host:port, nng+ipc:///path: memo01 on NNG rep0 (MEMO-21)
_lib: Any = _nng.lib
_ffi: Any = _nng.ffi
_SHUTDOWN_WAIT_MS: Final = 100  # a last reply (DISCONNECT) may wait this long at shutdown
# The longest memo01 header (MEMO-03: a READY of 256 names of 255 bytes, each with a 2-byte CBOR
# length; the array's own bytes and the rest of the header in the 1 KiB): an NNG message may be
# this much longer than max_message_bytes, which bounds bodies (MDP-D-25).
MEMO_HEADER_ROOM: Final = 256 * (255 + 2) + 1024
# What NNG counts against its receive size besides: req0's backtrace, 4 bytes a hop (8 hops).
BACKTRACE_ROOM: Final = 32
TLS_SCHEME: Final = "tls+tcp://"
# What a closed connection may mean (MDP-D-31, as on ZeroMQ): NNG closes the pipe of a peer that
# sends a message over its receive size exactly as when the peer goes.
CLOSED_REASON: Final = (
    "by its peer, or by NNG for a message over max_message_bytes (MDP-D-25); NNG does not tell "
    "which"
)


def is_nng(endpoint: str) -> bool:
    """Whether ``endpoint`` names an NNG endpoint (``nng+tcp://...``, ``nng+ipc://...``)."""
    return endpoint.startswith(NNG_SCHEME)


def nng_url(endpoint: str) -> str:
    """The NNG URL of an ``nng+`` endpoint."""
    return endpoint[len(NNG_SCHEME) :]


def is_tls(endpoint: str) -> bool:
    """Whether ``endpoint`` is an NNG TLS endpoint (``nng+tls+tcp://...``)."""
    return is_nng(endpoint) and nng_url(endpoint).startswith(TLS_SCHEME)


def tls_server_config(tls: NngTls) -> pynng.TLSConfig:
    """NNG's server-side TLS settings from ``tls``: client certificates required, checked
    against its allow-list; ``CurveError`` if NNG cannot use the files."""
    try:
        return pynng.TLSConfig(
            pynng.TLSConfig.MODE_SERVER,
            cert_key_file=str(tls.cert_file),
            ca_string=tls.allowed,
            auth_mode=pynng.TLSConfig.AUTH_MODE_REQUIRED,
        )
    except pynng.NNGException as error:
        raise CurveError(
            f"NNG's TLS cannot use {tls.cert_file} and {tls.allow_file}: {error} (a PEM "
            "certificate and its key in the first, PEM certificates in the second)"
        ) from None


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


_RECEIVING, _HELD, _SENDING, _IDLE = range(4)  # what a context does now


class _Slot:
    """One context of the pool, its NNG aio and what it does: receives a request, holds it
    for the broker, or sends the reply to it."""

    __slots__ = ("aio", "context", "ctx", "key", "pipe", "size", "state", "wake")

    def __init__(self, context: pynng.Context, wake: Callable[[], None]) -> None:
        self.context = context
        self.ctx = context.context
        self.state = _IDLE
        self.pipe = b""  # the pipe a reply being sent goes to
        self.size = 0  # its bytes
        # NNG completes an aio on one of its threads by calling pynng's ``_async_complete``
        # with the aio's argument, the id of a callable in pynng's ``_aio_map`` (popped there):
        # ``wake``, put back in the map before each operation.
        self.wake = wake
        self.key = id(wake)
        aio_p = _ffi.new("nng_aio **")
        if _lib.nng_aio_alloc(aio_p, _lib._async_complete, _ffi.cast("void *", self.key)) != 0:
            raise MemoryError("NNG could not allocate an aio")
        self.aio = aio_p[0]


class NngConnection:
    """A bound rep0 socket driven as a broker connection; see the module docstring."""

    def __init__(
        self,
        endpoint: str,
        *,
        hwm: int = 10_000,
        initial: int = 16,
        limit: int = 10_000,
        max_message_bytes: int | None = None,
        tls: NngTls | None = None,
        per_pipe: int = 1000,
        on_event: Callable[[list[BrokerEvent]], None] | None = None,
        held_bytes: Callable[[], int] = lambda: 0,
        max_peer_bytes: int = 2**62,
        max_pending_bytes: int = 2**62,
    ) -> None:
        """``max_message_bytes``: the longest body taken in (NNG closes the connection of a
        peer that sends more, with room for the header). ``tls``: required for, and only for,
        an ``nng+tls+tcp://`` endpoint. ``per_pipe``: the requests one NNG connection may have
        held at once (its workers' and its jobs'); one more is released unanswered.
        ``on_event``: told of each connection that closes (``ConnectionClosed``, MDP-D-31: by
        its peer, or by NNG for a message over the bound, which NNG does not tell apart) and of
        each request refused over ``per_pipe`` (``RequestRefused``, FAM-07, with
        ``held_bytes()`` as the bytes the broker held then). ``max_peer_bytes``,
        ``max_pending_bytes``: the reply bytes that may wait for one connection and for all of
        them (MDP-D-27, MDP-D-30); a reply over either is not sent, its request released, and
        ``send`` answers EAGAIN (its peer is congested, MDP-D-15)."""
        self.endpoint = endpoint
        if is_tls(endpoint) != (tls is not None):
            raise ValueError(
                f"{endpoint}: an nng+tls+tcp:// endpoint needs TLS settings (domo.curve.NngTls), "
                "and only such an endpoint takes them"
            )
        self._tls = tls
        self._on_event = on_event
        self._held_bytes = held_bytes
        self._max_peer_bytes = max_peer_bytes
        self._max_pending_bytes = max_pending_bytes
        self._waiting_bytes: dict[bytes, int] = {}  # pipe -> reply bytes its tasks still send
        self._waiting_total = 0
        self._per_pipe = per_pipe
        self.refused = 0  # requests released for being over ``per_pipe``
        self._socket = pynng.Rep0()
        try:
            if max_message_bytes is not None:
                self._socket.recv_max_size = max_message_bytes + MEMO_HEADER_ROOM + BACKTRACE_ROOM
            if tls is not None:
                self._socket.tls_config = tls_server_config(tls)
            self._listener = self._socket.listen(nng_url(endpoint))
        except BaseException:
            self._socket.close()
            raise
        self._address = nng_url(self.bound())  # where a TLS reload listens again
        if tls is not None:
            tls.subscribe(self.reload_tls)
        self._hwm = hwm
        self._initial = initial
        self._limit = limit
        self._inbox: deque[list[BodyFrame]] = deque()
        self._arrived = trio.Event()
        self._held: dict[bytes, _Slot] = {}  # token -> the slot holding its request
        self._slots: list[_Slot] = []
        self._sending = 0  # replies whose send NNG has not completed
        self._grow = trio.Event()  # the pool is to double (set by ``receive``)
        self._numbers = itertools.count(1)
        self._serving = False
        self._closed = False
        self._scope: trio.CancelScope | None = None
        # NNG pipes that closed while requests of theirs were held: a reply to one of those is
        # EHOSTUNREACH, as a ROUTER's to a peer that left (MDP-D-15), not a send into nothing.
        self._held_per_pipe: dict[bytes, int] = {}
        self._known_pipes: set[bytes] = set()  # pipes a message came on, until they close
        self._dead_pipes: set[bytes] = set()
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._socket.add_post_pipe_remove_cb(self._on_pipe_removed)

    def reload_tls(self) -> bool:
        """Re-open the listener with ``tls``'s files as they are now (after ``NngTls.reload``).

        NNG fixes a listener's TLS settings when it starts, so the listener is closed and a new
        one opened on the same address: its connections close too, and the peers the new
        allow-list admits reconnect (NNG's dialers retry); a removed certificate is shut out at
        once. Returns False, with the old settings kept, if the new ones cannot be used.
        """
        assert self._tls is not None
        try:
            config = tls_server_config(self._tls)
        except CurveError as error:
            logger.error(
                "NNG TLS not reloaded on %s, the previous settings stay: %s", self.endpoint, error
            )
            return False
        address = self._address
        self._listener.close()
        self._socket.tls_config = config
        try:
            self._listener = self._socket.listen(address)
        except pynng.NNGException as error:
            logger.error("%s could not listen again after a TLS reload: %s", self.endpoint, error)
            return False
        return True

    def bound(self) -> str:
        """The endpoint as bound (a tcp port 0 resolved)."""
        url = nng_url(self.endpoint)
        if url.startswith(("tcp://", TLS_SCHEME)) and url.rsplit(":", 1)[-1] == "0":
            # pynng gives the port as NNG keeps it, in network byte order
            port = socket.ntohs(self._listener.local_address.port)
            return f"{NNG_SCHEME}{url.rsplit(':', 1)[0]}:{port}"
        return self.endpoint

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the context pool until cancelled (start it beside the pump)."""
        self._trio_token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._scope = scope
            self._serving = True
            try:
                for _ in range(self._initial):
                    self._spawn()
                task_status.started()
                while True:
                    await self._grow.wait()
                    self._grow = trio.Event()
                    for _ in range(min(len(self._slots), self._limit - len(self._slots))):
                        self._spawn()
            finally:
                self._serving = False

    def _spawn(self) -> None:
        slot = _Slot(self._socket.new_context(), lambda: self._from_nng(slot))
        self._slots.append(slot)
        self._receive_on(slot)

    # NNG completes each context's operation on a thread of its own; the completion is handed to
    # the Trio thread and handled there at once, in the task that runs ``run_sync_soon``'s
    # callbacks, many in one turn: a request reaches the pump's inbox with no task of its own to
    # schedule first, and the pump's send starts NNG's at once. (A task per context, waiting in
    # pynng's ``arecv_msg`` and ``asend``, cost two more scheduling rounds per request, each a
    # turn behind a flood on another socket's pump, and an aio made and freed per message.)

    def _receive_on(self, slot: _Slot) -> None:
        """Start a receive on ``slot``'s context; a request it held is released unanswered."""
        slot.state = _RECEIVING
        _aio_map[slot.key] = slot.wake
        _lib.nng_ctx_recv(slot.ctx, slot.aio)

    def _send_on(self, slot: _Slot, data: bytes, pipe: bytes) -> None:
        """Start sending ``data``, the reply to the request ``slot`` held, to ``pipe``."""
        msg_p = _ffi.new("nng_msg **")
        if _lib.nng_msg_alloc(msg_p, 0) != 0:
            logger.error("memo01 reply not sent: NNG could not allocate a message")
            self._receive_on(slot)  # its request is released unanswered
            return
        msg = msg_p[0]
        _lib.nng_msg_append(msg, data, len(data))
        _lib.nng_aio_set_msg(slot.aio, msg)
        slot.state, slot.pipe, slot.size = _SENDING, pipe, len(data)
        self._sending += 1
        self._waiting_bytes[pipe] = self._waiting_bytes.get(pipe, 0) + len(data)
        self._waiting_total += len(data)
        _aio_map[slot.key] = slot.wake
        _lib.nng_ctx_send(slot.ctx, slot.aio)

    def _from_nng(self, slot: _Slot) -> None:
        """An operation of ``slot`` completed (on an NNG thread): handle it on the Trio one."""
        trio_token = self._trio_token
        if trio_token is not None:
            with suppress(trio.RunFinishedError):  # the broker is gone: nothing to handle
                trio_token.run_sync_soon(self._completed, slot)

    def _completed(self, slot: _Slot) -> None:
        if self._closed:
            return  # ``close`` freed the aio and whatever message it held
        result = int(_lib.nng_aio_result(slot.aio))
        if slot.state == _SENDING:
            self._sending -= 1
            if result != 0:  # the pipe went: the reply goes nowhere, and is still ours
                _lib.nng_msg_free(_lib.nng_aio_get_msg(slot.aio))
                logger.debug("memo01 reply not sent: NNG error %d", result)
            self._sent_or_gone(slot.pipe, slot.size)
            self._release(slot)
            return
        if result != 0:
            slot.state = _IDLE
            if result not in (_lib.NNG_ECLOSED, _lib.NNG_ECANCELED) and self._serving:
                logger.warning("an NNG receive failed (error %d); receiving again", result)
                self._receive_on(slot)
            return
        msg = _lib.nng_aio_get_msg(slot.aio)
        pipe = int(_lib.nng_pipe_id(_lib.nng_msg_get_pipe(msg)))
        data = bytes(_ffi.buffer(_lib.nng_msg_body(msg), _lib.nng_msg_len(msg)))
        _lib.nng_msg_free(msg)  # copied: no NNG message is kept while the broker holds it
        token = (pipe & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + next(self._numbers).to_bytes(
            8, "big"
        )
        held_here = self._held_per_pipe.get(token[:8], 0)
        if held_here >= self._per_pipe:
            self._refuse_over_cap(token[:8], held_here, data)
            self._release_later(slot)  # the request is released unanswered
            return
        slot.state = _HELD
        self._held[token] = slot
        self._held_per_pipe[token[:8]] = held_here + 1
        self._known_pipes.add(token[:8])  # its closing is news to the broker (MEMO-23)
        self._inbox.append([token, data])
        self._arrived.set()

    def _sent_or_gone(self, pipe: bytes, size: int) -> None:
        """A reply of ``size`` bytes to ``pipe`` no longer waits: written, or its pipe gone."""
        self._waiting_total -= size
        left = self._waiting_bytes.get(pipe, 0) - size
        if left > 0:
            self._waiting_bytes[pipe] = left
        else:
            self._waiting_bytes.pop(pipe, None)

    def _refuse_over_cap(self, pipe: bytes, held: int, data: bytes) -> None:
        """A connection already has ``per_pipe`` requests held (workers waiting, jobs in
        flight): one more is released unanswered (memo01 has no refusal answer, MEMO-18), as
        the core refuses a client over ``max_client_requests`` (FAM-07: for memo01 the client is
        the NNG connection), reported as ``RequestRefused`` (``client-limit``) and counted: one
        peer cannot take the whole pool, nor the memory and the core's time its requests would
        cost (issue 27: READYs of 256 names without end)."""
        self.refused += 1
        if self._on_event is None:
            return
        try:
            service = parse(data).service.encode("ascii")  # a JOB's; b"" for a READY
        except MalformedMessage:
            service = b""
        refused = RequestRefused(
            pipe,
            service,
            "client-limit",
            len(data),
            self._held_bytes(),
            "FAM-07",
            trio.current_time(),
        )
        self._on_event([refused])

    # -- Connection --------------------------------------------------------------------------

    async def wait(self, writable: bool) -> None:
        if self._inbox:
            await trio.lowlevel.checkpoint()
            return
        self._arrived = trio.Event()
        await self._arrived.wait()

    def receive(self, limit: int) -> list[list[BodyFrame]]:
        inbox = self._inbox
        taken = [inbox.popleft() for _ in range(min(limit, len(inbox)))]
        self._consider_growing()
        return taken

    def _consider_growing(self) -> None:
        """Double the pool (MEMO-21) when the core holds more than three quarters of its
        contexts: workers waiting for a job, jobs in flight.

        Contexts whose request the pump has not read yet do not count: under a flood of
        messages the pump releases at once (garbage, say), growing the pool would only let the
        flood in faster (it grew to 10,000 contexts, 10,000 tasks that crowded the ZeroMQ pumps
        out, issue 27). Held at its size, NNG stops reading a pipe none of its contexts can take
        a message from, and takes the pipes in turn: the flooder waits, as on a ZeroMQ ROUTER.
        """
        held_by_core = len(self._held) - len(self._inbox)
        if held_by_core * 4 > len(self._slots) * 3 and len(self._slots) < self._limit:
            self._grow.set()

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
        # The broker hears of a pipe it had a message from as a message of no frames from
        # that pipe: a busy memo01 worker whose JOB went out on it is gone, and its job goes
        # back at once (MEMO-23).
        if pipe in self._known_pipes:
            self._known_pipes.discard(pipe)
            self._inbox.append([pipe])
            self._arrived.set()
        if self._on_event is not None:
            closed = ConnectionClosed(self.endpoint, CLOSED_REASON, "MDP-D-31", trio.current_time())
            self._on_event([closed])

    def _spend(self, token: bytes) -> None:
        del self._held[token]
        pipe = token[:8]
        left = self._held_per_pipe[pipe] - 1
        if left:
            self._held_per_pipe[pipe] = left
        else:
            del self._held_per_pipe[pipe]
            self._dead_pipes.discard(pipe)

    def _release(self, slot: _Slot) -> None:
        """``slot``'s request is answered or given up: its context receives again (when
        serving), which releases a request it still held unanswered (MEMO-18)."""
        if self._serving:
            self._receive_on(slot)
        else:
            slot.state = _IDLE

    def _release_later(self, slot: _Slot) -> None:
        """Release ``slot``'s request unanswered, its context receiving again from Trio's next
        turn: a flood of messages the broker drops (junk, refusals) then takes at most the pool
        each turn, not as many as the pump can drop within its own (``SHARED_TURN``), which cut
        a ZeroMQ client's share under a memo01 flood."""
        slot.state = _IDLE
        if self._serving and self._trio_token is not None:  # else ``close`` releases it
            self._trio_token.run_sync_soon(self._rearm, slot)

    def _rearm(self, slot: _Slot) -> None:
        if not self._closed and slot.state == _IDLE:
            self._release(slot)

    def send(self, frames: Sequence[BodyFrame]) -> int:
        token = bytes(frames[0])
        slot = self._held.get(token)
        if slot is None:
            return EHOSTUNREACH  # spent or never given: as a ROUTER's unknown peer
        if token[:8] in self._dead_pipes:
            self._spend(token)  # its context is free again; the reply goes nowhere
            self._release(slot)
            return EHOSTUNREACH if len(frames) > 1 else SENT
        if len(frames) > 1 and self._sending >= self._hwm:
            return EAGAIN  # the token is kept: the core decides (MDP-D-15)
        self._spend(token)
        if len(frames) == 1:
            self._release_later(slot)
            return SENT
        data = bytes(frames[1])
        pipe = token[:8]
        if self._waiting_bytes.get(pipe, 0) + len(data) > self._max_peer_bytes or (
            self._waiting_total + len(data) > self._max_pending_bytes
        ):
            # MDP-D-27 and MDP-D-30 for NNG: the replies waiting for a peer that does not read
            # are bounded in bytes, per connection and all together, as ZeroMQ's pipes are. The
            # request is released (a reply cannot wait for room here) and the core told its
            # peer is congested: a client's request is dropped (MDP-D-15, MDP-D-29).
            self._release(slot)
            return EAGAIN
        if self._serving:
            self._send_on(slot, data, pipe)
        else:  # shutting down: nothing will handle its completion; a short wait
            _send_within(slot.context, data, _SHUTDOWN_WAIT_MS)
            slot.state = _IDLE
        return SENT

    def close(self, linger: float) -> None:
        self._closed = True
        if self._tls is not None:
            self._tls.unsubscribe(self.reload_tls)
        if self._scope is not None:
            self._scope.cancel()
        for slot in self._slots:
            # Stopping cancels its operation and waits for NNG's callback; a message the
            # operation still holds (received and not handled, or not sent) is ours to free.
            _lib.nng_aio_stop(slot.aio)
            result = int(_lib.nng_aio_result(slot.aio))
            if (slot.state == _RECEIVING and result == 0) or (
                slot.state == _SENDING and result != 0
            ):
                _lib.nng_msg_free(_lib.nng_aio_get_msg(slot.aio))
            _lib.nng_aio_free(slot.aio)
            slot.context.close()  # before the socket: see pynng's Context.__del__
        self._slots.clear()
        self._socket.close()
