"""``domo.endpoints``: the one place that says which bind and connect addresses are usable."""

from __future__ import annotations

import pytest

from domo.endpoints import EndpointError, check_endpoint


@pytest.mark.parametrize(
    "text",
    [
        "tcp://127.0.0.1:5555",
        "tcp://localhost:1",
        "tcp://[::1]:65535",
        "ipc:///tmp/domo.sock",
        "inproc://broker",
    ],
)
@pytest.mark.parametrize("bind", [True, False])
def test_usable_endpoints_pass_unchanged(text: str, bind: bool) -> None:
    assert check_endpoint(text, bind=bind) == text


@pytest.mark.parametrize("text", ["tcp://*:5555", "tcp://127.0.0.1:0", "tcp://127.0.0.1:*"])
def test_any_interface_or_any_port_only_for_binding(text: str) -> None:
    assert check_endpoint(text, bind=True) == text
    with pytest.raises(EndpointError, match="bind"):
        check_endpoint(text, bind=False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tcp://127.0.0.1:99999", "from 0 (any free port) to 65535, got 99999"),
        ("tcp://127.0.0.1:65536", "got 65536"),
        ("tcp://127.0.0.1:-5", "must be a number from 1 to 65535, got '-5'"),
        ("tcp://127.0.0.1:+5", "got '+5'"),
        ("tcp://127.0.0.1:0x10", "got '0x10'"),
        ("tcp://127.0.0.1: 80", "got ' 80'"),
        ("tcp://127.0.0.1:", "got ''"),
        ("tcp://127.0.0.1", "no port"),
        ("tcp://:5555", "no host before the port"),
        ("tcp://[::1]5555", "written [ADDRESS]:PORT"),
        ("tcp://[::1", "written [ADDRESS]:PORT"),
        ("tcp://", "nothing after tcp://"),
        ("ipc://", "nothing after ipc://"),
        ("127.0.0.1:5555", "not an endpoint (e.g. tcp://127.0.0.1:5555)"),
        ("udp://127.0.0.1:5555", "use tcp://, ipc://, inproc://"),
    ],
)
def test_unusable_endpoints_are_named(text: str, message: str) -> None:
    with pytest.raises(EndpointError) as raised:
        check_endpoint(text, bind=True)
    assert message in str(raised.value)
    assert repr(text) in str(raised.value) or "not an endpoint" in str(raised.value)


def test_connect_port_zero_is_refused_with_the_connect_range() -> None:
    with pytest.raises(EndpointError, match="from 1 to 65535, got 0"):
        check_endpoint("tcp://127.0.0.1:0", bind=False, schemes=("tcp",))


def test_schemes_narrow_the_transports() -> None:
    with pytest.raises(EndpointError, match="inproc:// works only inside one process"):
        check_endpoint("inproc://x", bind=False, schemes=("tcp", "ipc"))


async def test_the_trio_runtime_checks_before_zeromq() -> None:
    """The Python API refuses a wrapped port too, instead of binding or waiting elsewhere."""
    from domo.trio import ZmqTransport

    transport = ZmqTransport()
    try:
        with pytest.raises(EndpointError, match="got 99999"):
            transport.bind(["tcp://127.0.0.1:99999"], 1000)
        with pytest.raises(EndpointError, match="got 70000"):
            transport.connect("tcp://127.0.0.1:70000")
    finally:
        await transport.aclose()
