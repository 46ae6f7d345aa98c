"""Hypothesis strategies and helpers for MDP/0.2 frames, shared by the protocol tests.

Valid values follow ``specs/mdp-0.2.md``: service names are 1-255 printable ASCII bytes
(MDP-D-01), client addresses 1-255 bytes of any value (MDP-D-02), bodies one or more frames.
Body frames are built as fresh ``bytes`` objects of at least two bytes, because CPython shares
the empty and one-byte ``bytes`` objects: an identity check (``is``, MDP-S-03) on a shared
object would pass even for a codec that copies.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import strategies as st

from domo.protocol import mdp

__all__ = [
    "SPEC_PATH",
    "addresses",
    "bodies",
    "client_commands",
    "commands",
    "fresh",
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
