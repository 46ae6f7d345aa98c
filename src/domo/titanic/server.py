"""``serve_titanic``: the Titanic service (9/TSP) on Trio, an MDP client and worker of a broker.

It runs ``domo.titanic.protocol.TitanicMachine`` against a ``Store`` and a broker:

- three workers (``domo.trio.run_worker``), one per service of 9/TSP: ``titanic.request``,
  ``titanic.reply``, ``titanic.close`` (TSP-S-01);
- one dispatcher that sends stored requests to their services through a ``domo.trio.Client``
  (an MDP client of the same broker, TSP-A-01), asking ``mmi.service`` first when the machine
  says so, and stores each reply before the request leaves the queue.

Requests arriving together are committed together (one transaction for all the
``titanic.request`` calls that are ready at once), then each gets its ``200``: a reply never
precedes its commit (TSP-D-01). Ids are ``uuid4().hex`` (TSP-S-05); time is wall time, never
going backwards (the machine's ``now``), so stored times mean the same after a restart.
A store that fails (read-only, full, damaged) is answered ``500`` request by request; nothing
stored is touched (TSP-D-08).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar, cast

import trio

from domo.protocol import WorkerConfig
from domo.runtime.errors import ERROR_MARKER, RemoteError, RequestError

from .protocol import (
    CLOSE,
    ERROR,
    OK,
    REPLY,
    REQUEST,
    Answered,
    Dispatch,
    GiveUp,
    NoAnswer,
    NoService,
    Outcome,
    Purge,
    Refused,
    TitanicConfig,
    TitanicMachine,
    status,
)
from .store import Store, StoreError

__all__ = ["TitanicServer", "serve_titanic"]

logger = logging.getLogger("domo.titanic")

MMI_SERVICE = b"mmi.service"

# The runtime's clients, as the dispatcher uses them: the FINAL's body, or ``RequestError``.
RequestFn = Callable[[bytes, Sequence[bytes]], Awaitable[list[bytes]]]
ProbeFn = Callable[[bytes], Awaitable[list[bytes]]]


T = TypeVar("T")


@dataclass
class _Write:
    """A write waiting for the next group commit, then its result or its error."""

    operation: Callable[[], object]
    done: trio.Event
    result: object = None
    error: StoreError | None = None


class TitanicServer:
    """The state of one running Titanic: its machine, its store and what waits for a commit.

    ``serve_titanic`` makes one and runs it; tests may read ``machine`` and ``counts``.
    """

    def __init__(
        self,
        store: Store,
        config: TitanicConfig | None = None,
        *,
        new_id: Callable[[], bytes] = lambda: uuid.uuid4().hex.encode("ascii"),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.machine = TitanicMachine(config)
        self._new_id = new_id
        self._clock = clock
        self._batch: list[_Write] = []
        self._commit_wanted = trio.Event()
        self._tick_wanted = trio.Event()
        # What happened, for logs and tests.
        self.counts = {"stored": 0, "refused": 0, "answered": 0, "retried": 0, "given-up": 0}

    def now(self) -> float:
        """Wall time, never before the machine's last ``now``."""
        return max(self._clock(), self.machine.now)

    def recover(self) -> int:
        """Queue what the store holds as pending (a restart); how many requests that is."""
        pending = list(self.store.pending())
        self.machine.recover(pending, self.now())
        return len(pending)

    # --- the three services --------------------------------------------------------------------

    async def on_request(self, frames: list[bytes]) -> list[bytes]:
        """``titanic.request``: refuse, or commit (with whatever else is ready) then ``200``."""
        step = self.machine.accept(frames, self._new_id(), self.now())
        if isinstance(step, Refused):
            self.counts["refused"] += 1
            return step.reply
        try:
            await self.write(partial(self.store.add, [step]))
        except StoreError as error:
            logger.error("request not stored: %s", error)
            return self.machine.not_stored(step, str(error), self.now())
        self.counts["stored"] += 1
        self._tick_wanted.set()
        return self.machine.stored(step, self.now())

    async def on_reply(self, frames: list[bytes]) -> list[bytes]:
        """``titanic.reply``: ``200`` and the reply, ``300`` pending or ``400`` unknown."""
        request_id = self.machine.reply_id(frames)
        if isinstance(request_id, list):
            return request_id
        try:
            record = self.store.record(request_id)
        except StoreError as error:
            logger.error("titanic.reply: %s", error)
            return [status(ERROR, str(error))]
        return self.machine.answer_reply(request_id, record)

    async def on_close(self, frames: list[bytes]) -> list[bytes]:
        """``titanic.close``: forget the request and its reply; ``200`` even if unknown."""
        request_id = self.machine.close_id(frames)
        if isinstance(request_id, list):
            return request_id
        try:
            await self.write(partial(self.store.delete, request_id))
        except StoreError as error:
            logger.error("titanic.close: %s", error)
            return [status(ERROR, str(error))]
        return self.machine.closed(request_id, self.now())

    # --- commits -------------------------------------------------------------------------------

    async def write(self, operation: Callable[[], T]) -> T:
        """Run a store write in the next group commit; its result once it is on disk.

        Every write ready at once (the handlers of all sessions, the dispatcher's replies) goes
        into one transaction: one commit, one fsync at ``synchronous=full``, for all of them
        (TSP-D-01). ``StoreError`` if this write (not another one of the group) failed.
        """
        write = _Write(operation, trio.Event())
        self._batch.append(write)
        self._commit_wanted.set()
        await write.done.wait()
        if write.error is not None:
            raise write.error
        return cast(T, write.result)

    async def run_commits(self) -> None:
        """Commit the writes waiting for it, all of them in one transaction, until cancelled."""
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted = trio.Event()
            await trio.lowlevel.cancel_shielded_checkpoint()  # let the other ready ones join
            batch, self._batch = self._batch, []
            if not batch:
                continue
            try:
                with self.store.transaction():
                    results = [write.operation() for write in batch]
            except StoreError:
                # One of them failed (a full disk, say), and the commit with it: do each alone,
                # so that only the one that cannot be done is refused.
                for write in batch:
                    try:
                        with self.store.transaction():
                            write.result = write.operation()
                    except StoreError as error:
                        write.error = error
            else:
                for write, result in zip(batch, results, strict=True):
                    write.result = result
            for write in batch:
                write.done.set()

    # --- request execution ---------------------------------------------------------------------

    async def run_dispatcher(
        self,
        request: RequestFn,
        probe: ProbeFn,
    ) -> None:
        """Tick the machine and carry out its effects until cancelled.

        ``request(service, body)`` and ``probe(service)`` are awaitables of the runtime's
        clients (see ``serve_titanic``): the FINAL's body, or ``RequestError``.
        """
        async with trio.open_nursery() as nursery:
            while True:
                for effect in self.machine.tick(self.now()):
                    if isinstance(effect, Dispatch):
                        nursery.start_soon(self._dispatch, effect, request, probe)
                    elif isinstance(effect, GiveUp):
                        self._give_up(effect)
                    elif isinstance(effect, Purge):
                        self._purge(effect)
                deadline = self.machine.next_deadline()
                wait = math.inf if deadline is None else max(0.0, deadline - self.now())
                with trio.move_on_after(wait):
                    await self._tick_wanted.wait()
                self._tick_wanted = trio.Event()

    async def _dispatch(self, dispatch: Dispatch, request: RequestFn, probe: ProbeFn) -> None:
        outcome = await self._attempt(dispatch, request, probe)
        if isinstance(outcome, Answered):
            self.counts["answered"] += 1
        else:
            self.counts["retried"] += 1
            logger.info(
                "request %s to %r not answered (%s): it will be retried",
                dispatch.request_id.decode(),
                dispatch.service.decode("ascii", "replace"),
                "no worker for it" if isinstance(outcome, NoService) else outcome.detail,
            )
        verdict = self.machine.dispatched(dispatch.request_id, outcome, self.now())
        if verdict is not None:
            self._give_up(verdict)
        self._tick_wanted.set()

    async def _attempt(self, dispatch: Dispatch, request: RequestFn, probe: ProbeFn) -> Outcome:
        try:
            loaded = self.store.body(dispatch.request_id)
        except StoreError as error:
            return NoAnswer(str(error))
        if loaded is None:  # closed meanwhile
            return NoAnswer("closed")
        service, body = loaded
        if dispatch.probe:
            try:
                answer = await probe(service)
            except RequestError as error:
                return NoAnswer(f"mmi.service: {error}")
            if not answer or answer[0] != OK:
                return NoService()
        try:
            reply = await request(service, body)
        except RemoteError as error:  # the handler failed: that is its answer (MDP-D-23)
            reply = [ERROR_MARKER, error.error_type.encode(), error.message.encode()]
        except RequestError as error:
            return NoAnswer(str(error))
        try:
            await self.write(partial(self.store.finish, dispatch.request_id, reply, self.now()))
        except StoreError as error:
            logger.error("reply to %s not stored: %s", dispatch.request_id.decode(), error)
            return NoAnswer(f"reply not stored: {error}")
        return Answered()

    def _give_up(self, give_up: GiveUp) -> None:
        self.counts["given-up"] += 1
        logger.warning("request %s given up: %s", give_up.request_id.decode(), give_up.reason)
        try:
            self.store.fail(give_up.request_id, give_up.reason, self.now())
        except StoreError as error:
            logger.error("could not record %s as given up: %s", give_up.request_id.decode(), error)

    def _purge(self, purge: Purge) -> None:
        try:
            gone = self.store.purge(purge.finished_before)
        except StoreError as error:
            logger.error("purge failed: %s", error)
            return
        if gone:
            logger.info("purged %d finished request(s) nobody closed", gone)


async def serve_titanic(
    endpoint: str | Sequence[str],
    store: Store,
    *,
    config: TitanicConfig | None = None,
    worker_config: WorkerConfig | None = None,
    dispatch_timeout: float = 30.0,
    probe_timeout: float = 2.5,
    concurrency: int = 8,
    server: TitanicServer | None = None,
    task_status: trio.TaskStatus[TitanicServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve 9/TSP at the broker(s) on ``endpoint`` with ``store`` until cancelled.

    ``endpoint`` may be several brokers (a Binary Star pair): every session moves to the next
    when it loses the one it is on. ``dispatch_timeout`` bounds one dispatch of a stored
    request (a request that takes longer is tried again: at least once, TSP-D-04);
    ``probe_timeout`` bounds the ``mmi.service`` question. ``concurrency``: sessions per
    ``titanic.*`` service. ``task_status.started`` gets the ``TitanicServer`` once the pending
    requests of ``store`` are queued again. The caller owns ``store`` (and closes it).
    """
    from domo.trio import Client, run_worker  # the runtime, imported where it is used

    titanic = server if server is not None else TitanicServer(store, config)
    recovered = titanic.recover()
    if recovered:
        logger.info("%d pending request(s) found in the store: they will be dispatched", recovered)
    max_in_flight = titanic.machine.config.max_in_flight
    async with (
        Client(endpoint, timeout=dispatch_timeout, retries=0, concurrency=max_in_flight) as work,
        Client(endpoint, timeout=probe_timeout, retries=1, concurrency=max_in_flight) as mmi,
    ):

        async def request(service: bytes, body: Sequence[bytes]) -> list[bytes]:
            return await work.request(service, *body)

        async def probe(service: bytes) -> list[bytes]:
            return await mmi.request(MMI_SERVICE, service)

        serve = partial(run_worker, config=worker_config, concurrency=concurrency)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(titanic.run_commits)
            for service, handler in (
                (REQUEST, titanic.on_request),
                (REPLY, titanic.on_reply),
                (CLOSE, titanic.on_close),
            ):
                await nursery.start(serve, endpoint, service, handler)
            nursery.start_soon(titanic.run_dispatcher, request, probe)
            task_status.started(titanic)
