"""What ``domo status`` prints (``domo.cli.status.render``): sizes readable, and a request for a
service no worker serves shown under ``(none)`` with a line saying what that row is."""

from __future__ import annotations

import pytest

from domo.cli.status import byte_size, render
from domo.metrics import NO_SERVICE, ServiceStatus, Status


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (4 * 2**20, "4 MiB"),
        (268435456, "256 MiB"),
        (3 * 2**30 // 2, "1.5 GiB"),
    ],
)
def test_byte_sizes_read_as_the_options_take_them(count: int, shown: str) -> None:
    assert byte_size(count) == shown


def test_a_queued_request_for_an_unserved_service_is_explained() -> None:
    status = Status(
        services={
            "echo": ServiceStatus("echo", idle=1, completed=3),
            NO_SERVICE: ServiceStatus(NO_SERVICE, queued=1),
        },
        held_bytes=1,
        limits={"held": 268435456},
    )
    lines = render(status)
    assert lines[:3] == [
        "service  idle  busy  queued  completed  expired  dropped",
        "(none)      0     0       1          0        0        0",
        "echo        1     0       0          3        0        0",
    ]
    assert lines[3] == (
        "(none): requests for services no worker has registered for, together; each gets a "
        "row of its own once a worker serves it"
    )
    assert "request bytes held: 1 B of 256 MiB; refused: none" in lines
    # Without such a request, no such line.
    del status.services[NO_SERVICE]
    assert not [line for line in render(status) if line.startswith(NO_SERVICE)]
