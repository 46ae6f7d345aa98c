"""eMQP/1.0 as EventMQ 0.3.13 speaks it (``specs/emqp-1.0.md``): frames, checks, codec record.

Every eMQP message is ``"", "eMQP/1.0", COMMAND, MSGID, body...`` from a DEALER (EMQP-01). This
module is the pure half of the dialect: the command names, the checks of what a peer sends
(queues of an INFORM, a REQUEST's queue, headers and job), and the ``DialectCodec`` record the
registry detects eMQP peers by. What needs memory (a worker's credits and queues, message ids,
receipts, results, the broker's heartbeats) is ``domo.protocol.emqp_bridge``, which
``FamilyBroker`` hands every eMQP message to. Nothing here keeps state, does I/O or reads a
clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..mdp import BodyFrame, Relayed
from .base import (
    Capabilities,
    Command,
    CoreCommand,
    Dialect,
    DialectCodec,
    Invalid,
    Lookup,
    Role,
    RouteView,
)

__all__ = [
    "ACK",
    "DEFAULT_QUEUES",
    "DISCONNECT",
    "EMQP",
    "EMQP_HEADER",
    "HEARTBEAT",
    "INFORM",
    "KBAI",
    "KBYE",
    "MAX_QUEUES",
    "PUBLISH",
    "READY",
    "REPLY",
    "REQUEST",
    "SCHEDULE",
    "UNSCHEDULE",
    "BadInput",
    "check_job",
    "check_msgid",
    "check_request",
    "error_body",
    "parse_queues",
    "reply_requested",
]

EMQP_HEADER = b"eMQP/1.0"

INFORM, READY, REQUEST, REPLY = b"INFORM", b"READY", b"REQUEST", b"REPLY"
HEARTBEAT, ACK, DISCONNECT = b"HEARTBEAT", b"ACK", b"DISCONNECT"
KBYE, KBAI = b"KBYE", b"KBAI"  # 0.3.13 sends KBYE; the spec text says KBAI (EMQP-16)
SCHEDULE, UNSCHEDULE, PUBLISH = b"SCHEDULE", b"UNSCHEDULE", b"PUBLISH"

CLIENT_COMMANDS = frozenset({REQUEST, SCHEDULE, UNSCHEDULE, PUBLISH})

DEFAULT_QUEUES: tuple[tuple[int, bytes], ...] = ((10, b"default"),)  # EMQP-03: INFORM with ""
MAX_QUEUES = 16  # queues one worker may name (EMQP-03): its slots cost one key per queue
MAX_NAME = 255  # bytes in a queue name or a message id, as MDP's service names
_RESERVED = b"mmi."


class BadInput(ValueError):
    """What a peer sent breaks a rule; ``rule`` names it, the message says why."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule = rule
        self.reason = reason


def _text(frame: BodyFrame, what: str, rule: str) -> str:
    try:
        return bytes(frame).decode("utf-8")
    except UnicodeDecodeError:
        # EventMQ's peers decode every frame they receive: one that is not UTF-8 stops them.
        raise BadInput(rule, f"{what} is not UTF-8") from None


def check_msgid(frame: BodyFrame) -> bytes:
    """A peer's MSGID (EMQP-02): 1 to 255 bytes of UTF-8 text with no NUL."""
    msgid = bytes(frame)
    if not 0 < len(msgid) <= MAX_NAME or b"\x00" in msgid:
        raise BadInput("EMQP-02", "MSGID must be 1 to 255 bytes with no NUL")
    _text(msgid, "MSGID", "EMQP-02")
    return msgid


def _queue_name(name: object) -> bytes:
    if not isinstance(name, str):
        raise BadInput("EMQP-03", "a queue name must be a string")
    encoded = name.encode("utf-8")
    if not 0 < len(encoded) <= MAX_NAME or encoded.startswith(_RESERVED) or "," in name:
        raise BadInput("EMQP-03", f"bad queue name {name!r}")
    return encoded


def parse_queues(frame: BodyFrame) -> tuple[tuple[int, bytes], ...]:
    """An INFORM's queues (EMQP-03): ``[[weight, name], ...]`` as JSON (0.3.13), names
    separated by commas (the spec's text; weight 10 each), or ``""`` for ``DEFAULT_QUEUES``."""
    text = _text(frame, "INFORM queues", "EMQP-03").strip()
    if not text:
        return DEFAULT_QUEUES
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            raise BadInput("EMQP-03", "INFORM queues are not valid JSON") from None
        if not isinstance(value, list) or not value:
            raise BadInput("EMQP-03", "INFORM queues must be a non-empty JSON list")
        queues = []
        for item in value:
            if not isinstance(item, list) or len(item) != 2:
                raise BadInput("EMQP-03", "each INFORM queue is [weight, name]")
            weight, name = item
            if not isinstance(weight, int) or isinstance(weight, bool):
                raise BadInput("EMQP-03", "a queue weight must be an integer")
            queues.append((weight, _queue_name(name)))
    else:
        queues = [(10, _queue_name(name.strip())) for name in text.split(",")]
    names = [name for _, name in queues]
    if len(names) > MAX_QUEUES:
        raise BadInput("EMQP-03", f"more than {MAX_QUEUES} queues")
    if len(set(names)) != len(names):
        raise BadInput("EMQP-03", "a queue is named twice")
    return tuple(queues)


def reply_requested(headers: BodyFrame) -> bool:
    """Whether a REQUEST's headers (comma-separated) ask for the result (EMQP-12)."""
    return b"reply-requested" in bytes(headers).split(b",")


def _check_headers(frame: BodyFrame) -> None:
    text = _text(frame, "headers", "EMQP-09")
    for header in text.split(","):
        if "timeout:" in header:
            # EventMQ's jobmanager reads int() of what follows any "timeout:" and stops on
            # anything else; the broker refuses such a header rather than hand it on (EMQP-09).
            name, _, value = header.partition(":")
            if name != "timeout" or not value.isdigit() or not value.isascii() or len(value) > 9:
                raise BadInput("EMQP-09", f"bad timeout header {header!r}")


def check_job(frame: BodyFrame) -> None:
    """A job as EventMQ's jobmanager reads it (EMQP-09): JSON ``[command, {options}, ...]``."""
    text = _text(frame, "the message", "EMQP-09")
    try:
        value = json.loads(text)
    except ValueError:
        raise BadInput("EMQP-09", "the message is not valid JSON") from None
    if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], dict):
        raise BadInput("EMQP-09", "the message must be a JSON list [command, {options}]")


def check_request(message: Sequence[BodyFrame]) -> tuple[bytes, bytes, bytes, Relayed]:
    """A client's REQUEST (``eMQP/1.0, REQUEST, msgid, queue, headers, msg, ...``) as
    (msgid, queue, headers, body), or ``BadInput`` (EMQP-08, EMQP-09)."""
    if len(message) < 6:
        raise BadInput("EMQP-08", "REQUEST needs MSGID, queue, headers and message")
    msgid = check_msgid(message[2])
    queue = bytes(message[3])
    if not 0 < len(queue) <= MAX_NAME:
        raise BadInput("EMQP-09", "the queue name must be 1 to 255 bytes")
    _text(queue, "the queue name", "EMQP-09")
    headers = bytes(message[4])
    _check_headers(headers)
    body = tuple(message[5:])
    for extra in body[1:]:
        _text(extra, "a frame after the message", "EMQP-09")
    if not queue.startswith(_RESERVED):  # mmi.* questions are the broker's, not a job (EMQP-25)
        check_job(body[0])
    return msgid, queue, headers, body


def error_body(reason: str) -> bytes:
    """The result the broker answers a refused message with (EMQP-09, EMQP-17): a JSON object
    with ``error``, where EventMQ's results have ``value``."""
    return json.dumps({"error": reason}).encode()


# -- the codec record (detection; the bridge does the translating) ---------------------------


def _claims(header: BodyFrame, command: BodyFrame) -> Role | None:
    if header != EMQP_HEADER:
        return None
    return Role.CLIENT if command in CLIENT_COMMANDS else Role.WORKER  # EMQP-01


def _decode(message: Sequence[BodyFrame]) -> CoreCommand | Invalid:
    # A REQUEST as the core's (EMQP-08); the bridge decodes everything else itself.
    if len(message) >= 5 and message[1] == REQUEST:
        return CoreCommand(Role.CLIENT, Command.REQUEST, bytes(message[2]), b"", tuple(message[4:]))
    return Invalid("EMQP-18", "not a command the codec reads alone: the bridge does")


def _encode(route: RouteView, command: CoreCommand, lookup: Lookup) -> Relayed | None:
    # A FINAL to a client as its result (EMQP-12); the bridge encodes with the state it keeps.
    if command.role is not Role.CLIENT:
        return None
    msgid = route.request_key or b""
    result = command.body[0] if command.body else b""
    return (b"", EMQP_HEADER, REPLY, msgid, result, msgid)


def _request_key(message: Sequence[BodyFrame]) -> tuple[bytes, list[BodyFrame]] | None:
    if len(message) >= 3 and message[1] == REQUEST:
        return bytes(message[2]), [message[0], message[1], *message[3:]]  # EMQP-08
    return None


EMQP = DialectCodec(
    dialect=Dialect.EMQP,
    capabilities=Capabilities(
        clients=True,
        workers=True,
        partial_replies=False,  # EMQP-21: one result per request
        worker_heartbeats=True,  # EMQP-15
        broker_heartbeats=True,  # EMQP-15: and first, before the worker does any work
        disconnect=True,  # EMQP-16: KBYE
        mmi=True,  # EMQP-25
        outstanding_per_client=None,  # EMQP-08: requests are keyed by their MSGID
        client_hops=False,  # a DEALER; its leading empty frame is not a delimiter
    ),
    claims=_claims,
    decode=_decode,
    encode=_encode,
    request_key=_request_key,
)
