"""The consumer's batch as it ran before a batch could go without savepoints, for `bench.bus
--baseline-consumer`: every handler in a savepoint of its own (SQLAlchemy's `begin_nested`: a
`SAVEPOINT` and a `RELEASE` per message whose handler sends a statement), the rest of the runner as
it is now."""

from __future__ import annotations

from collections.abc import Mapping

from nats.aio.msg import Msg

from tessera.core.db.uow import UnitOfWork
from tessera.core.messaging.consumer import ConsumerRunner
from tessera.core.messaging.envelope import Envelope


class SavepointPerMessageRunner(ConsumerRunner[UnitOfWork]):
    async def _run(
        self, decoded: list[tuple[Msg, Envelope]], known: Mapping[int, BaseException], *, replay: bool
    ) -> list[tuple[Msg, Envelope, str | BaseException]]:
        outcomes: list[tuple[Msg, Envelope, str | BaseException]] = []
        async with self.uow_factory() as uow:
            duplicates = await uow.seen_many(self.spec.name, [envelope.id for _, envelope in decoded])
            taken: set[str] = set()
            failed: list[str] = []
            for msg, envelope in decoded:
                if envelope.id in duplicates or envelope.id in taken:
                    outcomes.append((msg, envelope, "duplicate"))
                    continue
                taken.add(envelope.id)
                outcome = await self._handle_one(uow, envelope, savepoint=True)
                if isinstance(outcome, BaseException):
                    failed.append(envelope.id)
                outcomes.append((msg, envelope, outcome))
            await uow.unsee(self.spec.name, failed)
            await uow.commit()
        return outcomes
