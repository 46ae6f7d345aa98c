"""What the three clients share, whatever their event loop: the request slot and the reply stream.

A ``Slot`` is one ``ClientSession`` and the state around its socket: which broker it connects to
next (failover, MDP-D-28), whether the session has given its socket up (``reconnect_at``), the
messages taken from the session's outbox that the socket's pipe could not take yet, and the
replies of the request in progress that its reader has not taken yet. MDP/0.2 has no request id,
so a socket carries one request at a time (MDP-C-07): a client has one slot per request it may
have in flight, and a slot serves one request at a time.

A runtime owns the socket and the clock: it opens the socket when ``reconnect_at`` is not None
(and its time has come) and calls ``connected``; it hands each message read to ``received`` and
calls ``ticked`` when the session's deadline comes; ``flush`` sends what the session queued
through the runtime's non-blocking ``transmit``. ``ReplyStreamBase`` is the bookkeeping of a
stream of replies (``Client.stream``) that each runtime's ``ReplyStream`` drives with its own
kind of waiting.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

from domo.endpoints import EndpointRing
from domo.eventlog import level_of, log_event
from domo.protocol import ClientConfig, ClientSession, ClientState, mdp
from domo.protocol.events import ClientEvent, PartialReceived, ReconnectRequired, RequestSent

from .replies import REPLY_EVENTS, Reply, final_body

__all__ = ["ReplyStreamBase", "Slot"]

logger = logging.getLogger("domo.client")

_BUSY = (ClientState.WAITING, ClientState.RECONNECTING)  # a request is outstanding
_REPLY_TYPES = frozenset(REPLY_EVENTS)
_SENT_LEVEL = level_of(RequestSent(b"", 1, 0.0))


class Slot:
    """One client session and its socket's state (see the module); used by one request at a time.

    ``replies`` collects the reply events (``PartialReceived``, ``FinalReceived``,
    ``RequestFailed``) of the request in progress while ``collecting``; every other event is
    logged on ``domo.client``.
    """

    def __init__(self, config: ClientConfig, endpoints: Sequence[str]) -> None:
        self.session = ClientSession(config)
        self.endpoints = EndpointRing(endpoints)  # each slot moves on by itself
        self.reconnect_at: float | None = -math.inf  # a new socket is due then; None: keep it
        self.unsent: deque[tuple[bytes, ...]] = deque()  # taken from the outbox; pipe was full
        self.replies: deque[ClientEvent] = deque()  # the current request's, not yet read
        self.collecting = False  # a request is in progress: its replies go to ``replies``

    def handle(self, events: list[ClientEvent]) -> None:
        """Act on the session's events: a socket given up, a request sent, a reply."""
        for event in events:
            kind = type(event)  # the session's events are final classes: no subclass to miss
            if kind is RequestSent:
                self.sent()
                if logger.isEnabledFor(_SENT_LEVEL):  # as log_event would, one call sooner
                    log_event(logger, event)
                continue
            if kind is ReconnectRequired:
                self.reconnect_at = event.reconnect_at  # type: ignore[union-attr]
                self.unsent.clear()  # they belonged to the socket being given up
            if self.collecting and kind in _REPLY_TYPES:
                self.replies.append(event)
                self.collecting = kind is PartialReceived
            else:
                log_event(logger, event)

    def sent(self) -> None:
        """A REQUEST was queued (a first attempt or a resend): a runtime's hook."""

    def connected(self, now: float) -> None:
        """The runtime has opened a new socket for this slot (to ``endpoints.next()``)."""
        self.reconnect_at = None
        self.handle(self.session.connected(now))

    def begin(self, service: bytes, body: mdp.Frames, now: float) -> None:
        """Hand a request to the (connected, idle) session; its replies will be collected."""
        self.collecting = True
        self.handle(self.session.request(service, body, now))

    def received(self, frames: list[bytes], now: float) -> None:
        """A message read from the slot's socket."""
        self.handle(self.session.receive(frames, now))

    def ticked(self, now: float) -> None:
        """The session's deadline has come (or the runtime woke with nothing to read)."""
        self.handle(self.session.tick(now))

    def transmit(self, frames: tuple[bytes, ...]) -> bool:
        """Send one message on the slot's socket without blocking; False if its pipe is full
        (nothing was sent). The runtime's."""
        raise NotImplementedError

    def flush(self) -> bool:
        """Send what the session queued; False if something is left for when the pipe has room."""
        unsent = self.unsent
        outgoing = self.session.take_outgoing()
        if outgoing:
            unsent.extend(outgoing)
        while unsent and self.reconnect_at is None:
            if not self.transmit(unsent[0]):
                return False
            unsent.popleft()
        return True

    def cancel(self, now: float) -> None:
        """Give up the request in progress, if any; the socket is replaced before the next."""
        if self.session.state in _BUSY:
            self.handle(self.session.cancel(now))
        self.finish()

    def finish(self) -> None:
        """The request is over: forget what its reader did not take."""
        self.collecting = False
        self.replies.clear()

    def end(self, now: float) -> None:
        """The client closes: end the session (a request in progress fails as cancelled)."""
        if self.session.state is not ClientState.CLOSED:
            self.handle(self.session.close(now))


SlotT = TypeVar("SlotT", bound=Slot)


class ReplyStreamBase(Generic[SlotT]):
    """The replies of one request, as a runtime's ``ReplyStream`` hands them out.

    The runtime's iterator takes a slot for the request when first read (``_slot``), waits for
    each reply event in its own way and passes it to ``_reply``; ``_release`` hands the slot back
    to its client.
    """

    def __init__(self, service: bytes, body: Sequence[bytes]) -> None:
        self._service = mdp.check_service(service)
        self._body = mdp.check_body(body)
        self._slot: SlotT | None = None
        self._done = False

    def _reply(self, event: ClientEvent) -> Reply:
        """The reply an event stands for; the FINAL (or the failure, raised) ends the stream."""
        if isinstance(event, PartialReceived):
            return Reply(list(event.body), final=False)
        self._finish()
        return Reply(final_body(self._service, event), final=True)

    def abort(self) -> None:
        """Cancel the request if it is still in progress (nothing more will be read)."""
        if self._slot is not None:
            self._cancel(self._slot)
        self._finish()

    def _finish(self) -> None:
        self._done = True
        slot, self._slot = self._slot, None
        if slot is not None:
            self._release(slot)

    def _cancel(self, slot: SlotT) -> None:
        raise NotImplementedError

    def _release(self, slot: SlotT) -> None:
        raise NotImplementedError
