"""Fixtures of the Titanic tests: the ``domo`` process starter of tests/cli, and an in-process
broker with a Titanic on a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from domo.protocol import BrokerConfig, WorkerConfig
from domo.titanic.protocol import TitanicConfig
from domo.titanic.server import TitanicServer, serve_titanic
from domo.titanic.store import SqliteStore
from domo.trio import serve_broker
from tests.cli.conftest import collect_garbage, domo  # noqa: F401  (fixtures used here)

BEAT = 0.2  # broker, workers and Titanic agree: a lost peer shows in 0.6 s
WORKER_CONFIG = WorkerConfig(heartbeat_interval=BEAT, liveness=3)
BROKER_CONFIG = BrokerConfig(heartbeat_interval=BEAT, liveness=3)


@dataclass
class Rig:
    """A broker and a Titanic in this process, on loopback, with the Titanic's file."""

    endpoint: str
    db: Path
    store: SqliteStore
    titanic: TitanicServer
    nursery: trio.Nursery
    titanic_scope: trio.CancelScope

    async def restart_titanic(self) -> None:
        """Stop the Titanic, close its file, open it again and serve again (a restart)."""
        self.titanic_scope.cancel()
        await trio.sleep(0.05)
        self.store.close()
        self.store = SqliteStore(self.db, synchronous="normal")
        await self._start()

    async def _start(self) -> None:
        scope = trio.CancelScope()
        self.titanic_scope = scope
        config = TitanicConfig(retry_initial=0.1, retry_max=0.4, probe_interval=0.5)

        async def run(task_status: trio.TaskStatus[TitanicServer]) -> None:
            with scope:
                await serve_titanic(
                    self.endpoint,
                    self.store,
                    config=config,
                    worker_config=WORKER_CONFIG,
                    dispatch_timeout=2.0,
                    concurrency=2,
                    task_status=task_status,
                )

        self.titanic = await self.nursery.start(run)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    db = tmp_path / "titanic.db"
    store = SqliteStore(db, synchronous="normal")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            [endpoint] = await nursery.start(
                lambda task_status: serve_broker(
                    "tcp://127.0.0.1:0", config=BROKER_CONFIG, task_status=task_status
                )
            )
            rig = Rig(endpoint, db, store, None, nursery, trio.CancelScope())  # type: ignore[arg-type]
            await rig._start()
            try:
                yield rig
            finally:
                nursery.cancel_scope.cancel()
    rig.store.close()
