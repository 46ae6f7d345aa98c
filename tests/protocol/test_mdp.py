"""The MDP/0.2 codec (``domo.protocol.mdp``) against the frame tables of ``specs/mdp-0.2.md`` §2.

- Round trips for every command, over generated services, addresses and bodies.
- Body frames pass through as the very same objects, both ways (MDP-S-03).
- ``parse`` of anything raises only ``MalformedMessage``, with a reason and a rule id of the spec.
- Near misses (one defect each in an otherwise valid message) fail with the rule they break.
- The wire layout of every command, written out byte by byte as RFC 18's frame tables give it.
- ``encode`` refuses what could not go on the wire (``LocalProtocolError``).
- ``validate_client`` / ``validate_worker`` (the broker's fast path) agree with ``parse``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from domo.protocol import LocalProtocolError, MalformedMessage, mdp
from domo.protocol.mdp import (
    ClientFinal,
    ClientPartial,
    ClientRequest,
    Command,
    WorkerDisconnect,
    WorkerFinal,
    WorkerHeartbeat,
    WorkerPartial,
    WorkerReady,
    WorkerRequest,
)

from .mdp_strategies import (
    BAD_ADDRESSES,
    BAD_HEADERS,
    BAD_SERVICES,
    NearMiss,
    addresses,
    bodies,
    client_commands,
    commands,
    fresh,
    near_misses,
    services,
    spec_rule_ids,
    worker_commands,
)

RULE_IDS = spec_rule_ids()

# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        st.builds(ClientRequest, services, bodies),
        st.builds(ClientPartial, services, bodies),
        st.builds(ClientFinal, services, bodies),
        st.builds(WorkerReady, services),
        st.builds(WorkerRequest, addresses, bodies),
        st.builds(WorkerPartial, addresses, bodies),
        st.builds(WorkerFinal, addresses, bodies),
        st.just(WorkerHeartbeat()),
        st.just(WorkerDisconnect()),
    ],
    ids=lambda s: repr(s).split("(")[1].split(",")[0],
)
@given(data=st.data())
def test_round_trip(strategy: st.SearchStrategy[Command], data: st.DataObject) -> None:
    """parse(encode(c)) == c for every command class (MDP-C-01..03, MDP-W-01..06)."""
    command = data.draw(strategy)
    frames = mdp.encode(command)
    assert isinstance(frames, tuple)
    assert all(type(frame) is bytes for frame in frames)
    parsed = mdp.parse(list(frames))
    assert type(parsed) is type(command)
    assert parsed == command
    assert mdp.parse(frames) == command
    assert mdp.encode(parsed) == frames
    if isinstance(command, ClientRequest | ClientPartial | ClientFinal):
        assert mdp.parse_client(frames) == command
        with pytest.raises(MalformedMessage) as error:
            mdp.parse_worker(frames)
        assert error.value.rule == "MDP-W-08"
    else:
        assert mdp.parse_worker(frames) == command
        with pytest.raises(MalformedMessage) as error:
            mdp.parse_client(frames)
        assert error.value.rule == "MDP-W-08"


@given(commands)
def test_body_frames_are_the_same_objects_both_ways(command: Command) -> None:
    """MDP-S-03: body frames are neither copied by encode nor by parse."""
    frames = mdp.encode(command)
    body: tuple[bytes, ...] = getattr(command, "body", ())
    assert body == () or len(body[0]) >= 2  # fresh objects: the identity check means something
    encoded_body = frames[len(frames) - len(body) :]
    assert all(a is b for a, b in zip(encoded_body, body, strict=True))
    received = [fresh(frame) for frame in frames]  # as a socket would deliver them
    parsed = mdp.parse(received)
    parsed_body: tuple[bytes, ...] = getattr(parsed, "body", ())
    assert all(
        a is b for a, b in zip(parsed_body, received[len(received) - len(body) :], strict=True)
    )
    assert parsed_body == body


def test_body_frames_pass_through_any_sequence_type() -> None:
    """MDP-S-03: a list, a tuple or a deque of frames; the body is a tuple of the same objects."""
    body = [fresh(b"first frame"), fresh(b"second")]
    for container in (list, tuple, deque):
        frames = container([b"MDPW02", b"\x04", b"client", b"", *body])
        parsed = mdp.parse(frames)
        assert isinstance(parsed, WorkerFinal)
        assert isinstance(parsed.body, tuple)
        assert parsed.body[0] is body[0]
        assert parsed.body[1] is body[1]


# --- the wire layouts of RFC 18, written out --------------------------------------------------

ADDRESS = b"\x00k\x8bEg"  # a ZeroMQ-generated routing id: five bytes, leading zero

WIRE_LAYOUTS: list[tuple[Command, tuple[bytes, ...]]] = [
    # MDP-C-01: "MDPC02", 0x01, service name, request body (1+ frames)
    (ClientRequest(b"echo", (b"Hello",)), (b"MDPC02", b"\x01", b"echo", b"Hello")),
    (
        ClientRequest(b"echo", (b"one", b"", b"three")),
        (b"MDPC02", b"\x01", b"echo", b"one", b"", b"three"),
    ),
    # MDP-C-02: "MDPC02", 0x02, service name, reply body
    (ClientPartial(b"db.query", (b"row 1",)), (b"MDPC02", b"\x02", b"db.query", b"row 1")),
    # MDP-C-03: "MDPC02", 0x03, service name, reply body (an empty frame is a valid body frame)
    (ClientFinal(b"db.query", (b"",)), (b"MDPC02", b"\x03", b"db.query", b"")),
    # MDP-W-01: "MDPW02", 0x01, service name: exactly three frames
    (WorkerReady(b"echo"), (b"MDPW02", b"\x01", b"echo")),
    # MDP-W-02: "MDPW02", 0x02, client address, empty delimiter, request body
    (
        WorkerRequest(ADDRESS, (b"Hello",)),
        (b"MDPW02", b"\x02", b"\x00k\x8bEg", b"", b"Hello"),
    ),
    # MDP-W-03: "MDPW02", 0x03, client address, empty delimiter, reply body
    (
        WorkerPartial(ADDRESS, (b"a", b"b")),
        (b"MDPW02", b"\x03", b"\x00k\x8bEg", b"", b"a", b"b"),
    ),
    # MDP-W-04: "MDPW02", 0x04, client address, empty delimiter, reply body
    (WorkerFinal(b"c", (b"done",)), (b"MDPW02", b"\x04", b"c", b"", b"done")),
    # MDP-W-05: "MDPW02", 0x05: exactly two frames
    (WorkerHeartbeat(), (b"MDPW02", b"\x05")),
    # MDP-W-06: "MDPW02", 0x06: exactly two frames
    (WorkerDisconnect(), (b"MDPW02", b"\x06")),
]


@pytest.mark.parametrize(("command", "wire"), WIRE_LAYOUTS)
def test_wire_layout_is_exactly_the_rfc_frame_table(
    command: Command, wire: tuple[bytes, ...]
) -> None:
    """MDP-C-01..03, MDP-W-01..06, MDP-R-02: no leading empty frame, one-byte codes."""
    assert len(wire[0]) == 6
    assert len(wire[1]) == 1
    assert mdp.encode(command) == wire
    assert mdp.parse(list(wire)) == command


def test_header_constants() -> None:
    """MDP-C-01, MDP-W-01: six bytes each, "MDPC02" and "MDPW02"."""
    assert mdp.CLIENT_HEADER == b"MDPC02"
    assert mdp.WORKER_HEADER == b"MDPW02"


# --- anything in, only MalformedMessage out ---------------------------------------------------


def parse_or_error(frames: object) -> Command | MalformedMessage:
    """What ``parse`` returns, or the ``MalformedMessage`` it raises; anything else propagates."""
    try:
        return mdp.parse(frames)  # type: ignore[arg-type]
    except MalformedMessage as error:
        return error


_HEADERS = st.sampled_from([b"MDPC02", b"MDPW02", b"MDPC01", b"MDPW01", b"", b"MDPW02\x00"])
_CODES = st.sampled_from([b"\x00", b"\x01", b"\x02", b"\x03", b"\x04", b"\x05", b"\x06", b"\x07"])
_SMALL_FRAMES = st.one_of(
    st.sampled_from([b"", b"echo", b"\x00", b"\x7f", b"a" * 256, b"a" * 255]),
    st.binary(max_size=6),
)
_LOOKS_LIKE_MDP = st.builds(
    lambda header, code, rest: [header, code, *rest],
    _HEADERS,
    st.one_of(_CODES, st.binary(max_size=2)),
    st.lists(_SMALL_FRAMES, max_size=5),
)
_NOT_BYTES = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=4),
    st.builds(bytearray, st.binary(max_size=4)),
    st.binary(max_size=4).map(lambda data: memoryview(data)),
    st.floats(allow_nan=False),
)
_FRAME_LISTS = st.one_of(
    st.lists(st.binary(max_size=8), max_size=8),
    _LOOKS_LIKE_MDP,
    st.builds(
        lambda frames, index, bad: [*frames[:index], bad, *frames[index:]],
        _LOOKS_LIKE_MDP,
        st.integers(0, 6),
        _NOT_BYTES,
    ),
)
ANY_INPUT = st.one_of(
    _FRAME_LISTS,
    _FRAME_LISTS.map(tuple),
    _FRAME_LISTS.map(deque),
    _NOT_BYTES,
    st.binary(max_size=8),
    st.dictionaries(st.binary(max_size=2), st.binary(max_size=2), max_size=2),
    st.frozensets(st.binary(max_size=2), max_size=2),
    st.lists(_NOT_BYTES, max_size=3),
)


@given(ANY_INPUT)
@example([])
@example(())
@example(None)
@example(b"MDPC02")
@example("MDPC02")
@example([b"MDPC02"])
@example([b"MDPW02"])
@example(["MDPC02", b"\x01", b"echo", b"x"])
@example([b"MDPC02", b"\x01", "echo", b"x"])
@example([b"MDPW02", b"\x02", b"addr", b"", "body"])
@example(range(4))
@example(iter([b"MDPW02", b"\x05"]))
def test_parse_raises_only_malformed_message(frames: object) -> None:
    """MDP-W-08: whatever the input, parse returns a command or raises MalformedMessage.

    A success must be the one command those frames encode; a failure has a reason a person can
    read and names a rule that exists in the spec.
    """
    outcome = parse_or_error(frames)
    if isinstance(outcome, MalformedMessage):
        assert outcome.reason
        assert str(outcome) == outcome.reason
        assert outcome.rule in RULE_IDS, outcome.rule
    else:
        assert isinstance(frames, list | tuple | deque)
        assert mdp.encode(outcome) == tuple(frames)


# --- near misses: one defect each, the rule it breaks -----------------------------------------


SAMPLE_COMMANDS = [command for command, _ in WIRE_LAYOUTS]


def _check_near_miss(miss: NearMiss) -> None:
    with pytest.raises(MalformedMessage) as error:
        mdp.parse(list(miss.frames))
    assert error.value.rule == miss.rule, (miss.what, error.value.reason)
    assert error.value.reason
    if miss.frames[0] == mdp.CLIENT_HEADER:
        with pytest.raises(MalformedMessage) as again:
            mdp.validate_client(miss.frames)
        assert again.value.rule == miss.rule
    elif miss.frames[0] == mdp.WORKER_HEADER:
        with pytest.raises(MalformedMessage) as again:
            mdp.validate_worker(miss.frames)
        assert again.value.rule == miss.rule


@pytest.mark.parametrize("command", SAMPLE_COMMANDS, ids=repr)
def test_near_misses_of_each_command(command: Command) -> None:
    """MDP-C-01..03, MDP-W-01..06, MDP-W-08, MDP-R-02, MDP-D-01, MDP-D-02: one defect, one rule."""
    misses = near_misses(command)
    assert len(misses) >= len(BAD_HEADERS) + 5
    for miss in misses:
        _check_near_miss(miss)


@given(commands)
def test_near_misses_of_generated_commands(command: Command) -> None:
    """The same near misses, around generated services, addresses and bodies."""
    for miss in near_misses(command):
        _check_near_miss(miss)


@given(st.one_of(client_commands, worker_commands), st.binary(max_size=4))
def test_one_more_body_frame_is_still_valid(command: Command, extra: bytes) -> None:
    """MDP-C-01, MDP-W-02: a body is one or more frames, so an extra frame joins the body."""
    frames = mdp.encode(command)
    if not hasattr(command, "body"):
        return
    parsed = mdp.parse([*frames, extra])
    assert type(parsed) is type(command)
    assert parsed.body == (*command.body, extra)  # type: ignore[union-attr]


def test_a_worker_message_missing_its_delimiter_is_never_read_as_valid() -> None:
    """MDP-R-02: without the empty frame the first body frame would be taken as the delimiter."""
    with pytest.raises(MalformedMessage) as error:
        mdp.parse([b"MDPW02", b"\x04", b"client", b"reply", b"more"])
    assert error.value.rule == "MDP-R-02"


@pytest.mark.parametrize("length", [1, 2, 254, 255])
def test_service_and_address_boundaries_are_valid(length: int) -> None:
    """MDP-D-01, MDP-D-02: 1 to 255 bytes inclusive."""
    service = b"s" * length
    address = b"\xfe" * length
    assert mdp.is_valid_service(service)
    assert mdp.is_valid_address(address)
    assert mdp.parse([b"MDPW02", b"\x01", service]) == WorkerReady(service)
    assert mdp.parse([b"MDPC02", b"\x01", service, b"x"]) == ClientRequest(service, (b"x",))
    assert mdp.parse([b"MDPW02", b"\x02", address, b"", b"x"]) == WorkerRequest(address, (b"x",))


@pytest.mark.parametrize("byte", range(256))
def test_printable_means_ascii_0x20_to_0x7e(byte: int) -> None:
    """MDP-D-01, MDP-C-09: each byte of a service name is printable ASCII, nothing else."""
    service = b"svc" + bytes([byte])
    printable = 0x20 <= byte <= 0x7E
    assert mdp.is_valid_service(service) is printable
    frames = [b"MDPC02", b"\x01", service, b"body"]
    if printable:
        assert mdp.parse(frames) == ClientRequest(service, (b"body",))
    else:
        with pytest.raises(MalformedMessage) as error:
            mdp.parse(frames)
        assert error.value.rule == "MDP-D-01"


# --- encode refuses invalid commands ----------------------------------------------------------

INVALID_COMMANDS: list[object] = [
    *(
        cls(bad, (b"x",))
        for cls in (ClientRequest, ClientPartial, ClientFinal)
        for bad in BAD_SERVICES
    ),
    *(WorkerReady(bad) for bad in BAD_SERVICES),
    *(
        cls(bad, (b"x",))
        for cls in (WorkerRequest, WorkerPartial, WorkerFinal)
        for bad in BAD_ADDRESSES
    ),
    ClientRequest("echo", (b"x",)),  # type: ignore[arg-type]
    WorkerReady("echo"),  # type: ignore[arg-type]
    WorkerRequest("client", (b"x",)),  # type: ignore[arg-type]
    *(cls(b"echo", ()) for cls in (ClientRequest, ClientPartial, ClientFinal)),
    *(cls(b"client", ()) for cls in (WorkerRequest, WorkerPartial, WorkerFinal)),
    ClientRequest(b"echo", b"not a sequence of frames"),  # type: ignore[arg-type]
    ClientRequest(b"echo", "text"),  # type: ignore[arg-type]
    ClientRequest(b"echo", None),  # type: ignore[arg-type]
    ClientRequest(b"echo", ("text frame",)),  # type: ignore[arg-type]
    WorkerFinal(b"client", (b"ok", bytearray(b"not bytes"))),  # type: ignore[arg-type]
    WorkerPartial(b"client", (b"ok", None)),  # type: ignore[arg-type]
    "not a command",
    None,
    (b"MDPW02", b"\x05"),
]


@pytest.mark.parametrize("command", INVALID_COMMANDS, ids=repr)
def test_encode_refuses_invalid_commands(command: object) -> None:
    """MDP-D-01, MDP-D-02, MDP-C-01: what the local application supplies is checked."""
    with pytest.raises(LocalProtocolError):
        mdp.encode(command)  # type: ignore[arg-type]


def test_encode_accepts_a_list_body_and_returns_a_tuple() -> None:
    """MDP-S-03: the body may be any sequence of bytes; its frames go out as they are."""
    body = [fresh(b"one frame"), fresh(b"another")]
    frames = mdp.encode(ClientRequest(b"echo", body))  # type: ignore[arg-type]
    assert frames == (b"MDPC02", b"\x01", b"echo", b"one frame", b"another")
    assert frames[3] is body[0]
    assert frames[4] is body[1]


# --- the broker's fast path agrees with parse -------------------------------------------------

_WITH_A_HEADER = st.one_of(
    commands.map(lambda command: list(mdp.encode(command))),
    commands.flatmap(lambda command: st.sampled_from(near_misses(command))).map(
        lambda miss: list(miss.frames)
    ),
    _LOOKS_LIKE_MDP,
)


@given(_WITH_A_HEADER)
def test_validate_agrees_with_parse(frames: list[bytes]) -> None:
    """MDP-W-08: validate_client/validate_worker accept exactly what parse accepts."""
    if not frames or frames[0] not in (mdp.CLIENT_HEADER, mdp.WORKER_HEADER):
        with pytest.raises(MalformedMessage):
            mdp.parse(frames)
        return
    validate = mdp.validate_client if frames[0] == mdp.CLIENT_HEADER else mdp.validate_worker
    outcome = parse_or_error(frames)
    if isinstance(outcome, MalformedMessage):
        with pytest.raises(MalformedMessage) as validate_error:
            validate(frames)
        assert validate_error.value.rule == outcome.rule
    else:
        assert validate(frames) == frames[1]
        assert mdp.encode(outcome)[:2] == (frames[0], frames[1])


def _frames_of(command: Command) -> Sequence[bytes]:
    return mdp.encode(command)


@pytest.mark.parametrize("command", SAMPLE_COMMANDS, ids=repr)
def test_validate_returns_the_command_code(command: Command) -> None:
    """MDP-C-01..03, MDP-W-01..06: the code frame says which command it is."""
    frames = _frames_of(command)
    if frames[0] == mdp.CLIENT_HEADER:
        assert mdp.validate_client(frames) == frames[1]
    else:
        assert mdp.validate_worker(frames) == frames[1]


@pytest.mark.parametrize(
    ("frames", "index"),
    [
        ([memoryview(b"MDPC02"), b"\x01", b"echo", b"x"], 0),
        ([b"MDPC02", memoryview(b"\x01"), b"echo", b"x"], 1),
        ([memoryview(b"MDPW02"), b"\x05"], 0),
        ([b"MDPW02", memoryview(b"\x05")], 1),
    ],
)
def test_header_and_command_frames_must_be_bytes(frames: list[mdp.BodyFrame], index: int) -> None:
    """MDP-W-08: only a body frame may be a view; a header or command frame that is one makes
    the message malformed, for clients and workers alike (named by its index)."""
    validate = mdp.validate_client if frames[0] == mdp.CLIENT_HEADER else mdp.validate_worker
    with pytest.raises(MalformedMessage) as error:
        validate(frames)
    assert error.value.rule == "MDP-W-08"
    assert f"frame {index} is " in str(error.value)
