"""``domo.asyncio`` on uvloop (``pip install 'domo[uvloop]'``): the same behaviour, on libuv.

domo.asyncio needs of its loop only ``add_reader`` and timers, so it runs unchanged on uvloop's
loop, which spends fewer instructions per wake-up (docs/performance.md). A few of the behaviour
suite's tests, run with the broker, workers and clients on a uvloop loop.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from domo.runtime import RequestTimeout

from . import test_behaviour
from .drivers import AsyncioRuntime, Runtime

uvloop = pytest.importorskip("uvloop")


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    loop = uvloop.new_event_loop()
    made = AsyncioRuntime(loop)
    try:
        yield made
    finally:
        made.close()


def test_the_loop_is_uvloops(runtime: AsyncioRuntime) -> None:
    async def kind() -> str:
        import asyncio

        return type(asyncio.get_running_loop()).__module__

    assert runtime.call(kind).startswith("uvloop")


def test_request_and_reply(runtime: Runtime) -> None:
    test_behaviour.test_request_and_reply(runtime)


def test_partials_then_final(runtime: Runtime) -> None:
    test_behaviour.test_partials_then_final(runtime)


def test_busy_worker_keeps_heartbeating(runtime: Runtime) -> None:
    test_behaviour.test_busy_worker_keeps_heartbeating(runtime)


def test_errors_and_timeouts_are_the_same(runtime: Runtime) -> None:
    endpoint, broker = runtime.broker(test_behaviour.LOCAL, test_behaviour.BROKER)
    with runtime.client(endpoint, timeout=0.2, retries=1) as client, pytest.raises(RequestTimeout):
        client.request("nobody", b"x")
    broker.stop()
