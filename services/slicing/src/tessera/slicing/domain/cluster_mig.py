"""The cluster plan's MIG pass: pending MIG pods by profile, served by free instances first and then
by the best geometry of the GPU that serves the most compute (see :mod:`tessera.slicing.domain.cluster_plan`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from tessera.cluster.catalogue import GpuModel
from tessera.slicing.domain.cluster_state import GpuState, MigWant, NodeState, PlanDraft
from tessera.slicing.domain.geometry import supporting_models
from tessera.slicing.domain.layout import GpuLayout, MigSlice, PlanScore, SharingMode
from tessera.slicing.domain.single_gpu import SingleGpuPlan, best_geometry


def _models_in(nodes: Iterable[NodeState]) -> list[GpuModel]:
    seen: dict[str, GpuModel] = {}
    for node in nodes:
        for gpu in node.gpus:
            seen.setdefault(gpu.model.name, gpu.model)
    return [seen[name] for name in sorted(seen)]


def unsupported_profiles(nodes: Iterable[NodeState], mig_demand: Counter[MigWant]) -> list[str]:
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


def plan_mig(draft: PlanDraft, demand: Counter[MigWant]) -> list[str]:
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
