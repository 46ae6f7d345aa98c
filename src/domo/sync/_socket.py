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

__all__ = ["readable", "receive", "send"]

_send: Any = zmq.backend.Socket.send
_recv: Any = zmq.backend.Socket.recv
_get: Any = zmq.backend.Socket.get
_NOBLOCK: Final = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_COPY_BELOW: Final = zmq.COPY_THRESHOLD


def readable(socket: zmq.Socket[bytes]) -> bool:
    """Is a message waiting?"""
    return bool(_get(socket, _EVENTS) & _POLLIN)


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
