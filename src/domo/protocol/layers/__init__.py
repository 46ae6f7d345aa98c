"""The stateful dialects' layers, registered as codecs are (``domo.protocol.dialects``).

``LAYERS`` maps a dialect (its ``DialectCodec.dialect``) to the factory of its layer
(``base.Layer``); ``FamilyBroker(config, registry, layers)`` makes one of each and hands it every
message of its dialect. A stateless dialect needs none: its codec is enough.

- ``emqp``: eMQP/1.0 (EventMQ): a worker's credits as single-use seats, message ids, receipts,
  results only when asked for, heartbeats the broker sends first (specs/emqp-1.0.md).
- ``seats``: one dialect worker as several single-use core registrations (a seat per service
  or credit), used by eMQP and memo01.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from types import MappingProxyType

from ..dialects.base import Dialect
from .base import Layer, LayerFactory, LayerHost
from .emqp import EmqpLayer

__all__ = ["LAYERS", "Layer", "LayerFactory", "LayerHost"]

LAYERS: Mapping[Enum, LayerFactory] = MappingProxyType({Dialect.EMQP: EmqpLayer})
"""The layers domo's broker runs, by dialect."""
