"""Each dialect's codec table (``DialectCodec.table``) is what its codec does, and all of it.

- every inbound row: the message it describes is claimed by its dialect (behind an address
  frame for a client that may have hops) and decodes into the neutral command it names, with
  the command's arguments kept (FAM-10);
- every command code of a side that has no inbound row decodes as invalid, which the core
  refuses (MDP01-06, MDP-W-08, MDP-C-01);
- every command the core sends a side of the dialect has exactly one outbound row, and the codec
  encodes it as the row says (or withholds it: MDP01-05, REQREP-05);
- the specs show the tables as the code has them (MAJ-01..04, MDP01-02..08, REQREP-01, 04, 05).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from domo.protocol.dialects import (
    REGISTRY,
    Command,
    CoreCommand,
    Dialect,
    DialectCodec,
    Invalid,
    Role,
    Translation,
    withheld,
)
from domo.protocol.mdp import Relayed
from domo.spec_tables import (
    DIALECT_BEGIN,
    DIALECT_END,
    DIALECT_SPECS,
    extract_block,
    main,
    render_dialect_block,
)

ROOT = Path(__file__).resolve().parents[2]
CODECS = {str(codec.dialect.value): codec for codec in REGISTRY.codecs}
# The dialects whose codecs give a table; every one the spec blocks name has one.
TABLED = tuple(codec for codec in REGISTRY.codecs if codec.table)
SENT_TO = {  # what the core sends each side
    Role.WORKER: (Command.REQUEST, Command.HEARTBEAT, Command.LEAVE),
    Role.CLIENT: (Command.PARTIAL, Command.FINAL),
}


def arguments(role: Role, command: Command, inbound: bool) -> list[bytes]:
    """The frames after the command, in RFC 18's layout, which the MDP kin share."""
    if role is Role.WORKER:
        if command is Command.REGISTER:
            return [b"echo"]
        if command in (Command.HEARTBEAT, Command.LEAVE):
            return []
        return [b"client-address", b"", b"body"]
    return [b"echo", b"body"]


def rows(inbound: bool) -> list[tuple[DialectCodec, Translation]]:
    return [(codec, row) for codec in TABLED for row in codec.table if row.inbound is inbound]


def test_the_dialects_of_the_specs_have_tables() -> None:
    """MDP/0.2, MDP/0.1, majortomo and REQ clients: every spec block has its dialect's table."""
    named = {value for values in DIALECT_SPECS.values() for value in values}
    assert named == {"mdp02", "mdp02-req", "mdp01", "majortomo"}
    assert all(CODECS[value].table for value in named)


@pytest.mark.parametrize(("codec", "row"), rows(inbound=True))
def test_inbound_row_is_claimed_and_decoded_as_it_says(
    codec: DialectCodec, row: Translation
) -> None:
    assert row.frames is not None
    args = arguments(row.role, row.command, inbound=True)
    hops = [b"hop-1"] if row.role is Role.CLIENT and codec.capabilities.client_hops else []
    found = REGISTRY.detect([*hops, *row.frames, *args])
    assert found is not None
    assert (found[0].dialect, found[1]) == (codec.dialect, len(hops))
    message = [*row.frames, *args][1:] if codec.delimited else [*row.frames, *args]
    assert codec.decode(message) == neutral(row.role, row.command)


def neutral(role: Role, command: Command) -> CoreCommand:
    """The neutral command of ``arguments``'s frames."""
    if role is Role.CLIENT:
        return CoreCommand(role, command, b"echo", b"", (b"body",))
    if command is Command.REGISTER:
        return CoreCommand(role, command, b"echo")
    if command in (Command.HEARTBEAT, Command.LEAVE):
        return CoreCommand(role, command)
    return CoreCommand(role, command, b"", b"client-address", (b"body",))


@pytest.mark.parametrize("codec", TABLED, ids=lambda codec: str(codec.dialect.value))
def test_a_command_code_without_a_row_is_refused_by_the_core(codec: DialectCodec) -> None:
    """MDP01-06, MDP-W-08, MDP-C-01: no row, no core command."""
    for role in (Role.WORKER, Role.CLIENT):
        inbound = [row for row in codec.table if row.inbound and row.role is role]
        coded = [row for row in inbound if row.frames is not None and len(row.frames) > 2]
        if not coded:
            continue  # MDP/0.1's REQ client has no command frame: every REQUEST is one
        assert row_frames_share_a_prefix(coded)
        prefix = list(coded[0].frames or ())[:-1]
        known = {(row.frames or ())[-1] for row in coded}
        for value in range(256):
            code = bytes([value])
            if code in known:
                continue
            message = [*prefix, code, b"x", b"", b"y"]
            decoded = codec.decode(message[1:] if codec.delimited else message)
            assert isinstance(decoded, Invalid), (role, code)


def row_frames_share_a_prefix(coded: list[Translation]) -> bool:
    return len({tuple((row.frames or ())[:-1]) for row in coded}) == 1


@pytest.mark.parametrize("codec", TABLED, ids=lambda codec: str(codec.dialect.value))
def test_every_command_the_core_sends_has_one_outbound_row(codec: DialectCodec) -> None:
    sides = [Role.WORKER] if codec.capabilities.workers else []
    sides += [Role.CLIENT] if codec.capabilities.clients else []
    for role in sides:
        for command in SENT_TO[role]:
            found = [
                row
                for row in codec.table
                if not row.inbound and row.role is role and row.command is command
            ]
            assert len(found) == 1, (codec.dialect, role, command)


@pytest.mark.parametrize(("codec", "row"), rows(inbound=False))
def test_outbound_row_is_encoded_as_it_says(codec: DialectCodec, row: Translation) -> None:
    args = arguments(row.role, row.command, inbound=False)
    command = neutral(row.role, row.command)
    encoded = None if withheld(codec, command) else codec.encode(Route(), command, lambda k: None)
    if row.frames is None:
        assert encoded is None  # MDP01-05, REQREP-05: withheld
        return
    assert encoded is not None
    assert tuple(encoded[: len(row.frames)]) == row.frames
    if args:
        assert encoded[-1] == args[-1]  # the body (or the last frame) goes as it came


@pytest.mark.parametrize("spec", sorted(DIALECT_SPECS))
def test_the_specs_show_the_tables_the_code_has(spec: str) -> None:
    text = (ROOT / "specs" / spec).read_text(encoding="utf-8")
    assert extract_block(text, DIALECT_BEGIN, DIALECT_END) == render_dialect_block(spec)
    for value in DIALECT_SPECS[spec]:
        assert value in CODECS


def test_the_command_checks_a_dialect_spec(tmp_path: Path) -> None:
    printed: list[str] = []
    spec = ROOT / "specs" / "mdp-0.1.md"
    assert main(["--dialects", "--check", str(spec)], printed.append) == 0
    stale = tmp_path / "mdp-0.1.md"
    stale.write_text(
        spec.read_text(encoding="utf-8").replace("`final` | MDP01-04 |", "`final` | MDP01-99 |")
    )
    assert main(["--dialects", "--check", str(stale)], printed.append) == 1
    assert main(["--dialects", "--write", str(stale)], printed.append) == 0
    assert stale.read_text(encoding="utf-8") == spec.read_text(encoding="utf-8")


class Route:
    """A peer's route with no envelope, as ``FamilyBroker.route`` gives one."""

    routing_id = b"peer"
    dialect = Dialect.MDP02
    envelope: Relayed = ()
    request_key = None
    context: tuple[bytes, ...] = ()
    service = None
