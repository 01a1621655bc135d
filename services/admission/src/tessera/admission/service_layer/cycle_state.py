"""Rebuild the queueing engine from admission's tables at the start of a cycle.

The engine is rebuilt for every cycle, inside the cycle's transaction and under its advisory
lock, so a restarted or second replica needs no warm-up and never decides on a stale view."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.config_repository import ConfigRepository, StoredConfig
from tessera.admission.adapters.orm import (
    draining_victims,
    fair_share_history,
    inflight_preemptions,
    inventory_nodes,
    jobs,
    placements,
)
from tessera.admission.domain.model import ACTIVE, HOLDS_QUOTA, JobState
from tessera.admission.domain.queueing import (
    InFlightPreemption,
    PreemptionReason,
    QueueingConfig,
    QueueingEngine,
    QueueingValidationError,
    ShapeOracle,
    Workload,
)
from tessera.admission.domain.queueing.model import DrainingVictim
from tessera.admission.domain.workloads import OPEN_FLAVOR, open_config, to_workload
from tessera.admission.service_layer.shape_view import free_shape

log = logging.getLogger(__name__)


def encode_usage(usage: dict[tuple[str, str], int]) -> dict[str, int]:
    return {f"{flavor}|{res}": qty for (flavor, res), qty in usage.items()}


def decode_usage(raw: dict[str, int]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for key, qty in raw.items():
        flavor, res = key.split("|", 1)
        out[(flavor, res)] = int(qty)
    return out


@dataclass
class ActiveJob:
    id: str
    tenant: str
    queue: str
    state: JobState
    wait: tuple[str | None, str | None]
    preempted_by: str | None


@dataclass
class CycleState:
    stored: StoredConfig
    config: QueueingConfig
    engine: QueueingEngine
    jobs: dict[str, ActiveJob]
    oracle: ShapeOracle | None
    inadmissible: dict[str, str] = field(default_factory=dict)
    """Queued jobs the current configuration can no longer take, with the reason."""


async def load_cycle_state(session: AsyncSession, now: datetime) -> CycleState:
    stored = await ConfigRepository(session).load()
    rows = (
        await session.execute(
            select(
                jobs.c.id,
                jobs.c.tenant,
                jobs.c.queue,
                jobs.c.priority,
                jobs.c.state,
                jobs.c.submitted_at,
                jobs.c.workload,
                jobs.c.flavors,
                jobs.c.admitted_at,
                jobs.c.wait_reason,
                jobs.c.wait_message,
                jobs.c.preempted_by,
            )
            .where(jobs.c.state.in_([s.value for s in ACTIVE]), jobs.c.workload.is_not(None))
            .order_by(jobs.c.submitted_at, jobs.c.id)
        )
    ).all()
    open_mode = stored.open_mode
    if open_mode:
        resources = {r for row in rows for g in row.workload["groups"] for r in g["requests"]}
        config = open_config(resources)
    else:
        config = stored.build()
    engine = QueueingEngine(config)
    state = CycleState(stored, config, engine, {}, None)
    workloads: dict[str, Workload] = {}
    for row in rows:
        queue = "default" if open_mode else row.queue
        wl = row.workload
        workloads[row.id] = to_workload(
            row.id,
            queue,
            wl["groups"],
            priority=row.priority,
            created_at=row.submitted_at.timestamp(),
            preemptible=wl.get("preemptible", True),
            checkpointable=wl.get("checkpointable", False),
            config=config,
            open_mode=open_mode,
        )
        state.jobs[row.id] = ActiveJob(
            row.id,
            row.tenant,
            queue,
            JobState(row.state),
            (row.wait_reason, row.wait_message),
            row.preempted_by,
        )
    for row in rows:
        if JobState(row.state) not in HOLDS_QUOTA:
            continue
        flavors = tuple(row.flavors or ())
        if open_mode:
            flavors = tuple(OPEN_FLAVOR for _ in flavors)
        try:
            engine.restore_admitted(workloads[row.id], flavors, (row.admitted_at or now).timestamp())
        except QueueingValidationError as exc:
            log.warning("admitted job no longer fits the configuration: %s", exc, extra={"job_id": row.id})
    for row in rows:
        if JobState(row.state) is JobState.QUEUED:
            try:
                engine.submit(workloads[row.id])
            except QueueingValidationError as exc:
                state.inadmissible[row.id] = f"{exc.field}: {exc.reason}"
    await _restore_preemptions(session, engine)
    await _restore_fair_share(session, engine, config)
    state.oracle = await _oracle(session, engine, state, workloads, open_mode)
    return state


async def _restore_preemptions(session: AsyncSession, engine: QueueingEngine) -> None:
    draining = {r.victim: r for r in await session.execute(select(draining_victims))}
    for r in await session.execute(
        select(inflight_preemptions).order_by(inflight_preemptions.c.requested_at)
    ):
        if not engine.is_pending(r.preemptor):
            continue
        record = InFlightPreemption(
            r.preemptor,
            tuple(r.victims),
            r.requested_at.timestamp(),
            r.deadline.timestamp(),
            tuple(r.flavors),
            decode_usage(r.usage),
        )
        mine = [
            DrainingVictim(v, r.preemptor, PreemptionReason(d.reason), d.deadline.timestamp())
            for v, d in draining.items()
            if d.preemptor == r.preemptor and engine.is_admitted(v)
        ]
        engine.reserve_for_preemptor(record, engine.workload(r.preemptor).queue, mine)


async def _restore_fair_share(session: AsyncSession, engine: QueueingEngine, config: QueueingConfig) -> None:
    if not config.fair_sharing.enabled:
        return
    last: float | None = None
    for r in await session.execute(select(fair_share_history)):
        if r.queue in config.queues:
            engine.fair_share.seed_history(r.queue, decode_usage_float(r.history))
            last = r.sampled_at.timestamp()
    if last is not None:
        engine.fair_share.sample(last)  # sets the time of the last sample; nothing is folded
    engine.fair_share.remember(engine.usage_by_queue())


def decode_usage_float(raw: dict[str, Any]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for key, qty in raw.items():
        flavor, res = key.split("|", 1)
        out[(flavor, res)] = float(qty)
    return out


async def _oracle(
    session: AsyncSession,
    engine: QueueingEngine,
    state: CycleState,
    workloads: dict[str, Workload],
    open_mode: bool,
) -> ShapeOracle | None:
    nodes = [(r.name, list(r.gpus)) for r in await session.execute(select(inventory_nodes))]
    if not nodes:
        return None
    holding = [j for j, a in state.jobs.items() if a.state in HOLDS_QUOTA]
    used: dict[str, int] = {}
    placed: set[str] = set()
    if holding:
        for r in await session.execute(select(placements).where(placements.c.job_id.in_(holding))):
            placed.add(r.job_id)
            for pod in r.pods:
                for gpu in pod.get("gpus", []):
                    used[gpu["uuid"]] = used.get(gpu["uuid"], 0) + int(gpu.get("milli", 1000))
    by_model = {(f.gpu_model or f.name).lower(): f.name for f in state.stored.flavors}
    oracle = free_shape(nodes, used, by_model, OPEN_FLAVOR if open_mode else None)
    if oracle is None:
        return None
    # Admitted jobs the scheduler has not placed yet will take room too.
    for job_id in holding:
        if job_id in placed or not engine.is_admitted(job_id):
            continue
        admitted = engine.admitted(job_id)
        placement = oracle.try_place(workloads[job_id], admitted.flavors)
        if placement is not None:
            oracle.commit(placement)
    return oracle
