"""Hypothesis strategies and helpers for MDP/0.2 frames, shared by the protocol tests.

Valid values follow ``specs/mdp-0.2.md``: service names are 1-255 printable ASCII bytes
(MDP-D-01), client addresses 1-255 bytes of any value (MDP-D-02), bodies one or more frames.
``near_misses`` turns a valid command into messages with exactly one defect each, paired with
the rule the defect breaks.

Body frames are built as fresh ``bytes`` objects of at least two bytes, because CPython shares
the empty and one-byte ``bytes`` objects: an identity check (``is``, MDP-S-03) on a shared
object would pass even for a codec that copies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from hypothesis import strategies as st

from domo.protocol import mdp
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

__all__ = [
    "BAD_ADDRESSES",
    "BAD_CLIENT_CODES",
    "BAD_HEADERS",
    "BAD_SERVICES",
    "BAD_WORKER_CODES",
    "SPEC_PATH",
    "NearMiss",
    "addresses",
    "bodies",
    "client_commands",
    "commands",
    "fresh",
    "near_misses",
    "services",
    "spec_rule_ids",
    "worker_commands",
]

SPEC_PATH = Path(__file__).resolve().parents[2] / "specs" / "mdp-0.2.md"

_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def spec_rule_ids() -> frozenset[str]:
    """Every rule id defined in a table row of ``specs/mdp-0.2.md``."""
    text = SPEC_PATH.read_text(encoding="utf-8")
    return frozenset(re.findall(r"^\| (MDP-[A-Z]-\d\d) \|", text, flags=re.MULTILINE))


def fresh(frame: bytes) -> bytes:
    """A new ``bytes`` object equal to ``frame`` (not shared, if it has two bytes or more)."""
    return bytes(bytearray(frame))


def plain(frames: Sequence[bytes | memoryview]) -> tuple[bytes, ...]:
    """A message the broker sent, for a test that gave it only ``bytes``: then all its frames
    are ``bytes`` (it relays body frames as it got them)."""
    out = tuple(frame for frame in frames if isinstance(frame, bytes))
    assert len(out) == len(frames), frames
    return out


services = st.one_of(
    st.text(_PRINTABLE, min_size=1, max_size=40).map(lambda text: text.encode("ascii")),
    st.sampled_from([b"x", b" ", b"~", b"mmi.service", b"a" * 255, b"~" * 254 + b" "]),
)
"""Valid service names, with the boundary lengths 1 and 255 (MDP-D-01)."""

addresses = st.one_of(
    st.binary(min_size=1, max_size=32),
    st.sampled_from([b"\x00", b"\xff" * 255, b"\x00k\x8bEg", bytes(range(255))]),
)
"""Valid client addresses (ZeroMQ routing ids), with the boundary lengths 1 and 255 (MDP-D-02)."""

body_frames = st.binary(min_size=2, max_size=24).map(fresh)
bodies = st.lists(body_frames, min_size=1, max_size=4).map(tuple)
"""Valid bodies: one or more fresh frames."""

client_commands: st.SearchStrategy[mdp.ClientCommand] = st.one_of(
    st.builds(mdp.ClientRequest, services, bodies),
    st.builds(mdp.ClientPartial, services, bodies),
    st.builds(mdp.ClientFinal, services, bodies),
)
worker_commands: st.SearchStrategy[mdp.WorkerCommand] = st.one_of(
    st.builds(mdp.WorkerReady, services),
    st.builds(mdp.WorkerRequest, addresses, bodies),
    st.builds(mdp.WorkerPartial, addresses, bodies),
    st.builds(mdp.WorkerFinal, addresses, bodies),
    st.just(mdp.WorkerHeartbeat()),
    st.just(mdp.WorkerDisconnect()),
)
commands: st.SearchStrategy[mdp.Command] = st.one_of(client_commands, worker_commands)


# --- near misses: one defect each, the rule it breaks -----------------------------------------


@dataclass(frozen=True)
class NearMiss:
    """A valid message with exactly one thing wrong, and the rule that makes it malformed."""

    what: str
    frames: tuple[bytes, ...]
    rule: str


BAD_HEADERS = [b"MDPC01", b"MDPW01", b"mdpc02", b"MDPC2", b"MDPW02 ", b"", b"\x00MDPC02"]
BAD_CLIENT_CODES = [b"", b"\x00", b"\x04", b"\x05", b"\x01\x00", b"1", b"\x81"]
BAD_WORKER_CODES = [b"", b"\x00", b"\x07", b"\xff", b"\x02\x00", b"5"]
BAD_SERVICES = [b"", b"a" * 256, b"\x00", b"echo\n", b"\x7f", b"caf\xc3\xa9", b"\x1f", b"\x80"]
BAD_ADDRESSES = [b"", b"\x00" * 256]

_CLIENT_RULE = {b"\x01": "MDP-C-01", b"\x02": "MDP-C-02", b"\x03": "MDP-C-03"}
_WORKER_RULE = {
    b"\x01": "MDP-W-01",
    b"\x02": "MDP-W-02",
    b"\x03": "MDP-W-03",
    b"\x04": "MDP-W-04",
    b"\x05": "MDP-W-05",
    b"\x06": "MDP-W-06",
}


def near_misses(command: Command) -> list[NearMiss]:
    """Every one-defect mutation of ``command``'s frames that domo must reject, with its rule.

    The kinds of defect are interleaved (the first of each kind, then the second of each, ...),
    so that a strategy sampling this list early, as Hypothesis does, meets every kind.
    """
    frames = mdp.encode(command)
    header, code = frames[0], frames[1]
    is_client = header == mdp.CLIENT_HEADER
    own_rule = (_CLIENT_RULE if is_client else _WORKER_RULE)[code]
    # An unknown command code: MDP/Client has no rule of its own for it but its REQUEST's.
    unknown_code_rule = "MDP-C-01" if is_client else "MDP-W-08"
    kinds: list[list[NearMiss]] = []
    # One frame too many, for the commands of a fixed size.
    if isinstance(command, WorkerReady | WorkerHeartbeat | WorkerDisconnect):
        kinds.append(
            [NearMiss(f"extra {extra!r}", (*frames, extra), own_rule) for extra in (b"", b"extra")]
        )
    # Client address and delimiter (MDP-D-02, MDP-R-02).
    if isinstance(command, WorkerRequest | WorkerPartial | WorkerFinal):
        delimiters = [
            NearMiss(f"delimiter {bad!r}", (header, code, frames[2], bad, *frames[4:]), "MDP-R-02")
            for bad in (b"x", b"\x00", b" ")
        ]
        without_delimiter = (header, code, frames[2], *frames[4:])
        if len(without_delimiter) < 5:
            delimiters.append(NearMiss("no delimiter", without_delimiter, own_rule))
        elif without_delimiter[3]:
            delimiters.append(NearMiss("no delimiter", without_delimiter, "MDP-R-02"))
        kinds.append(delimiters)
        kinds.append(
            [
                NearMiss(f"address of {len(bad)}", (header, code, bad, *frames[3:]), "MDP-D-02")
                for bad in BAD_ADDRESSES
            ]
        )
    # Service names (MDP-D-01).
    if isinstance(command, ClientRequest | ClientPartial | ClientFinal | WorkerReady):
        kinds.append(
            [
                NearMiss(f"service {bad[:8]!r}", (header, code, bad, *frames[3:]), "MDP-D-01")
                for bad in BAD_SERVICES
            ]
        )
    # Too few frames: every prefix shorter than the smallest valid message of this command.
    smallest = {
        ClientRequest: 4,
        ClientPartial: 4,
        ClientFinal: 4,
        WorkerReady: 3,
        WorkerRequest: 5,
        WorkerPartial: 5,
        WorkerFinal: 5,
        WorkerHeartbeat: 2,
        WorkerDisconnect: 2,
    }[type(command)]
    kinds.append(
        [
            # The header alone has no code to go by.
            NearMiss(f"{n} frames", frames[:n], unknown_code_rule if n == 1 else own_rule)
            for n in range(smallest - 1, 0, -1)
        ]
    )
    kinds.append(
        [
            NearMiss(f"code {bad!r}", (header, bad, *frames[2:]), unknown_code_rule)
            for bad in (BAD_CLIENT_CODES if is_client else BAD_WORKER_CODES)
        ]
    )
    kinds.append(
        [NearMiss(f"header {bad!r}", (bad, *frames[1:]), "MDP-W-08") for bad in BAD_HEADERS]
    )
    return [miss for group in zip_longest(*kinds) for miss in group if miss is not None]
