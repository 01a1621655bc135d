"""The scheduler's unit of work: its repository on one transaction, with the outbox and the inbox."""

from __future__ import annotations

from collections.abc import Callable

from tessera.core.db.uow import UnitOfWork
from tessera.scheduler.adapters.repository import SqlSchedulerRepository, call_after_commit
from tessera.scheduler.service_layer.repository_port import SchedulerRepository


class SchedulerUnitOfWork(UnitOfWork):
    repo: SchedulerRepository

    def open_repositories(self, session: object) -> None:
        # `self.session` is this session, typed: naming its type here would bring SQLAlchemy along.
        self.repo = SqlSchedulerRepository(self.session)

    async def commit(self) -> None:
        """The repository's deferred writes go first, inside the transaction."""
        await self.repo.flush()
        await super().commit()

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this unit has committed, never on a rollback: handlers wake the
        scheduling loop this way, so a cycle never starts before what woke it can be read."""
        call_after_commit(self.session, callback)
