"""The consumer as it ran before, for before/after ratios in one run: `SavepointPerMessageRunner`
(`bench.bus --baseline-consumer`) runs every handler in a savepoint of its own (SQLAlchemy's
`begin_nested`: a `SAVEPOINT` and a `RELEASE` per message whose handler sends a statement);
`LingeringFetchRunner` (`bench.bus --baseline-fetch`, `bench.bus_stages`) fetches a batch with two
pulls, the second lingering 10 ms. The rest of the runner is as it is now."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from nats.aio.msg import Msg
from nats.js import JetStreamContext

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


class LingeringFetchRunner(ConsumerRunner[UnitOfWork]):
    """The consumer's fetch as it was before one pull took a batch: a pull for one message (up to a
    second), then a second pull for the rest of the batch lingering 10 ms (`no_wait` with
    `expires`: the server holds it until the batch fills or the 10 ms pass)."""

    LINGER_S = 0.01

    async def _fetch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        first = await sub.fetch(1, timeout=1.0)
        if self.spec.batch > 1:
            with contextlib.suppress(TimeoutError):
                first += await sub.fetch(self.spec.batch - 1, timeout=self.LINGER_S)
        return first
