"""How the runtimes log the core's events: one readable line per event, or one JSON object.

The core's events are data (``domo.protocol.events``); their reprs carry binary peer ids and the
runtime's monotonic clock, which people cannot read. Here each event becomes one line that
starts with its name, so ``grep WorkerRegistered`` still works:

    2026-11-24 07:45:01.123 INFO domo.broker: WorkerRegistered: worker 006b8b4567 serves 'echo'

- Peer ids are hex; a service or other text field is shown as text; the monotonic ``at`` is
  left out (the line's wall-clock time says when).
- Levels: what an operator watches (workers coming and going, reconnections) is INFO; what goes
  wrong for a remote peer (a broken rule, a request dropped) is WARNING; what happens per request
  or per message (queued, dispatched, completed, expired, re-dispatched) is DEBUG, so a busy or
  misconfigured system does not flood the log.
- Violations are rate-limited per rule id (``ViolationLimiter``): a peer flooding garbage writes
  a few lines a second, and the count of those left out.
- ``JsonFormatter`` writes one JSON object per line for machines: ``time`` (ISO 8601, UTC),
  ``level``, ``logger``, ``message``, and for an event its ``event`` name and fields.

``configure(level, log_format)`` sets the root logger up as the ``domo`` command does.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import IO, Any, Final

__all__ = [
    "LOG_FORMATS",
    "VIOLATIONS",
    "HumanFormatter",
    "JsonFormatter",
    "ViolationLimiter",
    "configure",
    "describe",
    "level_of",
    "log_event",
    "peer_text",
]

LOG_FORMATS: Final = ("text", "json")
EVENT_ATTRIBUTE: Final = "domo_event"  # the LogRecord attribute that carries the event

_DEBUG = (
    "RequestQueued",
    "RequestDispatched",
    "RequestRedispatched",
    "PartialForwarded",
    "RequestCompleted",
    "RequestExpired",
    "MmiReplied",
    "MessageDropped",
    "RequestSent",
    "PartialReceived",
    "FinalReceived",
    "RequestReceived",
)
_LEVELS: Final[dict[str, int]] = dict.fromkeys(_DEBUG, logging.DEBUG) | {
    "ProtocolViolation": logging.WARNING,
    "RequestDropped": logging.WARNING,
    "RequestRefused": logging.WARNING,
}


# Events a remote peer can cause at line rate: logged at most ``burst`` a window per rule id.
_LIMITED: Final = frozenset({"ProtocolViolation", "RequestRefused", "ConnectionClosed"})


# Workers coming and going: what an operator watches, but also what one peer can cause at will
# (a memo01 READY registers up to 256 services; issue 27: 3,036 of them wrote 449,000 lines in
# 10 s). At most ``CHURN.burst`` lines of each a second, then a count.
_CHURN: Final = frozenset({"WorkerRegistered", "WorkerDisconnected", "WorkerExpired"})

_LEFT_OUT: Final = {
    "ProtocolViolation": "violations",
    "RequestRefused": "refusals",
    "ConnectionClosed": "connections closed",
    "WorkerRegistered": "registrations",
    "WorkerDisconnected": "departures",
    "WorkerExpired": "expiries",
}


def level_of(event: object) -> int:
    """The logging level for ``event`` (INFO unless listed above)."""
    return _LEVELS.get(type(event).__name__, logging.INFO)


def log_event(logger: logging.Logger, event: object) -> None:
    """Log ``event`` on ``logger`` at its level: a readable line, the event kept on the record.

    Violations by remote peers, requests refused at a memory bound, and connections closed are
    rate-limited (``ViolationLimiter``, per rule id): a flood of garbage, of oversized requests
    or of connections must not flood the log, and what was left out is counted in the next line
    that is written. Workers registering, leaving and expiring are too (``CHURN``, per kind,
    with a larger burst): a peer can register hundreds of services in one message.
    """
    level = level_of(event)
    if not logger.isEnabledFor(level):
        return
    kind = type(event).__name__
    limited = kind in _LIMITED or kind in _CHURN
    if limited:
        limiter, key = (
            (VIOLATIONS, getattr(event, "rule", "?")) if kind in _LIMITED else (CHURN, kind)
        )
        allowed, suppressed = limiter.admit(key)
        if not allowed:
            return
        if suppressed:
            logger.log(
                level,
                "%s (and %d more %s of %s left out of the log in the last %g s)",
                _Described(event),
                suppressed,
                _LEFT_OUT[kind],
                key,
                limiter.window,
                extra={EVENT_ATTRIBUTE: event, "suppressed": suppressed},
            )
            return
    logger.log(level, "%s", _Described(event), extra={EVENT_ATTRIBUTE: event})


class ViolationLimiter:
    """At most ``burst`` log lines per rule id in each ``window`` seconds; the rest counted.

    One remote peer sending junk at line rate wrote 9,487 WARNING lines in a second before; with
    this, each rule writes ``burst`` lines a window, and the first line of the next window says
    how many were left out. ``clock`` is injectable for tests.
    """

    def __init__(
        self, burst: int = 10, window: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.window = window
        self._clock = clock
        self._windows: dict[str, list[float | int]] = {}  # rule -> [window start, logged, left]

    def admit(self, rule: str) -> tuple[bool, int]:
        """Whether to log this violation now, and how many of its rule were left out before."""
        now = self._clock()
        state = self._windows.get(rule)
        if state is None or now - state[0] >= self.window:
            left_out = int(state[2]) if state is not None else 0
            self._windows[rule] = [now, 1, 0]
            return True, left_out
        if state[1] < self.burst:
            state[1] = int(state[1]) + 1
            return True, 0
        state[2] = int(state[2]) + 1
        return False, 0


VIOLATIONS = ViolationLimiter()  # one per process: the log is one per process too
CHURN = ViolationLimiter(burst=100)  # worker registrations, departures, expiries: per kind


class _Described:
    """``describe(event)``, computed only if a handler formats the record."""

    __slots__ = ("event",)

    def __init__(self, event: object) -> None:
        self.event = event

    def __str__(self) -> str:
        return describe(self.event)


def peer_text(peer: object) -> str:
    """A peer id for people: bytes as hex, a (connection, routing id) pair joined by '/'."""
    if isinstance(peer, bytes | bytearray | memoryview):
        return bytes(peer).hex() or "''"
    if isinstance(peer, tuple):
        return "/".join(peer_text(part) for part in peer)
    routing_id = getattr(peer, "routing_id", None)
    if routing_id is not None:
        return f"{getattr(peer, 'connection', '?')}/{peer_text(routing_id)}"
    return "-" if peer is None else str(peer)


def _text(value: bytes) -> str:
    """A service name or other short text field: quoted text if printable ASCII, else hex."""
    try:
        decoded = bytes(value).decode("ascii")
    except UnicodeDecodeError:
        return bytes(value).hex()
    return repr(decoded) if decoded.isprintable() else bytes(value).hex()


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


# One sentence per event kind; ``e`` is the event. A template that no longer fits its event
# (a field renamed) falls back to the generic form instead of breaking the log.
_TEMPLATES: Final[dict[str, Callable[[Any], str]]] = {
    "WorkerRegistered": lambda e: f"worker {peer_text(e.worker)} serves {_text(e.service)}",
    "WorkerExpired": lambda e: (
        f"worker {peer_text(e.worker)} ({_text(e.service)}) expired: nothing heard from it for "
        f"{_seconds(e.at - e.last_heard)}"
    ),
    "WorkerDisconnected": lambda e: (
        f"worker {peer_text(e.worker)} ({_text(e.service)}) left: {e.reason}"
        + ("; DISCONNECT sent" if e.disconnect_sent else "")
    ),
    "RequestQueued": lambda e: (
        f"request {e.request_id} from client {peer_text(e.client)} queued for "
        f"{_text(e.service)} ({e.size} bytes)"
    ),
    "RequestDispatched": lambda e: (
        f"request {e.request_id} for {_text(e.service)} sent to worker {peer_text(e.worker)} "
        f"(attempt {e.attempt}, waited {_seconds(e.waited)})"
    ),
    "RequestRedispatched": lambda e: (
        f"request {e.request_id} for {_text(e.service)} is back in its queue: worker "
        f"{peer_text(e.lost_worker)} was lost (attempts so far: {e.attempts})"
    ),
    "RequestCompleted": lambda e: (
        f"request {e.request_id} for {_text(e.service)} answered by worker "
        f"{peer_text(e.worker)} in {_seconds(e.elapsed)} ({e.partials} partials, "
        f"{e.size} bytes)"
    ),
    "RequestExpired": lambda e: (
        f"request {e.request_id} for {_text(e.service)} from client {peer_text(e.client)} "
        f"expired after {_seconds(e.waited)} with no worker"
    ),
    "RequestDropped": lambda e: (
        f"request {e.request_id} for {_text(e.service)} from client {peer_text(e.client)} "
        f"dropped: {e.reason} ({e.rule})"
    ),
    "RequestRefused": lambda e: (
        f"request for {_text(e.service)} from client {peer_text(e.client)} refused: {e.reason} "
        f"({e.rule}; {e.size} bytes, {e.held} held)"
    ),
    "ConnectionClosed": lambda e: f"a connection on {e.endpoint} closed: {e.reason} ({e.rule})",
    "MmiReplied": lambda e: (
        f"client {peer_text(e.client)} asked {_text(e.service)} about {_text(e.query)}: "
        f"{_text(e.status).strip(chr(39))}"
    ),
    "ProtocolViolation": lambda e: (
        f"{'peer ' + peer_text(e.peer) if e.peer is not None else 'the broker'} broke "
        f"{e.rule}: {e.reason} ({e.action})"
    ),
    "ReconnectRequired": lambda e: (
        f"{e.reason}: reconnecting on a new socket in {_seconds(max(0.0, e.reconnect_at - e.at))}"
    ),
    "WorkerConnected": lambda e: f"connected; READY sent for {_text(e.service)}",
    "RequestReceived": lambda e: (
        f"request {e.number} from client {peer_text(e.client)} ({len(e.body)} frames)"
    ),
    "RequestAbandoned": lambda e: f"request from client {peer_text(e.client)} given up: {e.reason}",
}


def describe(event: object) -> str:
    """One readable line for ``event``, starting with its type's name."""
    name = type(event).__name__
    template = _TEMPLATES.get(name)
    if template is not None:
        try:
            return f"{name}: {template(event)}"
        except (AttributeError, TypeError, ValueError):
            pass
    return f"{name}: {_generic(event)}"


def _generic(event: object) -> str:
    if not dataclasses.is_dataclass(event):
        return str(event)
    parts = []
    for field in dataclasses.fields(event):
        if field.name == "at":
            continue
        value = getattr(event, field.name)
        if isinstance(value, bytes):
            shown = _text(value) if field.name in ("service", "query", "status") else value.hex()
        elif isinstance(value, tuple) and all(isinstance(v, bytes) for v in value):
            shown = f"{len(value)} frames, {sum(len(v) for v in value)} bytes"
        elif field.name in ("worker", "client", "peer", "lost_worker"):
            shown = peer_text(value)
        else:
            shown = str(value)
        parts.append(f"{field.name}={shown}")
    return " ".join(parts)


class HumanFormatter(logging.Formatter):
    """``2026-11-24 07:45:01.123 INFO domo.broker: message`` (local wall-clock time)."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S",
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per record; an event's name and fields are keys of their own."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        out: dict[str, object] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, EVENT_ATTRIBUTE, None)
        if event is not None and dataclasses.is_dataclass(event):
            out["event"] = type(event).__name__
            for field in dataclasses.fields(event):
                if field.name != "at":
                    out[field.name] = _jsonable(getattr(event, field.name))
        suppressed = getattr(record, "suppressed", None)
        if suppressed is not None:
            out["suppressed"] = suppressed
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _jsonable(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            return raw.hex()
        return text if text.isprintable() else raw.hex()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return peer_text(value)


def configure(level: str, log_format: str = "text", stream: IO[str] | None = None) -> None:
    """Log to ``stream`` (default stderr) at ``level`` in ``log_format`` (text or json)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else HumanFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
