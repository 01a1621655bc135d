"""The slicing service's state in Postgres: reconfiguration operations, their steps, and node leases.

The protocols are what the service layer sees; the `Sql*` classes keep every query in this module.
Operations the repository loads or adds are handed to `track`, so the unit of work publishes the
events they record when it commits."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.contracts.events import ReadyForEviction
from tessera.core.db.uow import Aggregate
from tessera.slicing.adapters.orm import node_leases, observed_events, operation_steps, operations
from tessera.slicing.domain.operation import (
    OPEN_STATES,
    ChangeKind,
    GpuTarget,
    NodeChange,
    Operation,
    OpState,
)

Track = Callable[[Aggregate], None]
_OPEN = [state.value for state in OPEN_STATES]


class OperationRepository(Protocol):
    async def add(self, op: Operation) -> bool:
        """Store a new operation; False (nothing stored or announced) when its node has an open one."""
        ...

    async def get(self, operation_id: str) -> Operation | None:
        """The operation, locked until the unit ends."""
        ...

    async def open_ones(self) -> list[Operation]:
        """Every open operation, oldest first, not locked (to decide which to drive)."""
        ...

    async def open_on(self, node: str) -> Operation | None: ...

    async def save(self, op: Operation) -> None:
        """Store the operation; a changed state (or attempt) also appends a step row."""
        ...

    async def steps(self, operation_id: str) -> list[tuple[str, int, str | None]]:
        """(state, attempts, reason) of each step, in order."""
        ...

    async def succeeded_since(self, since: datetime) -> list[Operation]:
        """Operations that succeeded at or after `since` (for the planner's dwell time)."""
        ...


@dataclass(frozen=True)
class Signal:
    """One recorded event the planner reads: its order, type, when it happened, and its body."""

    seq: int
    type: str
    occurred_at: datetime
    data: Mapping[str, Any]


class SignalRepository(Protocol):
    async def after(self, seq: int | None, types: Collection[str], limit: int) -> list[Signal]:
        """Recorded events of `types` after `seq`, in order; with no `seq`, from the newest event of
        the first type (the last full snapshot) on."""
        ...

    async def ready_for_eviction(self, job_ids: Collection[str], since: datetime) -> set[str]:
        """Those of `job_ids` the checkpoint service let go (`ready_for_eviction`) since `since`."""
        ...


class LeaseRepository(Protocol):
    async def acquire(self, node: str, holder: str, ttl: timedelta) -> bool:
        """Take or renew the node's lease for `ttl`; False while another holder's lease runs."""
        ...

    async def release(self, node: str, holder: str) -> None: ...


class SqlOperationRepository:
    def __init__(self, session: AsyncSession, track: Track) -> None:
        self.session = session
        self.track = track
        self._stored: dict[str, tuple[OpState, int]] = {}

    async def add(self, op: Operation) -> bool:
        inserted = await self.session.execute(
            pg_insert(operations)
            .values(operation_id=op.operation_id, created_at=op.created_at, **_row(op))
            .on_conflict_do_nothing()
            .returning(operations.c.operation_id)
        )
        if inserted.first() is None:
            return False
        await self._step(op)
        self.track(op)
        return True

    async def get(self, operation_id: str) -> Operation | None:
        row = (
            (
                await self.session.execute(
                    select(operations).where(operations.c.operation_id == operation_id).with_for_update()
                )
            )
            .mappings()
            .first()
        )
        return None if row is None else self._tracked(row)

    async def open_ones(self) -> list[Operation]:
        rows = await self.session.execute(
            select(operations).where(operations.c.state.in_(_OPEN)).order_by(operations.c.created_at)
        )
        return [self._tracked(row) for row in rows.mappings()]

    async def open_on(self, node: str) -> Operation | None:
        row = (
            (
                await self.session.execute(
                    select(operations).where(operations.c.node == node, operations.c.state.in_(_OPEN))
                )
            )
            .mappings()
            .first()
        )
        return None if row is None else self._tracked(row)

    async def save(self, op: Operation) -> None:
        await self.session.execute(
            update(operations).where(operations.c.operation_id == op.operation_id).values(**_row(op))
        )
        if self._stored.get(op.operation_id) != (op.state, op.attempts):
            await self._step(op)
        self.track(op)

    async def steps(self, operation_id: str) -> list[tuple[str, int, str | None]]:
        rows = await self.session.execute(
            select(operation_steps.c.state, operation_steps.c.attempts, operation_steps.c.reason)
            .where(operation_steps.c.operation_id == operation_id)
            .order_by(operation_steps.c.seq)
        )
        return [(row.state, row.attempts, row.reason) for row in rows]

    async def succeeded_since(self, since: datetime) -> list[Operation]:
        rows = await self.session.execute(
            select(operations).where(
                operations.c.state == OpState.SUCCEEDED.value, operations.c.updated_at >= since
            )
        )
        return [self._tracked(row) for row in rows.mappings()]

    async def _step(self, op: Operation) -> None:
        self._stored[op.operation_id] = (op.state, op.attempts)
        await self.session.execute(
            insert(operation_steps).values(
                operation_id=op.operation_id,
                state=op.state.value,
                attempts=op.attempts,
                reason=op.reason,
                at=op.updated_at,
            )
        )

    def _tracked(self, row: Any) -> Operation:
        change = NodeChange(
            node=row["node"],
            kind=ChangeKind(row["kind"]),
            config=row["config"],
            body=row["body"],
            gpus=tuple(
                GpuTarget(g["index"], g["uuid"], g["kind"], tuple(g["mig_profiles"]), g["replicas"])
                for g in row["gpus"]
            ),
            expected_resources=dict(row["expected_resources"]),
            previous_config=row["previous_config"],
            drain=row["drain"],
            reason=row["change_reason"],
        )
        op = Operation(
            operation_id=row["operation_id"],
            change=change,
            state=OpState(row["state"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            attempts=row["attempts"],
            written=row["written"],
            retry_at=row["retry_at"],
            deadline=row["deadline"],
            cordoned_by_us=row["cordoned_by_us"],
            reason=row["reason"],
            rebooting_since=row["rebooting_since"],
            reboot_credit=timedelta(seconds=row["reboot_credit_s"]),
        )
        self._stored[op.operation_id] = (op.state, op.attempts)
        self.track(op)
        return op


def _row(op: Operation) -> dict[str, Any]:
    change = op.change
    return {
        "node": change.node,
        "kind": change.kind.value,
        "config": change.config,
        "body": change.body,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "kind": g.kind,
                "mig_profiles": list(g.mig_profiles),
                "replicas": g.replicas,
            }
            for g in change.gpus
        ],
        "expected_resources": dict(change.expected_resources),
        "previous_config": change.previous_config,
        "drain": change.drain,
        "change_reason": change.reason,
        "state": op.state.value,
        "attempts": op.attempts,
        "written": op.written,
        "retry_at": op.retry_at,
        "deadline": op.deadline,
        "cordoned_by_us": op.cordoned_by_us,
        "reason": op.reason,
        "rebooting_since": op.rebooting_since,
        "reboot_credit_s": op.reboot_credit.total_seconds(),
        "updated_at": op.updated_at,
    }


class SqlSignalRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def after(self, seq: int | None, types: Collection[str], limit: int) -> list[Signal]:
        wanted = list(types)
        if seq is None:
            newest = await self.session.scalar(
                select(func.max(observed_events.c.seq)).where(observed_events.c.type == wanted[0])
            )
            seq = (newest - 1) if newest is not None else 0
        rows = await self.session.execute(
            select(
                observed_events.c.seq,
                observed_events.c.type,
                observed_events.c.occurred_at,
                observed_events.c.data,
            )
            .where(observed_events.c.seq > seq, observed_events.c.type.in_(wanted))
            .order_by(observed_events.c.seq)
            .limit(limit)
        )
        return [Signal(row.seq, row.type, row.occurred_at, row.data) for row in rows]

    async def ready_for_eviction(self, job_ids: Collection[str], since: datetime) -> set[str]:
        wanted = set(job_ids)
        if not wanted:
            return set()
        rows = await self.session.execute(
            select(observed_events.c.data).where(
                observed_events.c.type == ReadyForEviction.TYPE, observed_events.c.occurred_at >= since
            )
        )
        return {job for (data,) in rows if (job := (data or {}).get("job_id")) in wanted}


class SqlLeaseRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def acquire(self, node: str, holder: str, ttl: timedelta) -> bool:
        expires = func.now() + ttl
        taken = await self.session.execute(
            pg_insert(node_leases)
            .values(node=node, holder=holder, expires_at=expires)
            .on_conflict_do_update(
                index_elements=[node_leases.c.node],
                set_={"holder": holder, "expires_at": expires},
                where=or_(node_leases.c.holder == holder, node_leases.c.expires_at < func.now()),
            )
            .returning(node_leases.c.holder)
        )
        return taken.first() is not None

    async def release(self, node: str, holder: str) -> None:
        await self.session.execute(
            delete(node_leases).where(and_(node_leases.c.node == node, node_leases.c.holder == holder))
        )
