"""The cluster plan: a fast heuristic that turns batched demand into desired layouts per GPU.

Three passes, each over the GPUs it may change (never a pinned node, never a GPU whose layout
changed within the dwell time, and, unless allowed, never a GPU with running pods):

1. **MIG.** Free instances already there serve first. Then, repeatedly, every candidate GPU gets
   its exact best geometry for the demand left (`single_gpu`), and the GPU that serves the most
   compute takes it: idle before busy, lower utilisation first. GPUs alike (same model, layout and
   held slices) are scored once per round, so a round costs a few hundred geometries per kind.
2. **Whole GPUs.** Free exclusive GPUs serve first; then idle MIG GPUs go back to exclusive on
   nodes whose whole GPUs are exclusive, and idle time-sliced nodes go back to exclusive.
3. **Fractional.** Shares pack into the free replicas of shared GPUs, then whole idle exclusive
   nodes are shared with the replicas `time_slicing` chooses (the device plugin shares every whole
   GPU of a node alike): under MPS where it serves the shares as well (every GPU's model runs MPS,
   none of the node's GPUs is in MIG mode, and every share fits the equal part of memory and SMs
   that MPS gives each replica), since MPS enforces those limits per client and runs the clients'
   kernels side by side; time-sliced otherwise.

Every change must be worth it: its benefit (GPU-minutes of work it lets run over the benefit
horizon) must exceed its cost (GPU-minutes lost reconfiguring) by the hysteresis ratio. Together
with the dwell time, keeping the current geometry on ties, and never undoing a layout without
demand for another, this keeps layouts from flapping. A slice a running pod holds is never taken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from tessera.slicing.domain.cluster_mig import plan_mig, unsupported_profiles
from tessera.slicing.domain.cluster_shares import plan_shares
from tessera.slicing.domain.cluster_state import GpuState, MigWant, NodeState, PlanDraft, PlannerSettings
from tessera.slicing.domain.demand import PodShape, ShapeKind
from tessera.slicing.domain.layout import GpuChange, GpuLayout, LayoutPlan, PlanScore, SharingMode

__all__ = ["GpuState", "MigWant", "NodeState", "PlannerSettings", "plan_cluster"]


def plan_cluster(
    nodes: Iterable[NodeState], demand: Mapping[PodShape, int], settings: PlannerSettings | None = None
) -> LayoutPlan:
    """Desired layouts for the GPUs that should change, with reasons, scores and explanations."""
    settings = settings or PlannerSettings()
    by_name = {node.name: node for node in sorted(nodes, key=lambda n: n.name)}
    draft = PlanDraft(by_name, settings, {})
    explanations: list[str] = []
    mig_demand: Counter[MigWant] = Counter()
    whole: list[PodShape] = []
    shares: list[int] = []
    for shape, pods in sorted(demand.items()):
        if pods < 0:
            raise ValueError(f"demand[{shape}]: pods must be >= 0, got {pods}")
        if shape.kind is ShapeKind.MIG:
            assert shape.mig_profile is not None
            mig_demand[(shape.mig_profile, shape.models)] += pods
        elif shape.kind is ShapeKind.WHOLE:
            whole.extend([shape] * pods)
        else:
            shares.extend([shape.milli] * pods)
    explanations += unsupported_profiles(by_name.values(), mig_demand)
    explanations += plan_mig(draft, mig_demand)
    explanations += _plan_whole(draft, whole)
    explanations += plan_shares(draft, shares)
    changes = []
    total = PlanScore()
    for (node_name, index), (layout, reason, score) in sorted(draft.desired.items()):
        gpu = next(g for g in by_name[node_name].gpus if g.index == index)
        if layout == gpu.layout:
            continue
        changes.append(GpuChange(node_name, index, gpu.model.name, gpu.layout, layout, reason, score))
        total = total + score
    return LayoutPlan(tuple(changes), tuple(explanations), total)


def _whole_mode(draft: PlanDraft, node: NodeState) -> tuple[SharingMode, int] | None:
    """How the node's whole (non-MIG) GPUs are shared in the draft; None when it has none."""
    kinds = {
        (layout.mode, layout.replicas)
        for gpu in node.gpus
        if (layout := draft.layout(node.name, gpu)).mode is not SharingMode.MIG
    }
    return min(kinds) if kinds else None


def _plan_whole(draft: PlanDraft, pods: list[PodShape]) -> list[str]:
    if not pods:
        return []
    left: list[PodShape] = []
    free: dict[str, list[GpuState]] = {}
    for node in draft.nodes.values():
        if node.schedulable and _whole_mode(draft, node) == (SharingMode.EXCLUSIVE, 1):
            free[node.name] = [
                g
                for g in node.gpus
                if g.layout.mode is SharingMode.EXCLUSIVE and not g.busy and not draft.touched(node.name, g)
            ]
    for pod in sorted(pods, key=lambda p: -p.gpus):
        fits = [
            n for n, gpus in free.items() if len([g for g in gpus if pod.allows(g.model.name)]) >= pod.gpus
        ]
        if fits:
            chosen = min(fits, key=lambda n: (len(free[n]), n))
            taken = [g for g in free[chosen] if pod.allows(g.model.name)][: pod.gpus]
            free[chosen] = [g for g in free[chosen] if g not in taken]
            draft.reserved.update((chosen, g.index) for g in taken)
        else:
            left.append(pod)
    for pod in left:
        if not _convert_to_exclusive(draft, pod):
            return [f"whole-GPU demand: {len(left)} pod(s) wait, no idle GPU can go back to exclusive"]
    return []


def _convert_to_exclusive(draft: PlanDraft, pod: PodShape) -> bool:
    """Turn idle GPUs of one node back to exclusive for a pending whole-GPU pod, if one node can.

    A node whose whole GPUs are time-sliced goes back whole (the device plugin shares them alike),
    and only when every one of them is idle; idle MIG GPUs go back one by one.
    """
    if not draft.settings.worth_it(float(pod.gpus)):
        return False
    for node in draft.nodes.values():
        idle_mig = [
            g
            for g in node.gpus
            if g.layout.mode is SharingMode.MIG
            and not draft.touched(node.name, g)
            and draft.may_change(node, g)
            and not g.busy
            and pod.allows(g.model.name)
        ]
        shared = [
            g
            for g in node.gpus
            if draft.layout(node.name, g).mode in (SharingMode.TIME_SLICING, SharingMode.MPS)
        ]
        if shared and not all(draft.may_change(node, g) and not g.busy for g in shared):
            continue
        usable = [g for g in shared if pod.allows(g.model.name)]
        if len(usable) + len(idle_mig) < pod.gpus:
            continue
        chosen = shared + idle_mig[: max(0, pod.gpus - len(usable))]
        for i, gpu in enumerate(chosen):
            score = PlanScore(
                pods_placeable=1 if i == 0 else 0, capacity_minutes_lost=draft.settings.reconfigure_minutes
            )
            draft.set(node.name, gpu, GpuLayout.exclusive(), f"pending whole-GPU pod ({pod.gpus} GPU)", score)
        return True
    return False
