"""28/REQREP's envelope: the address stack in front of a message from a REQ socket or a proxy.

The envelope is the frames before the empty delimiter, one per ROUTER-DEALER hop between the
client and the broker. The broker keeps it as it came and puts it back in front of the reply, so
the hops can route it home (REQREP-01, REQREP-02); it looks at no more than ``MAX_HOPS`` of them
(REQREP-03). Which dialects may have one is their ``Capabilities.client_hops``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..mdp import BodyFrame

__all__ = ["MAX_HOPS", "delimiter_at"]

MAX_HOPS = 16  # envelope frames looked at before a message is taken for garbage (REQREP-03)


def delimiter_at(frames: Sequence[BodyFrame]) -> int | None:
    """Where the empty delimiter is (the envelope's length), or None if ``frames`` has none
    within ``MAX_HOPS`` address frames, an address is a view (a large body, never an address),
    or nothing follows the delimiter."""
    for at in range(min(len(frames) - 1, MAX_HOPS + 1)):
        if len(frames[at]) == 0:
            return at
        if not isinstance(frames[at], bytes):
            return None  # an address is a short frame, never a view of a large one
    return None
