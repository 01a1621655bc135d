"""Rebuild the queueing engine from admission's repositories at the start of a cycle.

The engine is rebuilt for every cycle, inside the cycle's transaction and under its advisory
lock, so a restarted or second replica needs no warm-up and never decides on a stale view."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from tessera.admission.domain.documents import StoredConfig
from tessera.admission.domain.model import HOLDS_QUOTA, JobState
from tessera.admission.domain.queueing import (
    QueueingConfig,
    QueueingEngine,
    QueueingValidationError,
    ShapeOracle,
    Workload,
)
from tessera.admission.domain.workloads import OPEN_FLAVOR, OPEN_QUEUE, ActiveJob, open_config, to_workload
from tessera.admission.service_layer.configuration import usable_config
from tessera.admission.service_layer.shape_view import free_shape
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork

log = logging.getLogger(__name__)


@dataclass
class CycleState:
    stored: StoredConfig
    config: QueueingConfig
    engine: QueueingEngine
    jobs: dict[str, ActiveJob]
    """Every queued job and every job holding quota, by id (in open mode, in the open queue)."""
    oracle: ShapeOracle | None
    inadmissible: dict[str, str] = field(default_factory=dict)
    """Queued jobs the current configuration can no longer take, with the reason."""


async def load_cycle_state(uow: AdmissionUnitOfWork, now: datetime) -> CycleState:
    stored = await uow.config.load()
    active = await uow.jobs.active()
    open_mode = stored.open_mode
    if open_mode:
        config = open_config({r for job in active for g in job.workload["groups"] for r in g["requests"]})
    else:
        config = usable_config(stored)
    engine = QueueingEngine(config)
    state = CycleState(stored, config, engine, {}, None)
    workloads: dict[str, Workload] = {}
    for job in active:
        if open_mode:
            job.queue = OPEN_QUEUE
        wl = job.workload
        workloads[job.id] = to_workload(
            job.id,
            job.queue,
            wl["groups"],
            priority=job.priority,
            created_at=job.submitted_at.timestamp(),
            preemptible=wl.get("preemptible", True),
            checkpointable=wl.get("checkpointable", False),
            config=config,
            open_mode=open_mode,
        )
        state.jobs[job.id] = job
    holding = [job.id for job in active if job.state in HOLDS_QUOTA]
    # When each saved its newest checkpoint: preemption prefers victims that lose the least work.
    checkpointed = await uow.checkpoints.latest_times(holding)
    for job in active:
        if job.state not in HOLDS_QUOTA:
            continue
        flavors = tuple(OPEN_FLAVOR for _ in job.flavors) if open_mode else job.flavors
        saved = checkpointed.get(job.id)
        try:
            engine.restore_admitted(
                workloads[job.id],
                flavors,
                (job.admitted_at or now).timestamp(),
                saved.timestamp() if saved is not None else None,
            )
        except QueueingValidationError as exc:
            log.warning("admitted job no longer fits the configuration: %s", exc, extra={"job_id": job.id})
    for job in active:
        if job.state is JobState.QUEUED:
            try:
                engine.submit(workloads[job.id])
            except QueueingValidationError as exc:
                state.inadmissible[job.id] = f"{exc.field}: {exc.reason}"
    await _restore_preemptions(uow, engine)
    await _restore_fair_share(uow, engine, config)
    state.oracle = await _oracle(uow, state, workloads, open_mode)
    return state


async def _restore_preemptions(uow: AdmissionUnitOfWork, engine: QueueingEngine) -> None:
    """The preemptions of preemptors still queued, with every victim one of them waits for: also
    those a preemptor cancelled since asked to leave (each draining row names who asked)."""
    inflight, draining = await uow.cycle_records.preemptions()
    asked = {d.victim: d for d in draining}
    for record in inflight:
        if not engine.is_pending(record.preemptor):
            continue  # admitted or cancelled since: its reservation went with it
        try:
            engine.restore_preemption(record, asked)
        except QueueingValidationError as exc:
            # One record that no longer fits must not stop the cycle: its preemptor searches again.
            log.warning(
                "in-flight preemption dropped, its preemptor searches again: %s",
                exc,
                extra={"job_id": record.preemptor},
            )


async def _restore_fair_share(
    uow: AdmissionUnitOfWork, engine: QueueingEngine, config: QueueingConfig
) -> None:
    if not config.fair_sharing.enabled:
        return
    last: float | None = None
    for queue, (history, sampled_at) in (await uow.cycle_records.fair_share()).items():
        if queue in config.queues:
            engine.fair_share.seed_history(queue, history)
            last = sampled_at.timestamp()
    if last is not None:
        engine.fair_share.sample(last)  # sets the time of the last sample; nothing is folded
    engine.fair_share.remember(engine.usage_by_queue())


async def _oracle(
    uow: AdmissionUnitOfWork, state: CycleState, workloads: dict[str, Workload], open_mode: bool
) -> ShapeOracle | None:
    nodes = await uow.inventory.nodes()
    if not nodes:
        return None
    engine = state.engine
    holding = [j for j, a in state.jobs.items() if a.state in HOLDS_QUOTA]
    placed = await uow.inventory.placements_of(holding)
    used: dict[str, int] = {}
    for pods in placed.values():
        for pod in pods:
            for gpu in pod.get("gpus", []):
                used[gpu["uuid"]] = used.get(gpu["uuid"], 0) + int(gpu.get("milli", 1000))
    by_model = {(f.gpu_model or f.name).lower(): f.name for f in state.stored.flavors}
    specs = [f.to_domain() for f in state.stored.flavors]
    labels = await uow.inventory.node_labels() if specs else {}
    oracle = free_shape(nodes, used, by_model, OPEN_FLAVOR if open_mode else None, specs, labels)
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
