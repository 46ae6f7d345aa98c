"""What the Trio and asyncio brokers share in serving the family core, whatever their loop.

``BrokerService`` holds the part of ``serve_broker`` that is not I/O: it makes the broker for
the endpoints given (``FamilyBroker``, or the memo01-serving ``Memo01Broker`` when an endpoint
is NNG's, its worker-id epoch drawn once per start, MEMO-10), puts an admission gate in front
of it if asked (a Binary Star pair's), opens the trace recorder, emits every event (the log,
the caller's hook, the trace), and stops: the core's shutdown (MDP-W-14), its last messages
flushed by the runtime, the recorder closed. The runtimes keep only what their loop needs:
binding sockets, running one pump per socket, and waiting.

Nothing here opens a socket or waits; ``os.urandom`` draws the epoch (the core draws nothing).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from domo.eventlog import log_event
from domo.protocol import BrokerConfig
from domo.protocol.events import BrokerEvent
from domo.protocol.family import FamilyBroker
from domo.protocol.mdp import BodyFrame

if TYPE_CHECKING:
    from domo.trace import TraceRecorder

__all__ = [
    "NNG_EXTRA_HINT",
    "NNG_SCHEME",
    "Admit",
    "BrokerService",
    "is_nng",
    "require_nng",
]

NNG_SCHEME: Final = "nng+"  # nng+tcp://, nng+ipc://: memo01 on an NNG rep0 socket (MEMO-21)
NNG_EXTRA_HINT: Final = (
    "memo01 on nng+tcp:// or nng+ipc:// needs the nng extra: pip install 'domo[nng]'"
)

Admit = Callable[[Sequence[BodyFrame], float], bool]
"""A gate before the core: ``admit(frames, now)`` False drops the message (Binary Star)."""


def is_nng(endpoint: str) -> bool:
    """Whether ``endpoint`` is served by NNG (memo01), not ZeroMQ."""
    return endpoint.startswith(NNG_SCHEME)


def require_nng() -> Any:
    """The memo01 layer (``domo.protocol.memo01``), or an error that says how to install it."""
    try:
        import cbor2  # noqa: F401
        import pynng  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"{NNG_EXTRA_HINT} ({error})") from None
    from domo.protocol import memo01

    return memo01


def _gated(
    receive: Callable[..., list[BrokerEvent]], admit: Admit
) -> Callable[..., list[BrokerEvent]]:
    """``receive`` behind a gate: a message ``admit`` refuses never reaches the core."""

    def gated(
        peer: bytes, frames: Sequence[BodyFrame], now: float, *more: Any
    ) -> list[BrokerEvent]:
        return receive(peer, frames, now, *more) if admit(frames, now) else []

    return gated


class BrokerService:
    """The broker a ``serve_broker`` runs, and what it does with its events, loop aside.

    - ``endpoints``: in the order the runtime numbers its connections (0, 1, ...); those for
      which ``is_nng`` is true carry memo01.
    - ``on_event``: sees every event, in order (it must not block).
    - ``trace_dir``: write request traces there (``domo.trace``, needs pyarrow).
    - ``admit``: a gate before the core (``Admit``).
    - ``wall_offset``: ``time.time()`` minus the runtime's clock, for the traces.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        config: BrokerConfig | None = None,
        *,
        on_event: Callable[[BrokerEvent], None] | None = None,
        trace_dir: str | None = None,
        admit: Admit | None = None,
        wall_offset: float = 0.0,
        logger: logging.Logger | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("serve_broker needs at least one endpoint")
        self.logger = logger if logger is not None else logging.getLogger("domo.broker")
        nng = [index for index, endpoint in enumerate(endpoints) if is_nng(endpoint)]
        self.broker: FamilyBroker
        if nng:
            # memo01 on NNG (specs/memo01.md): the same core behind a layer that speaks it. The
            # epoch is drawn here (the core draws nothing) so a restart's ids differ (MEMO-10).
            memo = require_nng()
            epoch = memo.Memo01Config(epoch=os.urandom(4))
            self.broker = memo.Memo01Broker(config, memo_connections=nng, memo=epoch)
        else:
            self.broker = FamilyBroker(config)  # every dialect of domo.protocol.dialects
        if admit is not None:
            self.broker.receive = _gated(self.broker.receive, admit)  # type: ignore[method-assign]
        self._on_event = on_event
        self.recorder: TraceRecorder | None = None
        if trace_dir is not None:
            from domo.trace import TraceRecorder  # pyarrow is an extra; import only when tracing

            self.recorder = TraceRecorder(
                trace_dir, wall_anchor=wall_offset, dialect_of=self.broker.dialect_of
            )

    @property
    def config(self) -> BrokerConfig:
        return self.broker.config

    def pipe_messages(self, hwm: int) -> int:
        """The high-water mark of one ZeroMQ peer's pipe: ``hwm``, at most what
        ``max_peer_bytes`` holds of the largest messages (MDP-D-27)."""
        return min(hwm, self.broker.config.pipe_messages)

    def emit(self, events: Iterable[BrokerEvent]) -> None:
        """Every event to the log, the caller's hook and the trace, in order."""
        logger, on_event, recorder = self.logger, self._on_event, self.recorder
        for event in events:
            log_event(logger, event)
            if on_event is not None:
                on_event(event)
            if recorder is not None:
                recorder.on_event(event)

    def stop(self, now: float, flush: Callable[[float], None]) -> None:
        """A graceful stop, once the pumps have stopped: every request given up and every
        worker sent DISCONNECT (MDP-W-14), then ``flush(now)`` sends what that left."""
        now = max(now, self.broker.now)
        self.emit(self.broker.shutdown(now))
        flush(now)

    def close(self) -> None:
        """The trace recorder's last records written (sockets are the runtime's)."""
        if self.recorder is not None:
            self.recorder.close()
