"""Plan layouts: recorded demand signals feed the batching window; when it closes, the planner runs
over the cluster as it is, and each node it changes gets an operation (`layout_planned`).

Signals are read back from the events the consumers recorded, in order, so the window survives a
restart (it resumes from the last full `demand_changed`) and every replica sees the same inputs. A
node with an open operation is shown to the planner as it will be once the operation is done, and
pinned, so the same demand never causes a second change elsewhere while the first is under way."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from tessera.cluster.domain.node import Node
from tessera.contracts.events import DemandChanged, ForecastUpdated, GangUnschedulable, GpuIdle
from tessera.slicing.adapters.repository import Signal
from tessera.slicing.adapters.usage_repository import minute_of
from tessera.slicing.domain.cluster_plan import NodeState, PlannerSettings, plan_cluster
from tessera.slicing.domain.demand import (
    DemandWindow,
    ForecastDemand,
    GangBlocked,
    GpuIdleSignal,
    PendingDemand,
    PodShape,
)
from tessera.slicing.domain.demand import Signal as DemandSignal
from tessera.slicing.domain.layout import GpuLayout, LayoutPlan
from tessera.slicing.domain.operation import NodeChange, Operation
from tessera.slicing.service_layer.cluster_view import node_changes, node_state
from tessera.slicing.service_layer.ports import ClusterOps
from tessera.slicing.service_layer.unit_of_work import SlicingUnitOfWork
from tessera.slicing.service_layer.usage import load_history

log = logging.getLogger(__name__)

#: the first type is the full snapshot a restarted window resumes from
SIGNAL_TYPES = (DemandChanged.TYPE, GangUnschedulable.TYPE, GpuIdle.TYPE, ForecastUpdated.TYPE)


@dataclass
class Planning:
    cluster: ClusterOps
    uow: Callable[[], SlicingUnitOfWork]
    window: DemandWindow
    settings: PlannerSettings
    clock: Callable[[], datetime]
    cursor: int | None = None
    last_plan: LayoutPlan | None = field(default=None)


async def read_signals(planning: Planning, limit: int = 500) -> int:
    """Add the signals recorded since the last read to the window; how many were read."""
    async with planning.uow() as uow:
        rows = await uow.signals.after(planning.cursor, SIGNAL_TYPES, limit)
    for row in rows:
        planning.cursor = row.seq
        signal = to_signal(row)
        if signal is not None:
            planning.window.add(signal)
    return len(rows)


def to_signal(row: Signal) -> DemandSignal | None:
    """A recorded event as the window's input; None (logged) for one it cannot use."""
    at = row.occurred_at.timestamp()
    try:
        if row.type == DemandChanged.TYPE:
            demand = DemandChanged.model_validate(row.data)
            return PendingDemand(at, tuple((_shape(d), d.pods) for d in demand.demand))
        if row.type == GangUnschedulable.TYPE:
            return GangBlocked(at, GangUnschedulable.model_validate(row.data).job_id)
        if row.type == GpuIdle.TYPE:
            idle = GpuIdle.model_validate(row.data)
            return GpuIdleSignal(at, idle.node, idle.gpu_index, idle.mean_utilization_pct)
        forecast = ForecastUpdated.model_validate(row.data)
        return ForecastDemand(at, tuple((d.shape, d.served) for d in forecast.demand))
    except ValueError as exc:
        log.warning("a demand signal the planner cannot use", extra={"type": row.type, "error": str(exc)})
        return None


def _shape(demand: Any) -> PodShape:
    if demand.mig_profile:
        return PodShape.mig(demand.mig_profile)
    if demand.milli < 1000:
        return PodShape.share(demand.milli, demand.models)
    return PodShape.whole(max(1, demand.gpus), demand.models)


async def plan_round(planning: Planning) -> list[str]:
    """Close the window if it is due, plan, and store an operation per node to change; their ids."""
    now = planning.clock()
    batch = planning.window.close(now.timestamp())
    if batch is None:
        return []
    nodes = {node.name: node for node in await planning.cluster.nodes()}
    pods = await planning.cluster.bound_pods()
    async with planning.uow() as uow:
        underway = {op.change.node: op.change for op in await uow.operations.open_ones()}
        recent = await uow.operations.succeeded_since(now - timedelta(seconds=planning.settings.min_dwell_s))
        history = await load_history(uow, planning.settings.usage, now)
    now_minute = minute_of(now)

    def usage(pod: str) -> tuple[float, ...] | None:
        return history.series(pod, now_minute)

    changed_at: dict[str, dict[int, datetime]] = {}
    for op in recent:
        for gpu in op.change.gpus:
            changed_at.setdefault(op.change.node, {})[gpu.index] = op.updated_at
    states = []
    busy: dict[str, frozenset[int]] = {}
    for name, node in nodes.items():
        on_node = [p for p in pods if p.node_name == name]
        state = node_state(node, on_node, changed_at.get(name, {}), now, usage)
        if state is not None:
            busy[name] = frozenset(g.index for g in state.gpus if g.busy)
            states.append(_as_it_will_be(state, underway[name]) if name in underway else state)
    plan = plan_cluster(states, batch.demand(), planning.settings)
    planning.last_plan = plan
    for explanation in plan.explanations:
        log.warning("demand the plan cannot serve", extra={"reason": explanation})
    measured = sum(1 for state in states for g in state.gpus for p in g.pods if p.history is not None)
    if measured:
        log.info("pods sized by measured use", extra={"pods": measured, "history_pods": len(history.pods)})
    return await _store(planning, node_changes(plan, _free(nodes, underway), busy), now)


def _as_it_will_be(state: NodeState, change: NodeChange) -> NodeState:
    """A node under reconfiguration: its changed GPUs as they will be, and nothing more to change."""
    desired = {g.index: g for g in change.gpus}
    gpus = []
    for gpu in state.gpus:
        target = desired.get(gpu.index)
        if target is None:
            gpus.append(gpu)
            continue
        layout = _layout(target.kind, target.mig_profiles, target.replicas, gpu.model)
        gpus.append(replace(gpu, layout=layout, held=frozenset()))
    return replace(state, gpus=tuple(gpus), pinned=True)


def _layout(kind: str, profiles: tuple[str, ...], replicas: int, model: Any) -> GpuLayout:
    if kind == "mig":
        if model.mig is None:
            return GpuLayout.exclusive()
        return GpuLayout.mig_geometry((i.profile, i.start) for i in model.mig.place(profiles))
    if kind == "time_slicing":
        return GpuLayout.time_slicing(replicas) if replicas > 1 else GpuLayout.exclusive()
    if kind == "mps":
        return GpuLayout.mps(replicas)
    return GpuLayout.exclusive()


def _free(nodes: Mapping[str, Node], underway: Mapping[str, NodeChange]) -> dict[str, Node]:
    return {name: node for name, node in nodes.items() if name not in underway}


async def _store(planning: Planning, changes: list[NodeChange], now: datetime) -> list[str]:
    created = []
    async with planning.uow() as uow:
        for change in changes:
            op = Operation.plan(f"op-{uuid.uuid4().hex[:16]}", change, now)
            if await uow.operations.add(op):
                created.append(op.operation_id)
                log.info(
                    "layout planned",
                    extra={"operation": op.operation_id, "node": change.node, "config": change.config},
                )
        await uow.commit()
    return created
