"""The scheduler's state in Postgres: inventory, placements, and pending gangs with their queue state.

Everything the scheduler decides is here (or on the cluster), so a restart rebuilds the cache and
the queue from it: nothing lives only in memory. `SchedulerRepository` (`service_layer.repository_port`)
is what the service layer sees; `SqlSchedulerRepository` keeps every query in this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, delete, event, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.contracts.events import NodeInventory, PreemptionRequested, ReadyForEviction
from tessera.contracts.jobs import JobSpec
from tessera.scheduler.adapters.deferred_writes import DeferredWrites
from tessera.scheduler.adapters.orm import (
    decision_version,
    evictions_ready,
    inventory_nodes,
    pending_gangs,
    placements,
    preemptions,
)
from tessera.scheduler.domain.placement.model import PodShape
from tessera.scheduler.domain.placement.observed_workload import placed_shape
from tessera.scheduler.service_layer.repository_port import (
    JOB,
    PendingGang,
    PlacementRow,
    Preemption,
    ready_reason,
)

_SCHEDULING_LOCK = 0x7E55E7A  # one placement decision at a time across replicas


def call_after_commit(session: AsyncSession, callback: Callable[[], None]) -> None:
    """Call ``callback`` once the session's transaction has committed (never on a rollback)."""
    event.listen(session.sync_session, "after_commit", lambda _session: callback(), once=True)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class SqlSchedulerRepository:
    """Every query of the scheduler. While a decision cycle holds the lock, its writes to
    placements and pending gangs are deferred (:class:`DeferredWrites`): any other statement,
    and the unit of work's commit, sends them first, so the transaction reads its own writes."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self._deferred: DeferredWrites | None = None

    async def flush(self) -> None:
        if self._deferred:
            await self._deferred.flush()

    async def lock_for_decision(self) -> None:
        await self.flush()
        await self.session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEDULING_LOCK})
        self._deferred = DeferredWrites(self.session)

    async def decision_version(self) -> int:
        await self.flush()
        return int(await self.session.scalar(select(decision_version.c.version)) or 0)

    async def bump_decision_version(self) -> int:
        """Record that this cycle decided something; returns the new version."""
        await self.flush()
        version = await self.session.scalar(
            update(decision_version)
            .where(decision_version.c.id == 1)
            .values(version=decision_version.c.version + 1)
            .returning(decision_version.c.version)
        )
        return int(version or 0)

    # -- inventory -------------------------------------------------------------------------------

    async def replace_inventory(self, source: str, nodes: list[NodeInventory]) -> None:
        await self.flush()
        names = [n.name for n in nodes]
        await self.session.execute(
            delete(inventory_nodes).where(
                inventory_nodes.c.source == source, inventory_nodes.c.name.not_in(names)
            )
        )
        for node in nodes:
            stmt = pg_insert(inventory_nodes).values(
                name=node.name, source=source, data=node.model_dump(mode="json")
            )
            await self.session.execute(
                stmt.on_conflict_do_update(
                    index_elements=[inventory_nodes.c.name],
                    set_={
                        "data": stmt.excluded.data,
                        "source": source,
                        "updated_at": text("clock_timestamp()"),
                    },
                )
            )

    async def mark_gpu_unhealthy(self, node: str, gpu_uuid: str) -> None:
        """Keep a GPU's fault in the stored inventory until the next report says otherwise."""
        await self.flush()
        data = await self.session.scalar(
            select(inventory_nodes.c.data).where(inventory_nodes.c.name == node).with_for_update()
        )
        if data is None:
            return
        inventory = NodeInventory.model_validate(data)
        gpus = [
            gpu.model_copy(update={"healthy": False}) if gpu.uuid == gpu_uuid else gpu
            for gpu in inventory.gpus
        ]
        changed = inventory.model_copy(update={"gpus": gpus})
        await self.session.execute(
            update(inventory_nodes)
            .where(inventory_nodes.c.name == node)
            .values(data=changed.model_dump(mode="json"), updated_at=text("clock_timestamp()"))
        )

    async def inventory_stamp(self) -> tuple[int, datetime | None]:
        """Changes whenever a node is added, removed or updated: (count, last update)."""
        await self.flush()
        row = (await self.session.execute(select(func.count(), func.max(inventory_nodes.c.updated_at)))).one()
        return int(row[0]), row[1]

    async def inventory(self) -> list[NodeInventory]:
        await self.flush()
        rows = (
            await self.session.execute(select(inventory_nodes.c.data).order_by(inventory_nodes.c.name))
        ).all()
        return [NodeInventory.model_validate(data) for (data,) in rows]

    # -- pending gangs ---------------------------------------------------------------------------

    async def add_pending(
        self,
        job_id: str,
        spec: JobSpec | None,
        submitted_at: datetime,
        *,
        source: str = JOB,
        priority: int | None = None,
        trace: Mapping[str, str] | None = None,
        resume_from: str | None = None,
    ) -> bool:
        """Queue a gang unless it is known already; returns whether it was new.

        In a decision cycle the insert is held back with the cycle's other writes and True is
        returned: a cycle queues only the gangs it does not hold, and a known one stays as it was."""
        row = {
            "job_id": job_id,
            "priority": priority if priority is not None else (spec.priority if spec else 0),
            "spec": spec.model_dump(mode="json") if spec is not None else {},
            "submitted_at": submitted_at,
            "source": source,
            "trace": dict(trace or {}),
            "resume_from": resume_from,
        }
        if self._deferred is not None:
            self._deferred.add_pending(row)
            return True
        await self.flush()
        result = await self.session.execute(
            pg_insert(pending_gangs).values(row).on_conflict_do_nothing().returning(pending_gangs.c.job_id)
        )
        return result.first() is not None

    async def pending(self, only: Iterable[str] | None = None) -> list[PendingGang]:
        """Pending gangs by priority then submit time; ``only`` restricts them to those ids."""
        await self.flush()
        query = select(pending_gangs).order_by(
            pending_gangs.c.priority.desc(), pending_gangs.c.submitted_at, pending_gangs.c.job_id
        )
        if only is not None:
            query = query.where(pending_gangs.c.job_id.in_(list(only)))
        rows = (await self.session.execute(query)).mappings()
        return [
            PendingGang(
                job_id=row["job_id"],
                source=row["source"],
                spec=JobSpec.model_validate(row["spec"]) if row["source"] == JOB else None,
                priority=row["priority"],
                submitted_at=row["submitted_at"],
                attempts=row["attempts"],
                reason_code=row["reason_code"],
                last_reason=row["last_reason"],
                backoff_until=row["backoff_until"],
                trace=row["trace"] or {},
                resume_from=row["resume_from"],
            )
            for row in rows
        ]

    async def pending_ids(self) -> set[str]:
        await self.flush()
        return set((await self.session.scalars(select(pending_gangs.c.job_id))).all())

    async def record_requeued(
        self, job_id: str, attempts: int, reason_code: str, message: str, backoff_until: float
    ) -> None:
        if self._deferred is not None:
            self._deferred.requeue(
                {
                    "gang": job_id,
                    "new_attempts": attempts,
                    "new_reason_code": reason_code,
                    "new_last_reason": message,
                    "new_backoff_until": at(backoff_until),
                }
            )
            return
        await self.session.execute(
            update(pending_gangs)
            .where(pending_gangs.c.job_id == job_id)
            .values(
                attempts=attempts,
                reason_code=reason_code,
                last_reason=message,
                backoff_until=at(backoff_until),
            )
        )

    async def remove_pending(self, job_id: str) -> None:
        if self._deferred is not None:
            self._deferred.remove_pending(job_id)
            return
        await self.session.execute(delete(pending_gangs).where(pending_gangs.c.job_id == job_id))

    # -- placements ------------------------------------------------------------------------------

    async def record_placements(self, rows: Iterable[PlacementRow]) -> None:
        values: list[dict[str, Any]] = [
            {
                "job_id": row.job_id,
                "pod": row.pod,
                "pod_group": row.pod_group,
                "node": row.node,
                "gpus": [{"index": index, "milli": milli} for index, milli in row.gpus],
                "cpu_milli": row.cpu_milli,
                "memory_mib": row.memory_mib,
            }
            for row in rows
        ]
        if self._deferred is not None:
            for value in values:
                self._deferred.insert_placement(value)
            return
        if values:
            stmt = pg_insert(placements).values(values)
            await self.session.execute(stmt.on_conflict_do_nothing())

    async def placements(self) -> list[PlacementRow]:
        await self.flush()
        rows = (await self.session.execute(select(placements).order_by(placements.c.placed_at))).mappings()
        return [
            PlacementRow(
                job_id=row["job_id"],
                pod=row["pod"],
                pod_group=row["pod_group"],
                node=row["node"],
                gpus=tuple((int(g["index"]), int(g["milli"])) for g in row["gpus"]),
                cpu_milli=row["cpu_milli"],
                memory_mib=row["memory_mib"],
            )
            for row in rows
        ]

    async def recent_gpu_shapes(self, limit: int) -> list[PodShape]:
        """The shapes of the latest ``limit`` placements that hold GPU milli, newest first."""
        await self.flush()
        rows = (
            await self.session.execute(
                select(placements.c.gpus, placements.c.cpu_milli, placements.c.memory_mib)
                .where(func.jsonb_array_length(placements.c.gpus) > 0)
                .order_by(placements.c.placed_at.desc(), placements.c.job_id, placements.c.pod)
                .limit(limit)
            )
        ).all()
        shapes = (
            placed_shape(tuple((int(g["index"]), int(g["milli"])) for g in gpus), cpu_milli, memory_mib)
            for gpus, cpu_milli, memory_mib in rows
        )
        return [shape for shape in shapes if shape is not None]

    async def is_placed(self, job_id: str) -> bool:
        await self.flush()
        found = await self.session.scalar(
            select(placements.c.pod).where(placements.c.job_id == job_id).limit(1)
        )
        return found is not None

    async def release_pod(self, pod: str) -> None:
        if self._deferred is not None:
            self._deferred.release_pod(pod)
            return
        await self.session.execute(delete(placements).where(placements.c.pod == pod))

    async def release_job(self, job_id: str) -> None:
        if self._deferred is not None:
            self._deferred.release_job(job_id)
            return
        await self.session.execute(delete(placements).where(placements.c.job_id == job_id))

    # -- preemptions -----------------------------------------------------------------------------

    async def add_preemption(self, request: PreemptionRequested) -> None:
        """Record a request; a repeat (say, now forced) replaces the earlier one."""
        await self.flush()
        values = {
            "job_id": request.victim_job_id,
            "preemptor_job_id": request.preemptor_job_id,
            "reason": request.reason,
            "deadline": request.deadline,
            "grace_period_s": int(request.grace_period_s),
            "checkpointable": request.checkpointable,
            "forced": request.forced,
        }
        stmt = pg_insert(preemptions).values(values)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[preemptions.c.job_id], set_={k: v for k, v in values.items() if k != "job_id"}
            )
        )

    async def add_withdrawal(self, job_id: str, reason: str, at_time: datetime) -> None:
        """The job left admission for good (finished, cancelled): whatever it holds goes at once.

        Kept with the preemptions (no preemptor); an earlier request for the job becomes forced."""
        await self.flush()
        stmt = pg_insert(preemptions).values(
            job_id=job_id, preemptor_job_id="", reason=reason, deadline=at_time, forced=True
        )
        await self.session.execute(
            stmt.on_conflict_do_update(index_elements=[preemptions.c.job_id], set_={"forced": True})
        )

    async def mark_ready_for_eviction(self, event: ReadyForEviction) -> None:
        await self.flush()
        values = {
            "job_id": event.job_id,
            "preemptor_job_id": event.preemptor_job_id or "",
            "reason": event.reason,
            "checkpoint_uri": event.checkpoint_uri,
            "step": event.step,
        }
        stmt = pg_insert(evictions_ready).values(values)
        await self.session.execute(
            stmt.on_conflict_do_update(
                index_elements=[evictions_ready.c.job_id, evictions_ready.c.preemptor_job_id],
                set_={k: v for k, v in values.items() if k not in ("job_id", "preemptor_job_id")},
            )
        )

    async def due_preemptions(self, now: float) -> list[Preemption]:
        """Victims to evict now: they cannot checkpoint, the request is forced, the checkpoint service
        let them go, or the deadline passed."""
        await self.flush()
        ready = evictions_ready
        answered = and_(
            ready.c.job_id == preemptions.c.job_id, ready.c.preemptor_job_id == preemptions.c.preemptor_job_id
        )
        rows = (
            await self.session.execute(
                select(
                    preemptions, ready.c.reason.label("ready_reason"), ready.c.step, ready.c.checkpoint_uri
                )
                .select_from(preemptions.outerjoin(ready, answered))
                .where(
                    or_(
                        preemptions.c.checkpointable.is_(False),
                        preemptions.c.forced.is_(True),
                        preemptions.c.deadline <= at(now),
                        ready.c.job_id.is_not(None),
                    )
                )
                .order_by(preemptions.c.requested_at, preemptions.c.job_id)
            )
        ).mappings()
        return [
            Preemption(
                row["job_id"],
                row["preemptor_job_id"],
                row["reason"],
                row["grace_period_s"],
                ready_reason(row["ready_reason"], row["step"], row["checkpoint_uri"]),
            )
            for row in rows
        ]

    async def next_preemption_deadline(self) -> float | None:
        await self.flush()
        deadline = await self.session.scalar(select(func.min(preemptions.c.deadline)))
        return deadline.timestamp() if deadline is not None else None

    async def remove_preemption(self, job_id: str) -> None:
        await self.flush()
        await self.session.execute(delete(preemptions).where(preemptions.c.job_id == job_id))
        await self.session.execute(delete(evictions_ready).where(evictions_ready.c.job_id == job_id))
