"""The checkpoint service's unit of work: its repositories on one transaction, with the outbox and
the inbox. Requests, checkpoints and jobs the repositories load or add are tracked, so `commit()`
writes the events they recorded into the outbox, each request's in the trace it was made in."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tessera.checkpoint.adapters.repository import (
    CheckpointRepository,
    JobRepository,
    RequestRepository,
    SignalRepository,
    SqlCheckpointRepository,
    SqlJobRepository,
    SqlRequestRepository,
    SqlSignalRepository,
)
from tessera.core.db.uow import UnitOfWork

if TYPE_CHECKING:  # the session is only handed on to the adapters
    from sqlalchemy.ext.asyncio import AsyncSession


class CheckpointUnitOfWork(UnitOfWork):
    requests: RequestRepository
    checkpoints: CheckpointRepository
    jobs: JobRepository
    signals: SignalRepository
    _on_commit: list[Callable[[], None]]

    def open_repositories(self, session: AsyncSession) -> None:
        self._on_commit = []
        self.requests = SqlRequestRepository(session, self.track)
        self.checkpoints = SqlCheckpointRepository(session, self.track)
        self.jobs = SqlJobRepository(session, self.track)
        self.signals = SqlSignalRepository(session)

    def when_committed(self, callback: Callable[[], None]) -> None:
        """Run `callback` once this unit commits (wake a loop that must see what it wrote)."""
        self._on_commit.append(callback)

    async def commit(self) -> None:
        await super().commit()
        self.run_commit_callbacks()

    def run_commit_callbacks(self) -> None:
        callbacks, self._on_commit = self._on_commit, []
        for callback in callbacks:
            callback()
