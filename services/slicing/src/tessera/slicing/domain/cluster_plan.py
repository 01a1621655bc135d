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
from dataclasses import dataclass, field

from tessera.cluster.catalogue import GpuModel
from tessera.cluster.domain.gpu import MILLI_PER_GPU
from tessera.slicing.domain.demand import PodShape, ShapeKind
from tessera.slicing.domain.geometry import supporting_models
from tessera.slicing.domain.layout import (
    MPS_ARCHITECTURES,
    GpuChange,
    GpuLayout,
    LayoutPlan,
    MigSlice,
    PlanScore,
    SharingMode,
)
from tessera.slicing.domain.single_gpu import SingleGpuPlan, best_geometry
from tessera.slicing.domain.time_slicing import (
    DEFAULT_MAX_REPLICAS,
    PodUse,
    choose_replicas,
    fit_by_usage,
    sharing_layout,
)
from tessera.slicing.domain.usage_history import UsageSettings

# pending MIG pods are counted by (profile, the GPU models they allow; empty for any)
MigWant = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as the planner sees it: its current layout and what runs on it."""

    index: int
    model: GpuModel
    layout: GpuLayout
    held: frozenset[MigSlice] = frozenset()
    running_pods: int = 0
    used_milli: int = 0
    utilization_pct: float | None = None
    changed_s_ago: float | None = None
    #: the pods on the GPU, with their measured use where telemetry has enough of it
    pods: tuple[PodUse, ...] = ()

    def __post_init__(self) -> None:
        if self.running_pods < 0:
            raise ValueError(f"gpu {self.index}: running_pods must be >= 0, got {self.running_pods}")
        if not self.held.issubset(self.layout.mig):
            raise ValueError(f"gpu {self.index}: held slices must be slices of its layout {self.layout}")

    @property
    def busy(self) -> bool:
        return self.running_pods > 0 or bool(self.held)


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: tuple[GpuState, ...]
    pinned: bool = False  # the layout is set by hand (opt-out label): never planned
    schedulable: bool = True
    #: time-sliced under slicing's own config: the scheduler places a share on any free replica,
    #: whatever its milli (elsewhere shares also need the milli left within 1000)
    shares_by_replicas: bool = False


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    reconfigure_minutes: float = 2.0
    benefit_horizon_minutes: float = 30.0
    hysteresis_ratio: float = 1.5
    min_dwell_s: float = 600.0
    max_replicas: int = DEFAULT_MAX_REPLICAS
    change_busy_gpus: bool = False
    prefer_mps: bool = True
    usage: UsageSettings = field(default_factory=UsageSettings)

    def worth_it(self, gpu_fraction_served: float) -> bool:
        benefit = gpu_fraction_served * self.benefit_horizon_minutes
        return benefit >= self.hysteresis_ratio * self.reconfigure_minutes


@dataclass(slots=True)
class _Draft:
    """The plan as it grows: desired layouts and their reasons, by (node, gpu index)."""

    nodes: Mapping[str, NodeState]
    settings: PlannerSettings
    desired: dict[tuple[str, int], tuple[GpuLayout, str, PlanScore]]
    # free GPUs already promised to pending pods as they are: no later pass may change them
    reserved: set[tuple[str, int]] = field(default_factory=set)

    def layout(self, node: str, gpu: GpuState) -> GpuLayout:
        entry = self.desired.get((node, gpu.index))
        return entry[0] if entry else gpu.layout

    def touched(self, node: str, gpu: GpuState) -> bool:
        return (node, gpu.index) in self.desired

    def set(self, node: str, gpu: GpuState, layout: GpuLayout, reason: str, score: PlanScore) -> None:
        self.desired[(node, gpu.index)] = (layout, reason, score)

    def may_change(self, node: NodeState, gpu: GpuState) -> bool:
        if node.pinned or not node.schedulable or self.touched(node.name, gpu):
            return False
        if (node.name, gpu.index) in self.reserved:
            return False
        if gpu.changed_s_ago is not None and gpu.changed_s_ago < self.settings.min_dwell_s:
            return False
        return not gpu.busy or self.settings.change_busy_gpus


def plan_cluster(
    nodes: Iterable[NodeState], demand: Mapping[PodShape, int], settings: PlannerSettings | None = None
) -> LayoutPlan:
    """Desired layouts for the GPUs that should change, with reasons, scores and explanations."""
    settings = settings or PlannerSettings()
    by_name = {node.name: node for node in sorted(nodes, key=lambda n: n.name)}
    draft = _Draft(by_name, settings, {})
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
    explanations += _unsupported_profiles(by_name.values(), mig_demand)
    explanations += _plan_mig(draft, mig_demand)
    explanations += _plan_whole(draft, whole)
    explanations += _plan_shares(draft, shares)
    changes = []
    total = PlanScore()
    for (node_name, index), (layout, reason, score) in sorted(draft.desired.items()):
        gpu = next(g for g in by_name[node_name].gpus if g.index == index)
        if layout == gpu.layout:
            continue
        changes.append(GpuChange(node_name, index, gpu.model.name, gpu.layout, layout, reason, score))
        total = total + score
    return LayoutPlan(tuple(changes), tuple(explanations), total)


def _models_in(nodes: Iterable[NodeState]) -> list[GpuModel]:
    seen: dict[str, GpuModel] = {}
    for node in nodes:
        for gpu in node.gpus:
            seen.setdefault(gpu.model.name, gpu.model)
    return [seen[name] for name in sorted(seen)]


def _unsupported_profiles(nodes: Iterable[NodeState], mig_demand: Counter[MigWant]) -> list[str]:
    models = _models_in(nodes)
    explanations = []
    for want in sorted(mig_demand):
        profile, allowed = want
        eligible = [m for m in models if not allowed or m.name in allowed]
        if not supporting_models(profile, eligible):
            names = ", ".join(m.name for m in models) or "none"
            only = f" among the models it allows ({', '.join(allowed)})" if allowed else ""
            explanations.append(
                f"mig profile {profile}: no GPU model in the cluster supports it{only} (models: {names}); "
                f"{mig_demand[want]} pod(s) stay pending and no layout changes for them"
            )
            del mig_demand[want]
    return explanations


def _describe(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n}x{p}" for p, n in sorted(counts.items()) if n)


def _for_model(demand: Counter[MigWant], gpu_model: str) -> Counter[str]:
    """Pending pods by profile that a GPU of ``gpu_model`` may serve."""
    result: Counter[str] = Counter()
    for (profile, allowed), pods in demand.items():
        if pods > 0 and (not allowed or gpu_model in allowed):
            result[profile] += pods
    return result


def _take(demand: Counter[MigWant], gpu_model: str, served: Mapping[str, int]) -> None:
    """Count served pods off the wants a GPU of ``gpu_model`` may serve, the most constrained first."""
    for profile, count in served.items():
        wants = [w for w in demand if w[0] == profile and demand[w] > 0 and (not w[1] or gpu_model in w[1])]
        for want in sorted(wants, key=lambda w: (len(w[1]) == 0, len(w[1]), w)):
            taken = min(count, demand[want])
            demand[want] -= taken
            count -= taken
    demand += Counter()  # drop the zeros


def _plan_mig(draft: _Draft, demand: Counter[MigWant]) -> list[str]:
    for node in draft.nodes.values():  # free instances serve first
        for gpu in node.gpus:
            if gpu.layout.mode is SharingMode.MIG:
                free = Counter(gpu.layout.mig_profiles) - Counter(s.profile for s in gpu.held)
                _take(demand, gpu.model.name, free)
    demand += Counter()
    while demand:
        best: tuple[tuple[int, bool, float, str, int], NodeState, GpuState, SingleGpuPlan] | None = None
        scored: dict[tuple[str, GpuLayout, frozenset[MigSlice]], SingleGpuPlan] = {}
        for node in draft.nodes.values():
            mps = any(draft.layout(node.name, g).mode is SharingMode.MPS for g in node.gpus)
            for gpu in node.gpus:
                if gpu.model.mig is None or mps or not draft.may_change(node, gpu):
                    continue  # the device plugin does not run MPS beside MIG on one node
                key = (gpu.model.name, gpu.layout, gpu.held)
                if key not in scored:
                    wanted = _for_model(demand, gpu.model.name)
                    scored[key] = best_geometry(gpu.model, wanted, gpu.held, gpu.layout)
                plan = scored[key]
                if plan.served_compute == 0:
                    continue
                rank = (
                    plan.served_compute,
                    not gpu.busy,
                    -(gpu.utilization_pct or 0.0),
                    node.name,
                    -gpu.index,
                )
                if best is None or rank > best[0]:
                    best = (rank, node, gpu, plan)
        if best is None:
            break
        _, node, gpu, plan = best
        assert gpu.model.mig is not None
        if not draft.settings.worth_it(plan.served_compute / gpu.model.mig.compute_slices):
            break  # the best change left serves too little to pay for a reconfiguration
        score = PlanScore(
            pods_placeable=sum(plan.served.values()), capacity_minutes_lost=draft.settings.reconfigure_minutes
        )
        draft.set(node.name, gpu, plan.layout, f"pending mig pods: {_describe(plan.served)}", score)
        _take(demand, gpu.model.name, plan.served)
    if demand:
        left: Counter[str] = Counter()
        for (profile, _), pods in demand.items():
            left[profile] += pods
        return [f"mig demand {_describe(left)}: no idle GPU can take it now; it waits for one"]
    return []


def _whole_mode(draft: _Draft, node: NodeState) -> tuple[SharingMode, int] | None:
    """How the node's whole (non-MIG) GPUs are shared in the draft; None when it has none."""
    kinds = {
        (layout.mode, layout.replicas)
        for gpu in node.gpus
        if (layout := draft.layout(node.name, gpu)).mode is not SharingMode.MIG
    }
    return min(kinds) if kinds else None


def _plan_whole(draft: _Draft, pods: list[PodShape]) -> list[str]:
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


def _convert_to_exclusive(draft: _Draft, pod: PodShape) -> bool:
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


def _plan_shares(draft: _Draft, shares: list[int]) -> list[str]:
    if not shares:
        return []
    # Free replicas of GPUs already time-sliced serve first.
    remaining = sorted(shares, reverse=True)
    assigned: dict[tuple[str, int], list[int]] = {}
    for node in draft.nodes.values():
        for gpu in node.gpus:
            layout = draft.layout(node.name, gpu)
            if layout.mode not in (SharingMode.TIME_SLICING, SharingMode.MPS) or not node.schedulable:
                continue
            slots, room = layout.replicas - gpu.running_pods, MILLI_PER_GPU - gpu.used_milli
            # an MPS client gets an equal part of the GPU: a larger share would not fit its limits
            largest = MILLI_PER_GPU // layout.replicas if layout.mode is SharingMode.MPS else MILLI_PER_GPU
            by_replicas = node.shares_by_replicas and layout.mode is SharingMode.TIME_SLICING
            kept = []
            for share in remaining:
                if slots > 0 and (by_replicas or share <= room) and share <= largest:
                    slots, room = slots - 1, room - share
                    assigned.setdefault((node.name, gpu.index), []).append(share)
                else:
                    kept.append(share)
            remaining = kept
    remaining = _grow_by_use(draft, remaining, assigned)
    if not remaining:
        return []
    choice = choose_replicas(remaining, draft.settings.max_replicas)
    needed = choice.gpus
    candidates = []
    for node in draft.nodes.values():
        whole = [g for g in node.gpus if draft.layout(node.name, g).mode is not SharingMode.MIG]
        changeable = all(draft.may_change(node, g) and not g.busy for g in whole)
        if whole and changeable and all(g.layout.mode is SharingMode.EXCLUSIVE for g in whole):
            candidates.append((node, whole))
    bins = list(choice.bins)
    while needed > 0 and candidates:
        fitting = [c for c in candidates if len(c[1]) >= needed]
        node, whole = (
            min(fitting, key=lambda c: (len(c[1]), c[0].name))
            if fitting
            else max(candidates, key=lambda c: (len(c[1]), c[0].name))
        )
        candidates.remove((node, whole))
        taken, bins = bins[: len(whole)], bins[len(whole) :]
        pods = sum(len(b) for b in taken)
        if not draft.settings.worth_it(sum(sum(b) for b in taken) / MILLI_PER_GPU):
            break
        layout = _sharing(draft, node, whole, taken, choice.replicas)
        for i, gpu in enumerate(whole):
            score = PlanScore(
                pods_placeable=pods if i == 0 else 0,
                gpus_freed=float(max(0, pods - len(taken))) if i == 0 else 0.0,
                capacity_minutes_lost=draft.settings.reconfigure_minutes,
            )
            reason = (
                f"pending shares: {pods} pod(s) on {len(taken)} GPU(s), {layout.replicas} {layout.mode} "
                "replicas, by requested milli"
            )
            draft.set(node.name, gpu, layout, reason, score)
        needed -= len(whole)
    if needed > 0:
        return [
            f"fractional demand: {sum(len(b) for b in bins)} pod(s) wait, no idle node can be time-sliced"
        ]
    return []


def _grow_by_use(
    draft: _Draft, shares: list[int], assigned: Mapping[tuple[str, int], list[int]]
) -> list[int]:
    """More replicas on busy time-sliced nodes, for the pending shares that fit beside their pods.

    `fit_by_usage` packs the pending shares beside each GPU's pods with `pack_by_usage` as the test:
    pods with history count by their measured use, the others (and the pending shares) by their
    requested milli, and the node's replicas grow to the fewest pods any of its GPUs then fits
    (replicas are node-wide: every GPU may be filled to them). Growing takes no
    replica a running pod holds, so busy GPUs may grow (no drain); the dwell time and the benefit test
    still apply. The reason says whether measured use or requested milli decided."""
    remaining = sorted(shares, reverse=True)
    usage = draft.settings.usage
    for node in draft.nodes.values():
        whole = [g for g in node.gpus if g.layout.mode is not SharingMode.MIG]
        if not remaining or not whole or node.pinned or not node.schedulable:
            continue
        if any(
            g.layout.mode is not SharingMode.TIME_SLICING
            or draft.touched(node.name, g)
            or (node.name, g.index) in draft.reserved
            or (g.changed_s_ago is not None and g.changed_s_ago < draft.settings.min_dwell_s)
            for g in whole
        ):
            continue
        if not any(g.pods for g in whole):
            continue  # an idle time-sliced node is for the free-replica pass and the exclusive return
        replicas = min(g.layout.replicas for g in whole)
        members = [[*g.pods, *(PodUse("", m) for m in assigned.get((node.name, g.index), []))] for g in whole]
        fit = fit_by_usage(
            members, remaining, draft.settings.max_replicas, usage.overload_budget, usage.half_life_minutes
        )
        if fit.replicas <= replicas or not fit.placed:
            continue
        if not draft.settings.worth_it(sum(fit.placed) / MILLI_PER_GPU):
            continue
        layout = GpuLayout.time_slicing(fit.replicas)
        running = sum(len(g.pods) for g in whole)
        basis = (
            f"by measured use ({fit.measured} sized by their history, the rest by requested milli)"
            if fit.measured
            else "by requested milli (no pod has history)"
        )
        reason = (
            f"pending shares: {len(fit.placed)} pod(s) join {running} running pod(s) {basis}; "
            f"time_slicing replicas {replicas} -> {fit.replicas}"
        )
        for i, gpu in enumerate(whole):
            score = PlanScore(
                pods_placeable=len(fit.placed) if i == 0 else 0,
                capacity_minutes_lost=draft.settings.reconfigure_minutes,
            )
            draft.set(node.name, gpu, layout, reason, score)
        for milli in fit.placed:
            remaining.remove(milli)
    return remaining


def _sharing(
    draft: _Draft, node: NodeState, whole: list[GpuState], bins: list[tuple[int, ...]], replicas: int
) -> GpuLayout:
    """MPS on the node's whole GPUs where it serves ``bins`` (Volta or newer, no MIG on the node)."""
    mps_possible = (
        draft.settings.prefer_mps
        and all(g.model.architecture in MPS_ARCHITECTURES for g in whole)
        and not any(draft.layout(node.name, g).mode is SharingMode.MIG for g in node.gpus)
    )
    return sharing_layout(bins, replicas, mps_possible)
