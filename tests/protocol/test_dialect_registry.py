"""The dialect registry: one codec per dialect, capabilities as data, and the broker reads them.

Behaviour per dialect is tested message by message in test_family.py; here the registry's shape
and that the broker's decisions follow the capabilities (not a per-dialect branch).
"""

from __future__ import annotations

import dataclasses

import pytest

from domo.protocol.dialects import (
    CODECS,
    DETECTION_ORDER,
    Capabilities,
    Command,
    CoreCommand,
    Dialect,
    DialectCodec,
    Role,
    codec_for,
    detect,
    withheld,
)
from domo.protocol.mdp import Relayed

PARTIAL = CoreCommand(Role.CLIENT, Command.PARTIAL, b"svc", b"", (b"half",))
FINAL = CoreCommand(Role.CLIENT, Command.FINAL, b"svc", b"", (b"all",))


class Route:
    """A client's route with only an envelope, as ``FamilyBroker.route`` gives one."""

    routing_id = b"C"
    dialect = Dialect.MDP01
    request_key = None
    context: tuple[bytes, ...] = ()
    service = None

    def __init__(self, envelope: Relayed) -> None:
        self.envelope = envelope


def sent(codec: DialectCodec, envelope: Relayed, command: CoreCommand) -> Relayed | None:
    """What the broker sends a peer of ``codec``'s dialect for ``command`` (FamilyBroker's
    translation: the registry's withholding, then the codec)."""
    if withheld(codec, command):
        return None
    return codec.encode(Route(envelope), command, lambda key: None)


def test_every_dialect_has_one_codec_and_is_detectable() -> None:
    assert set(CODECS) == set(Dialect)
    for dialect, codec in CODECS.items():
        assert codec_for(dialect) is codec
        assert codec.dialect is dialect
    assert sorted(c.dialect.value for c in DETECTION_ORDER) == sorted(d.value for d in Dialect)


def test_capabilities_are_frozen_data() -> None:
    capabilities = codec_for(Dialect.MDP01).capabilities
    with pytest.raises(dataclasses.FrozenInstanceError):
        capabilities.partial_replies = True  # type: ignore[misc]
    assert {f.name for f in dataclasses.fields(Capabilities)} >= {
        "partial_replies",
        "worker_heartbeats",
        "broker_heartbeats",
        "disconnect",
        "mmi",
        "outstanding_per_client",
        "client_hops",
    }


@pytest.mark.parametrize(
    ("dialect", "partials"),
    [
        (Dialect.MDP02, True),
        (Dialect.MAJORTOMO, True),  # MAJ-07
        (Dialect.MDP01, False),  # MDP01-05
        (Dialect.MDP02_REQ, False),  # REQREP-05
    ],
)
def test_partials_follow_the_capability(dialect: Dialect, partials: bool) -> None:
    """A PARTIAL is withheld exactly from the clients whose dialect says it has none."""
    codec = codec_for(dialect)
    assert codec.capabilities.partial_replies is partials
    assert (sent(codec, (), PARTIAL) is not None) is partials
    assert sent(codec, (), FINAL) is not None


def test_a_changed_capability_changes_what_the_broker_does() -> None:
    """The registry decides from the record: the same codec with partial_replies and
    client_hops turned on forwards PARTIALs and accepts hops (no per-dialect branch decides)."""
    mdp01 = codec_for(Dialect.MDP01)
    permissive = dataclasses.replace(
        mdp01, capabilities=dataclasses.replace(mdp01.capabilities, partial_replies=True)
    )
    assert sent(mdp01, (b"hop",), PARTIAL) is None
    assert sent(permissive, (b"hop",), PARTIAL) == (b"hop", b"", b"MDPC01", b"svc", b"half")


@pytest.mark.parametrize(
    ("frames", "found"),
    [
        ([b"hop", b"", b"MDPC01", b"svc", b"x"], (Dialect.MDP01, 1)),  # MDP01-01: hops allowed
        ([b"hop", b"", b"MDPW01", b"\x01", b"svc"], None),  # MDP01-02: never a worker behind hops
        ([b"", b"MDPC02", b"\x02", b"svc", b"x"], (Dialect.MAJORTOMO, 0)),  # MAJ-02
        # majortomo's client has no hops: behind one, it is an RFC 18 client behind REQ
        ([b"hop", b"", b"MDPC02", b"\x02", b"svc"], (Dialect.MDP02_REQ, 1)),
    ],
)
def test_hops_follow_roles_and_capabilities(
    frames: list[bytes], found: tuple[Dialect, int] | None
) -> None:
    assert detect(frames) == found


def test_claims_name_the_role() -> None:
    claims = {codec.dialect: codec.claims for codec in DETECTION_ORDER}
    assert claims[Dialect.MDP01](b"MDPC01", b"svc") is Role.CLIENT
    assert claims[Dialect.MDP01](b"MDPW01", b"\x01") is Role.WORKER
    assert claims[Dialect.MAJORTOMO](b"MDPW02", b"\x01") is Role.WORKER
    assert claims[Dialect.MAJORTOMO](b"MDPC02", b"\x01") is None  # RFC 18's code: not its client
    assert claims[Dialect.MDP02_REQ](b"MDPW02", b"\x01") is None
    assert all(isinstance(codec, DialectCodec) for codec in DETECTION_ORDER)
