"""The framing of the clients and workers ``domo fuzz --dialect NAME`` plays against a broker.

The broker target models MDP/0.2 (specs/mdp-0.2.md) and speaks it in its own terms; a
:class:`Wire` puts each message its peers send into the dialect's framing and takes each message
the broker sends them back to MDP/0.2's, so the same scenarios and checks run in every dialect.
The framing is written here from the dialects' specs, not taken from :mod:`domo.protocol.dialects`
(the code under test): a message from the broker that does not follow its dialect's frames is
malformed, under the dialect's frame rule.

Where a dialect's rules differ from MDP/0.2's, :class:`Wire` says so and the broker target
judges by them:

- ``mdp01`` (specs/mdp-0.1.md): clients send ``"", MDPC01, service, body`` and get one reply,
  ``"", MDPC01, service, body`` (MDP01-01, MDP01-03); workers frame every command as ``"",
  MDPW01, code`` with 0.1's codes (MDP01-02) and answer with one REPLY, its FINAL (MDP01-04):
  they have no PARTIAL to send. A PARTIAL from another dialect's worker never reaches an
  MDP/0.1 client (MDP01-05): one that does breaks MDP01-05.
- ``majortomo`` (specs/majortomo.md): every message starts with ``""`` (MAJ-01); the client's
  REQUEST is code 0x02 (MAJ-02); replies are ``"", MDPC02, 0x03 or 0x04, body``, with no
  service frame (MAJ-03, MAJ-04), so which service a reply names cannot be judged (MAJ-05).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from . import frames as mdp
from .frames import FrameError

__all__ = ["DIALECTS", "DIALECT_RULES", "Wire"]

DIALECTS: Final = ("mdp02", "mdp01", "majortomo")  # the names --dialect takes
# The rules judged in a dialect besides MDP/0.2's (its framing of what the broker sends, and
# MDP/0.1's one reply per request).
DIALECT_RULES: Final[dict[str, tuple[str, ...]]] = {
    "mdp01": ("MDP01-02", "MDP01-03"),
    "majortomo": ("MAJ-01", "MAJ-03", "MAJ-04"),
}
MDPC01: Final = b"MDPC01"
MDPW01: Final = b"MDPW01"

# MDP/0.2 worker command codes and MDP/0.1's (RFC 7) for the same commands; 0.1 has no PARTIAL.
_W02_TO_W01: Final = {
    mdp.W_READY: b"\x01",
    mdp.W_REQUEST: b"\x02",
    mdp.W_FINAL: b"\x03",
    mdp.W_HEARTBEAT: b"\x04",
    mdp.W_DISCONNECT: b"\x05",
}
_W01_TO_W02: Final = {v: k for k, v in _W02_TO_W01.items()}
# majortomo's client codes (MAJ-02..04) and RFC 18's.
_MAJ_TO_C02: Final = {b"\x03": mdp.C_PARTIAL, b"\x04": mdp.C_FINAL}


class Wire:
    """One dialect's framing for the peers the fuzzer plays, and how its rules differ."""

    def __init__(self, name: str = "mdp02") -> None:
        if name not in DIALECTS:
            raise ValueError(f"unknown dialect {name!r} (one of {', '.join(DIALECTS)})")
        self.name = name

    @property
    def worker_partials(self) -> bool:
        """Can this dialect's worker send a PARTIAL? (MDP/0.1's cannot: MDP01-04.)"""
        return self.name != "mdp01"

    @property
    def worker_sends_request(self) -> bool:
        """Can this dialect's worker send REQUEST (a valid command it must not send)? MDP/0.1's
        code 0x02 is no worker command there (MDP01-02), so sending it is garbage, not that."""
        return self.name != "mdp01"

    @property
    def client_partials(self) -> bool:
        """Does this dialect's client get PARTIALs? (MDP/0.1's does not: MDP01-05.)"""
        return self.name != "mdp01"

    @property
    def busy_workers_heartbeat(self) -> bool:
        """Does this dialect's worker heartbeat while it works on a request? RFC 7's (the
        Guide's worker API) and majortomo's do not, so a busy one is not taken for dead after
        the liveness span (MDP01-12, MAJ-08, FAM-09: only after the broker's busy timeout)."""
        return self.name == "mdp02"

    @property
    def one_outstanding(self) -> bool:
        """Does this dialect's client keep one request outstanding (MDP-S-02)? An MDP/0.1
        client may send several before it reads, each served (MDP01-09)."""
        return self.name != "mdp01"

    @property
    def replies_name_service(self) -> bool:
        """Does a reply to this dialect's client name its service? (majortomo's not: MAJ-05.)"""
        return self.name != "majortomo"

    @property
    def worker_rule(self) -> str:
        """The rule a message to a worker breaks when it is not framed as the dialect's."""
        return {"mdp01": "MDP01-02", "majortomo": "MAJ-01"}.get(self.name, "MDP-W-08")

    @property
    def client_rule(self) -> str:
        """The rule a message to a client breaks when it is not framed as the dialect's."""
        return {"mdp01": "MDP01-03", "majortomo": "MAJ-04"}.get(self.name, "MDP-C-03")

    # --- what the fuzzer's peers send ----------------------------------------------------------

    def out(self, frames: Sequence[bytes]) -> list[bytes]:
        """A valid MDP/0.2 client or worker message, in this dialect's framing.

        ``ValueError`` if the dialect has no such message (MDP/0.1's worker has no PARTIAL).
        """
        frames = list(frames)
        if self.name == "mdp02":
            return frames
        header, command, rest = frames[0], frames[1], frames[2:]
        if self.name == "majortomo":
            if header == mdp.CLIENT_HEADER and command == mdp.C_REQUEST:
                return [b"", mdp.CLIENT_HEADER, b"\x02", *rest]  # MAJ-02
            return [b"", *frames]  # MAJ-01
        if header == mdp.CLIENT_HEADER:
            if command != mdp.C_REQUEST:
                raise ValueError("an MDP/0.1 client sends only requests (MDP01-01)")
            return [b"", MDPC01, *rest]  # MDP01-01
        if command not in _W02_TO_W01 or command == mdp.W_REQUEST:
            raise ValueError("an MDP/0.1 worker has no such command (MDP01-02)")
        return [b"", MDPW01, _W02_TO_W01[command], *rest]  # MDP01-02

    def garbage(self, frames: Sequence[bytes]) -> list[bytes] | None:
        """A malformed MDP/0.2 near-miss in this dialect's framing, or ``None`` when the
        translation would be a valid message of some dialect (then it is no near-miss)."""
        frames = list(frames)
        if self.name == "mdp02" or frames == [b""]:
            wire = frames
        elif self.name == "majortomo":
            if frames[:2] == [mdp.CLIENT_HEADER, mdp.C_REQUEST]:
                frames = [mdp.CLIENT_HEADER, b"\x02", *frames[2:]]
            wire = [b"", *frames]
        elif frames[0] == mdp.WORKER_HEADER:
            code = _W02_TO_W01.get(frames[1], frames[1]) if len(frames) > 1 else None
            wire = [b"", MDPW01, *([] if code is None else [code]), *frames[2:]]
        elif frames[:2] == [mdp.CLIENT_HEADER, mdp.C_REQUEST]:
            wire = [b"", MDPC01, *frames[2:]]
        else:
            wire = [b"", mdp.WORKER_HEADER, *frames[1:]]  # another version's header
        if self.name != "mdp02" and _valid_somewhere(wire):
            return None
        return wire

    # --- what the broker sends them --------------------------------------------------------

    def worker_in(self, frames: Sequence[bytes]) -> list[bytes]:
        """A message the broker sent a worker, as MDP/0.2 frames (``FrameError`` if it does
        not follow the dialect's framing)."""
        frames = [bytes(f) for f in frames]
        if self.name == "mdp02":
            return frames
        if self.name == "majortomo":
            if frames[:1] != [b""] or len(frames) < 2 or frames[1] != mdp.WORKER_HEADER:
                raise FrameError(
                    f"not a majortomo worker command: {[f[:8] for f in frames[:3]]!r}", "MAJ-01"
                )
            inner = frames[1:]
        else:
            if frames[:2] != [b"", MDPW01] or len(frames) < 3 or frames[2] not in _W01_TO_W02:
                raise FrameError(
                    f"not an MDP/0.1 worker command: {[f[:8] for f in frames[:3]]!r}", "MDP01-02"
                )
            inner = [mdp.WORKER_HEADER, _W01_TO_W02[frames[2]], *frames[3:]]
        try:
            mdp.parse_worker(inner)
        except FrameError as error:
            raise FrameError(error.reason, self.worker_rule) from None
        return inner

    def client_in(self, frames: Sequence[bytes], service: bytes) -> list[bytes]:
        """A message the broker sent a client, as MDP/0.2 frames; a majortomo reply names no
        service, so ``service`` (the one the client asked) is put in (MAJ-05)."""
        frames = [bytes(f) for f in frames]
        if self.name == "mdp02":
            return frames
        if self.name == "majortomo":
            if (
                frames[:2] != [b"", mdp.CLIENT_HEADER]
                or len(frames) < 4
                or frames[2] not in _MAJ_TO_C02
            ):
                raise FrameError(
                    f"not a majortomo reply: {[f[:8] for f in frames[:3]]!r}",
                    "MAJ-03" if frames[2:3] == [b"\x03"] else "MAJ-04",
                )
            return [mdp.CLIENT_HEADER, _MAJ_TO_C02[frames[2]], service, *frames[3:]]
        if frames[:2] != [b"", MDPC01] or len(frames) < 4:
            raise FrameError(f"not an MDP/0.1 reply: {[f[:8] for f in frames[:3]]!r}", "MDP01-03")
        inner = [mdp.CLIENT_HEADER, mdp.C_FINAL, *frames[2:]]
        try:
            mdp.parse_client(inner)
        except FrameError as error:
            raise FrameError(error.reason, "MDP01-03") from None
        return inner


def _valid_somewhere(wire: list[bytes]) -> bool:
    """Is ``wire`` a valid client or worker message of some dialect (by their specs)?"""
    candidates = [wire]
    if wire[:1] == [b""]:
        inner = wire[1:]
        candidates.append(inner)
        if inner[:1] == [MDPW01] and len(inner) > 1 and inner[1] in _W01_TO_W02:
            candidates.append([mdp.WORKER_HEADER, _W01_TO_W02[inner[1]], *inner[2:]])
        if inner[:1] == [MDPC01]:
            candidates.append([mdp.CLIENT_HEADER, mdp.C_REQUEST, *inner[1:]])
        if inner[:2] == [mdp.CLIENT_HEADER, b"\x02"]:
            candidates.append([mdp.CLIENT_HEADER, mdp.C_REQUEST, *inner[2:]])
    return any(mdp.valid_worker(c) or mdp.valid_client(c) for c in candidates)
