"""What the admission cycle keeps between runs (in-flight preemptions, draining victims, fair-share
history), and how it keeps out of the way of other writers: an advisory lock and a change mark."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, insert, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import (
    change_seq,
    draining_victims,
    fair_share_history,
    inflight_preemptions,
)
from tessera.admission.domain.queueing import InFlightPreemption, PreemptionReason
from tessera.admission.domain.queueing.model import DrainingVictim
from tessera.admission.domain.queueing.resources import FlavorResource

CYCLE_LOCK_KEY = 0x7E55E7A_AD
"""pg_advisory_xact_lock key of the admission cycle (one cycle at a time across replicas)."""

JOB_EVENTS_LOCK_KEY = 0x7E55E7A_AE
"""pg_advisory_xact_lock key the consumers of job events take in turn: each of their transactions
locks the jobs of a whole batch, in the order the messages came, so two of them at once could lock
the same jobs in opposite orders and deadlock."""


class CycleGate:
    """One cycle at a time across replicas, and no change to what it reads while it runs:
    the cycle takes the transaction's advisory lock exclusively, other writers share it."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def lock(self) -> None:
        """Wait for a running cycle and for writers holding the lock shared; held until commit."""
        await self.session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CYCLE_LOCK_KEY})

    async def hold_off(self) -> None:
        """Wait for a running cycle and keep the next one off until this transaction ends."""
        await self.session.execute(text("SELECT pg_advisory_xact_lock_shared(:key)"), {"key": CYCLE_LOCK_KEY})

    async def job_events_in_turn(self) -> None:
        """Wait for any other transaction handling job events (outcomes, placements, checkpoints)
        to end, and keep the next off until this one ends: one batch at a time locks jobs, so no
        two consumers' batches lock the same jobs in opposite orders (a deadlock)."""
        await self.session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": JOB_EVENTS_LOCK_KEY})

    async def mark_changed(self) -> None:
        """Tell every replica's cycle something changed (sequences are not transactional)."""
        await self.session.execute(select(change_seq.next_value()))

    async def change_mark(self) -> int:
        """The last change mark: a cycle runs when it moved since the last one."""
        return int(
            (await self.session.execute(text("SELECT last_value FROM admission.change_seq"))).scalar_one()
        )


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def encode_usage(usage: Mapping[FlavorResource, float]) -> dict[str, float]:
    return {f"{flavor}|{res}": qty for (flavor, res), qty in usage.items()}


def decode_usage(raw: Mapping[str, Any]) -> dict[FlavorResource, int]:
    return {_key(key): int(qty) for key, qty in raw.items()}


def decode_usage_float(raw: Mapping[str, Any]) -> dict[FlavorResource, float]:
    return {_key(key): float(qty) for key, qty in raw.items()}


def _key(key: str) -> FlavorResource:
    flavor, res = key.split("|", 1)
    return flavor, res


class CycleRecordRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def preemptions(self) -> tuple[list[InFlightPreemption], list[DrainingVictim]]:
        """In-flight preemptions, oldest request first, and the victims draining for them."""
        inflight = [
            InFlightPreemption(
                r.preemptor,
                tuple(r.victims),
                r.requested_at.timestamp(),
                r.deadline.timestamp(),
                tuple(r.flavors),
                decode_usage(r.usage),
            )
            for r in await self.session.execute(
                select(inflight_preemptions).order_by(inflight_preemptions.c.requested_at)
            )
        ]
        draining = [
            DrainingVictim(r.victim, r.preemptor, PreemptionReason(r.reason), r.deadline.timestamp())
            for r in await self.session.execute(select(draining_victims))
        ]
        return inflight, draining

    async def save_preemptions(
        self, inflight: Sequence[InFlightPreemption], draining: Iterable[DrainingVictim]
    ) -> None:
        """Replace what is stored with the preemptions as the engine leaves them."""
        await self.session.execute(delete(inflight_preemptions))
        await self.session.execute(delete(draining_victims))
        if inflight:
            await self.session.execute(
                insert(inflight_preemptions),
                [
                    {
                        "preemptor": r.preemptor,
                        "victims": list(r.victims),
                        "requested_at": _at(r.requested_at),
                        "deadline": _at(r.deadline),
                        "flavors": list(r.flavors),
                        "usage": encode_usage(r.usage),
                    }
                    for r in inflight
                ],
            )
        rows = [
            {
                "victim": d.victim,
                "preemptor": d.preemptor,
                "reason": d.reason.value,
                "deadline": _at(d.deadline),
            }
            for d in draining
        ]
        if rows:
            await self.session.execute(insert(draining_victims), rows)

    async def fair_share(self) -> dict[str, tuple[dict[FlavorResource, float], datetime]]:
        """Per queue: its decayed usage history and when it was sampled."""
        return {
            r.queue: (decode_usage_float(r.history), r.sampled_at)
            for r in await self.session.execute(select(fair_share_history))
        }

    async def save_fair_share(
        self, history: Mapping[str, Mapping[FlavorResource, float]], sampled_at: datetime
    ) -> None:
        if not history:
            return
        stmt = pg_insert(fair_share_history)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[fair_share_history.c.queue],
                set_={"history": stmt.excluded.history, "sampled_at": stmt.excluded.sampled_at},
            ),
            [
                {"queue": queue, "history": encode_usage(usage), "sampled_at": sampled_at}
                for queue, usage in history.items()
            ],
        )
