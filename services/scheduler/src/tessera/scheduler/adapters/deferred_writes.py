"""A decision cycle's writes to placements and pending gangs, held back and sent as a few statements.

A cycle records what it decided gang by gang (a new gang queued, a placement's rows, the gang leaving
the pending queue, a requeue's attempts, a finished job's rows going), which sent one statement,
and one round trip, per gang. Held back until the repository next reads, writes otherwise or commits, they go as
one statement per kind of change: rows inserted together, rows deleted with ``= ANY(:keys)``
(the same statement text whatever the count, so it stays prepared), updates as one executemany.

Changes to different rows commute, so each kind is sent at once when no row is touched by two
kinds; otherwise runs of one kind are sent in the order they were made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ARRAY, String, any_, bindparam, delete, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql import Executable

from tessera.scheduler.adapters.orm import pending_gangs, placements

_KEYS = bindparam("keys", type_=ARRAY(String))

_STATEMENTS: dict[str, Executable] = {
    "insert_placements": pg_insert(placements).on_conflict_do_nothing(),
    "release_pods": delete(placements).where(placements.c.pod == any_(_KEYS)),
    "release_jobs": delete(placements).where(placements.c.job_id == any_(_KEYS)),
    "add_pending": pg_insert(pending_gangs).on_conflict_do_nothing(),
    "remove_pending": delete(pending_gangs).where(pending_gangs.c.job_id == any_(_KEYS)),
    "requeue": update(pending_gangs)
    .where(pending_gangs.c.job_id == bindparam("gang"))
    .values(
        attempts=bindparam("new_attempts"),
        reason_code=bindparam("new_reason_code"),
        last_reason=bindparam("new_last_reason"),
        backoff_until=bindparam("new_backoff_until"),
    ),
}
_BY_KEYS = frozenset({"release_pods", "release_jobs", "remove_pending"})


@dataclass(frozen=True)
class _Write:
    kind: str
    table: str
    touches: frozenset[str]  # the rows it changes: "job:<id>", "pod:<key>"
    value: Any  # a key (deletes) or a row of parameters (inserts, updates)


@dataclass
class DeferredWrites:
    """Writes held back on ``session`` until :meth:`flush`."""

    session: AsyncSession
    _writes: list[_Write] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._writes)

    def insert_placement(self, row: dict[str, Any]) -> None:
        self._add("insert_placements", "placements", {f"job:{row['job_id']}", f"pod:{row['pod']}"}, row)

    def release_pod(self, pod: str) -> None:
        self._add("release_pods", "placements", {f"pod:{pod}"}, pod)

    def release_job(self, job_id: str) -> None:
        self._add("release_jobs", "placements", {f"job:{job_id}"}, job_id)

    def add_pending(self, row: dict[str, Any]) -> None:
        self._add("add_pending", "pending", {f"job:{row['job_id']}"}, row)

    def remove_pending(self, job_id: str) -> None:
        self._add("remove_pending", "pending", {f"job:{job_id}"}, job_id)

    def requeue(self, row: dict[str, Any]) -> None:
        self._add("requeue", "pending", {f"job:{row['gang']}"}, row)

    async def flush(self) -> None:
        """Send what is held back, in as few statements as the order of the changes allows."""
        writes, self._writes = self._writes, []
        for table in ("placements", "pending"):
            ours = [write for write in writes if write.table == table]
            for kind, values in _batches(ours):
                if kind in _BY_KEYS:
                    await self.session.execute(_STATEMENTS[kind], {"keys": list(dict.fromkeys(values))})
                else:
                    await self.session.execute(_STATEMENTS[kind], values)

    def _add(self, kind: str, table: str, touches: set[str], value: Any) -> None:
        self._writes.append(_Write(kind, table, frozenset(touches), value))


def _batches(writes: list[_Write]) -> list[tuple[str, list[Any]]]:
    """(kind, values) statements: one per kind when no row is changed by two kinds, else per run."""
    kinds_of: dict[str, set[str]] = {}
    for write in writes:
        for row in write.touches:
            kinds_of.setdefault(row, set()).add(write.kind)
    if all(len(kinds) == 1 for kinds in kinds_of.values()):
        grouped: dict[str, list[Any]] = {}
        for write in writes:
            grouped.setdefault(write.kind, []).append(write.value)
        return list(grouped.items())
    runs: list[tuple[str, list[Any]]] = []
    for write in writes:
        if runs and runs[-1][0] == write.kind:
            runs[-1][1].append(write.value)
        else:
            runs.append((write.kind, [write.value]))
    return runs
