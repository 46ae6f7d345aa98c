"""A broker's drain: stop taking requests, let those in flight finish, then stop (MDP-D-34).

``Drain`` is given to ``serve_broker`` and started from outside (``domo broker --drain SECONDS``
does so at SIGTERM): the core refuses every new request from then on (``RequestRefused``,
``draining``), keeps dispatching and forwarding what it had taken, and ``finished`` is set once
no request is left that a worker has or could still get. The caller then stops the broker as
usual (cancels ``serve_broker``): whatever is left is given up and its clients resend, to
another broker if they have one (MDP-D-28).
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from domo.protocol.broker import Broker

__all__ = ["Drain"]

logger = logging.getLogger("domo.broker")

POLL: Final = 0.05  # seconds between two looks at what is left


class Drain:
    """Start a drain with ``begin``; ``finished`` is set when it is done (see the module doc).

    ``seconds`` bounds it for ``wait`` (what ``domo broker`` uses): past that, what is left is
    given up.
    """

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a drain lasts more than 0 s, got {seconds}")
        self.seconds = seconds
        self.requested = trio.Event()
        self.finished = trio.Event()
        self.left = 0  # requests outstanding when the drain ended (given up at the stop)
        self._core: Broker | None = None

    def begin(self) -> None:
        """Stop taking requests now (from any Trio task)."""
        self.requested.set()

    async def wait(self) -> bool:
        """Wait for the drain to finish, at most ``seconds``; whether it finished in time."""
        with trio.move_on_after(self.seconds):
            await self.finished.wait()
            return True
        self.left = len(self._core.requests()) if self._core is not None else 0
        return False

    async def run(self, core: Broker) -> None:
        """Serve's side: wait for ``begin``, tell the core, watch what is left."""
        await self.requested.wait()
        self._core = core
        core.stop_taking_requests()
        began = trio.current_time()
        outstanding = len(core.requests())
        logger.info(
            "draining: no new requests taken; %d outstanding, at most %g s",
            outstanding,
            self.seconds,
        )
        while not _settled(core):  # noqa: ASYNC110 - the sans-IO core has no event to await
            await trio.sleep(POLL)
        self.left = len(core.requests())
        logger.info(
            "drained in %.2f s%s",
            trio.current_time() - began,
            f"; {self.left} request(s) queued for services with no worker are given up"
            if self.left
            else "",
        )
        self.finished.set()


def _settled(core: Broker) -> bool:
    """No request is with a worker, and none queued can still get one."""
    services = core.services()
    for request in core.requests():
        if request.worker is not None:
            return False
        service = services.get(request.service)
        if service is not None and service.workers:
            return False
    return True
