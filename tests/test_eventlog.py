"""``domo.eventlog``: one readable line per event (hex peers, no monotonic clock), levels that
fit, and one JSON object per line for machines."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from domo import eventlog
from domo.protocol.dialects import Dialect
from domo.protocol.events import (
    ConnectionClosed,
    MmiReplied,
    ProtocolViolation,
    ReconnectRequired,
    RequestCompleted,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    WorkerConnected,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)
from domo.protocol.family import peer_key

W = b"\x00k\x8bEg"  # a ROUTER identity as libzmq makes them: binary
# The keys the broker knows peers of other dialects by (domo.protocol.family.peer_key).
OLD = peer_key(W, (), Dialect.MDP01)
PROXIED = peer_key(W, (b"\x00\x80\x00\x00\x01",), Dialect.MDP02_REQ, 2, b"\x01\x02")


@pytest.mark.parametrize(
    ("event", "line"),
    [
        (
            WorkerRegistered(worker=W, service=b"echo", at=74769.53),
            "WorkerRegistered: worker 006b8b4567 serves 'echo'",
        ),
        (
            WorkerRegistered(worker=OLD, service=b"echo", at=1.0),
            "WorkerRegistered: worker mdp01 0/006b8b4567 serves 'echo'",  # not 33 bytes of hex
        ),
        (
            RequestQueued(request_id=3, client=PROXIED, service=b"echo", size=2, at=1.0),
            "RequestQueued: request 3 from client mdp02-req 2/006b8b4567/0080000001#0102 queued "
            "for 'echo' (2 bytes)",
        ),
        (
            WorkerConnected(service=b"echo", at=1.0),
            "WorkerConnected: READY sent for 'echo' on a new connection; waiting for the broker "
            "to answer (a broker's first HEARTBEAT comes one interval later)",
        ),
        (
            WorkerExpired(worker=W, service=b"echo", last_heard=10.0, at=17.5),
            "WorkerExpired: worker 006b8b4567 ('echo') expired: nothing heard from it for 7.50 s "
            "(it stopped or hung, or its heartbeat interval is longer than this broker's: they "
            "must match)",
        ),
        (
            WorkerDisconnected(
                worker=W, service=b"echo", reason="unexpected-command", disconnect_sent=True, at=1
            ),
            "WorkerDisconnected: worker 006b8b4567 ('echo') left: unexpected-command; "
            "DISCONNECT sent",
        ),
        (
            RequestCompleted(
                request_id=7,
                client=b"\x01",
                service=b"echo",
                worker=W,
                partials=2,
                size=10,
                elapsed=0.0125,
                at=3.0,
            ),
            "RequestCompleted: request 7 for 'echo' answered by worker 006b8b4567 in 12.5 ms "
            "(2 partials, 10 bytes)",
        ),
        (
            RequestExpired(request_id=8, client=b"\xff", service=b"nope", waited=30.0, at=1.0),
            "RequestExpired: request 8 for 'nope' from client ff expired after 30.00 s with no "
            "worker",
        ),
        (
            MmiReplied(client=b"\x02", service=b"mmi.service", query=b"x", status=b"404", at=1),
            "MmiReplied: client 02 asked 'mmi.service' about 'x': 404",
        ),
        (
            ProtocolViolation(
                peer=W,
                rule="MDP-H-01",
                reason="HEARTBEAT from an unknown peer",
                action="disconnected",
                at=1.0,
            ),
            "ProtocolViolation: peer 006b8b4567 broke MDP-H-01: HEARTBEAT from an unknown peer "
            "(disconnected)",
        ),
        (
            ReconnectRequired(reason="broker-lost", reconnect_at=12.5, at=10.0),
            "ReconnectRequired: broker-lost: reconnecting on a new socket in 2.50 s",
        ),
    ],
)
def test_each_event_is_one_readable_line(event: object, line: str) -> None:
    described = eventlog.describe(event)
    assert described == line
    assert "\n" not in described
    assert "b'" not in described
    assert "74769" not in described  # the monotonic clock says nothing to a person


def test_peer_ids_are_hex_and_pairs_are_joined() -> None:
    assert eventlog.peer_text(W) == "006b8b4567"
    assert eventlog.peer_text((0, W)) == "0/006b8b4567"
    assert eventlog.peer_text(None) == "-"


def test_per_request_events_are_debug_and_losses_warn() -> None:
    expired = RequestExpired(request_id=1, client=b"c", service=b"s", waited=1.0, at=1.0)
    dropped = RequestDropped(
        request_id=1,
        client=b"c",
        service=b"s",
        reason="redispatch-limit",
        worker=None,
        rule="MDP-D-08",
        at=1.0,
    )
    registered = WorkerRegistered(worker=W, service=b"s", at=1.0)
    assert eventlog.level_of(expired) == logging.DEBUG
    assert eventlog.level_of(dropped) == logging.WARNING
    assert eventlog.level_of(registered) == logging.INFO


def test_an_event_whose_template_no_longer_fits_falls_back_to_its_fields() -> None:
    class WorkerRegistered:  # same name, other fields: the log must not break
        def __init__(self) -> None:
            self.who = "x"

    assert eventlog.describe(WorkerRegistered()).startswith("WorkerRegistered: ")


def test_json_lines_carry_the_event_and_its_fields(capsys: pytest.CaptureFixture[str]) -> None:
    stream = io.StringIO()
    logger = logging.getLogger("domo.test.eventlog")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(eventlog.JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        eventlog.log_event(logger, WorkerRegistered(worker=W, service=b"echo", at=5.0))
    finally:
        logger.removeHandler(handler)
    record = json.loads(stream.getvalue())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record.pop("time"))
    assert record == {
        "level": "info",
        "logger": "domo.test.eventlog",
        "message": "WorkerRegistered: worker 006b8b4567 serves 'echo'",
        "event": "WorkerRegistered",
        "worker": "006b8b4567",
        "service": "echo",
    }


def test_human_lines_start_with_wall_clock_time() -> None:
    record = logging.LogRecord("domo.broker", logging.INFO, __file__, 1, "%s", ("hi",), None)
    line = eventlog.HumanFormatter().format(record)
    pattern = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d INFO domo\.broker: hi"
    assert re.fullmatch(pattern, line)  # with the zone: lines from anywhere line up


def test_a_flood_of_violations_is_rate_limited_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One peer's junk at line rate: 10 lines per rule per second, then the count left out."""
    now = [100.0]
    monkeypatch.setattr(eventlog, "VIOLATIONS", eventlog.ViolationLimiter(clock=lambda: now[0]))
    stream = io.StringIO()
    logger = logging.getLogger("domo.test.flood")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)

    def junk(rule: str) -> ProtocolViolation:
        return ProtocolViolation(peer=W, rule=rule, reason="junk", action="dropped", at=1.0)

    try:
        for _ in range(1000):
            eventlog.log_event(logger, junk("MDP-W-08"))
        eventlog.log_event(logger, junk("MDP-D-01"))  # another rule has its own allowance
        now[0] += 1.0
        eventlog.log_event(logger, junk("MDP-W-08"))
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 12
    assert sum("MDP-W-08" in line for line in lines) == 11
    assert lines[10].startswith("ProtocolViolation: peer 006b8b4567 broke MDP-D-01")
    assert lines[11].endswith(
        "(and 990 more violations of MDP-W-08 left out of the log in the last 1 s)"
    )
    registered = WorkerRegistered(worker=W, service=b"s", at=1.0)
    assert eventlog.VIOLATIONS.admit("MDP-W-08") == (True, 0)  # others are never limited
    stream2 = io.StringIO()
    handler2 = logging.StreamHandler(stream2)
    logger.addHandler(handler2)
    try:
        for _ in range(50):
            eventlog.log_event(logger, registered)
    finally:
        logger.removeHandler(handler2)
    assert len(stream2.getvalue().splitlines()) == 50


def test_closed_connections_are_rate_limited_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """MDP-D-31: every client that leaves closes a connection, so ConnectionClosed writes one
    line a minute (the close it may mean, MDP-D-25, is rare), then the count of those left
    out; a busy broker's log is not one line per call (issue 24)."""
    now = [100.0]
    closes = eventlog.ViolationLimiter(burst=1, window=60.0, clock=lambda: now[0])
    monkeypatch.setattr(eventlog, "CLOSES", closes)
    stream = io.StringIO()
    logger = logging.getLogger("domo.test.closed")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    closed = ConnectionClosed("tcp://127.0.0.1:5555", "by its peer, or by ZeroMQ", "MDP-D-31", 1.0)
    try:
        for _ in range(100):
            eventlog.log_event(logger, closed)
            now[0] += 0.5  # 100 closes in 50 s: one line
        now[0] += 10.0
        eventlog.log_event(logger, closed)  # a minute after the first: one more, with the count
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0] == (
        "ConnectionClosed: a connection on tcp://127.0.0.1:5555 closed: by its peer, or by "
        "ZeroMQ (MDP-D-31)"
    )
    assert lines[1].endswith(
        "(and 99 more connections closed of MDP-D-31 left out of the log in the last 60 s)"
    )
    assert eventlog.CLOSES is closes
    assert eventlog.VIOLATIONS is not closes  # violations keep their 10 a second
