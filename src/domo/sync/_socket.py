"""Non-blocking sends and receives on a pyzmq socket, without pyzmq's per-call wrappers.

``send_multipart``/``recv_multipart`` re-check their arguments and go through Python enums on
every frame; the compiled backend's methods do not. This runs for every message of the blocking
runtime, so it calls those directly (as ``domo.trio``'s transport does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import zmq
import zmq.backend

__all__ = ["readable", "ready", "receive", "send"]

_send: Any = zmq.backend.Socket.send
_recv: Any = zmq.backend.Socket.recv
_poll: Any = zmq.zmq_poll
_NOBLOCK: Final = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK | zmq.SNDMORE)
_POLLIN: Final = int(zmq.POLLIN)
_COPY_BELOW: Final = zmq.COPY_THRESHOLD


def readable(socket: zmq.Socket[bytes]) -> bool:
    """Is a message waiting?

    Asked through ``zmq_poll`` with no wait rather than ``Socket.get(EVENTS)``: both read
    EVENTS in libzmq, but ``get`` first looks its option up in a Python enum (callgrind: ~8,600
    instructions a call against ~3,100; the poll adds one ``poll(2)`` with a zero timeout).
    """
    return bool(_poll([(socket, _POLLIN)], 0))


def receive(socket: zmq.Socket[bytes]) -> list[bytes]:
    """One message that is ready (the caller saw POLLIN), as ``bytes`` frames."""
    frame: zmq.Frame = _recv(socket, _NOBLOCK, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(socket, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def send(socket: zmq.Socket[bytes], frames: Sequence[bytes]) -> bool:
    """Send one message without blocking; False if the pipe is full (nothing was sent)."""
    try:
        last = len(frames) - 1
        for index, frame in enumerate(frames):
            flags = _NOBLOCK_SNDMORE if index < last else _NOBLOCK
            if len(frame) < _COPY_BELOW:
                _send(socket, frame, flags)
            else:
                _send(socket, frame, flags, False)
    except zmq.Again:
        return False  # a multipart send fails on its first frame or not at all
    return True


def ready(items: list[tuple[zmq.Socket[bytes], int]]) -> list[tuple[zmq.Socket[bytes], int]]:
    """The sockets of ``items`` (socket, events wanted) that are ready now, with their events:
    one ``zmq_poll`` with no wait for all of them (see ``readable``)."""
    result: list[tuple[zmq.Socket[bytes], int]] = _poll(items, 0)
    return result
