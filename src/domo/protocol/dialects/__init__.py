"""The Majordomo dialects a domo broker speaks, one module each, over one neutral routing core.

Each dialect is a ``DialectCodec`` record (``base``): its ``Capabilities`` as data and its codec
(which messages it claims, how they decode into the core's neutral commands, how the core's
neutral commands encode back, per destination). ``registry`` holds them and is what the broker
consults. Nothing here keeps state or does I/O; ``domo.protocol.family`` keeps who speaks what.

- ``mdp02``: ``MDP02``, RFC 18 clients and workers, ``MDPC02``/``MDPW02`` first
  (specs/mdp-0.2.md); ``MDP02_REQ``, RFC 18 clients behind a REQ socket: envelope, ``""``,
  ``MDPC02``, 0x01, ... (specs/reqrep.md).
- ``mdp01``: RFC 7 clients (REQ: envelope, ``""``, ``MDPC01``) and workers (DEALER: ``""``,
  ``MDPW01``) (specs/mdp-0.1.md).
- ``majortomo``: majortomo 0.2.0's clients and workers: ``""``, ``MDPC02``/``MDPW02``, its own
  client codes, no service frame in replies (specs/majortomo.md).
- ``dcp``: DagBox's DCP v1: DEALER clients and workers, ``""``, ``DGBX\x01``, a 1- or 4-byte
  type frame; metadata, several requests per client, ping/pong/reconnect (specs/dcp-v1.md).
- ``emqp``: EventMQ 0.3.13's eMQP/1.0: ``""``, ``eMQP/1.0``, command, MSGID, ...
  (specs/emqp-1.0.md); its codec detects the dialect, its layer (``domo.protocol.layers.emqp``)
  keeps its state (credits, message ids, receipts).
- ``envelope``: 28/REQREP's address stack, the frames before the empty delimiter, one per
  ROUTER-DEALER hop; kept as it came and put back in front of the reply (REQREP-01, REQREP-02).
"""

from __future__ import annotations

from .base import (
    CORE_CODES,
    MDPC01,
    MDPC02,
    MDPW01,
    MDPW02,
    NUMBERED,
    Capabilities,
    Command,
    CoreCommand,
    Dialect,
    DialectCodec,
    Invalid,
    Lookup,
    Reading,
    Role,
    RouteView,
    Translation,
)
from .envelope import MAX_HOPS, delimiter_at
from .registry import (
    CODECS,
    DETECTION_ORDER,
    REGISTRY,
    Registry,
    codec_for,
    decode,
    detect,
    encode,
    withheld,
)

__all__ = [
    "CODECS",
    "CORE_CODES",
    "DETECTION_ORDER",
    "MAX_HOPS",
    "MDPC01",
    "MDPC02",
    "MDPW01",
    "MDPW02",
    "NUMBERED",
    "REGISTRY",
    "Capabilities",
    "Command",
    "CoreCommand",
    "Dialect",
    "DialectCodec",
    "Invalid",
    "Lookup",
    "Reading",
    "Registry",
    "Role",
    "RouteView",
    "Translation",
    "codec_for",
    "decode",
    "delimiter_at",
    "detect",
    "encode",
    "withheld",
]
