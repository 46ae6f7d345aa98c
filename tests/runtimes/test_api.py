"""The three runtimes' public API reads as one: same names, same arguments, one error root."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import domo
import domo.asyncio
import domo.protocol.events
import domo.runtime
import domo.sync
import domo.trio
from domo.protocol import LocalProtocolError, MalformedMessage

RUNTIMES = [domo.trio, domo.asyncio, domo.sync]
# How each runtime is told it has started or must stop, and Trio's in-memory test seam.
OWN_WAY = {"task_status", "started", "stop", "transport"}


def parameters(function: Callable[..., Any]) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name not in OWN_WAY]


@pytest.mark.parametrize("name", ["Client", "run_worker"])
def test_clients_and_workers_take_the_same_arguments(name: str) -> None:
    shapes = {runtime.__name__: parameters(getattr(runtime, name)) for runtime in RUNTIMES}
    assert len(set(map(tuple, shapes.values()))) == 1, shapes


def test_brokers_take_the_same_arguments() -> None:
    assert parameters(domo.trio.serve_broker) == parameters(domo.asyncio.serve_broker)


@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r.__name__)
def test_same_public_names(runtime: Any) -> None:
    shared = {"Client", "run_worker", "Reply", "ReplyStream", "Body", "Handler", "DomoError"}
    shared |= {"RemoteError", "RequestError", "RequestTimeout", "ClientClosed"}
    assert shared <= set(runtime.__all__)
    for name in runtime.__all__:
        assert hasattr(runtime, name), f"{runtime.__name__}.__all__ names a missing {name}"
    for name in shared & set(dir(domo.runtime)):
        assert getattr(runtime, name) == getattr(domo.runtime, name), name  # one class each


def test_every_exception_derives_from_domo_error() -> None:
    for runtime in [*RUNTIMES, domo.runtime]:
        for name in runtime.__all__:
            value = getattr(runtime, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                assert issubclass(value, domo.DomoError), f"{runtime.__name__}.{name}"
    assert issubclass(LocalProtocolError, domo.DomoError)
    assert issubclass(MalformedMessage, domo.DomoError)
    assert issubclass(MalformedMessage, ValueError)  # as before


def test_no_exception_shares_its_name_with_an_event() -> None:
    events = set(domo.protocol.events.__all__)
    for runtime in [*RUNTIMES, domo.runtime]:
        exceptions = {
            name
            for name in runtime.__all__
            if isinstance(getattr(runtime, name), type)
            and issubclass(getattr(runtime, name), BaseException)
        }
        assert not exceptions & events, runtime.__name__
    assert not hasattr(domo.trio, "RequestFailed")  # once RequestError's name
