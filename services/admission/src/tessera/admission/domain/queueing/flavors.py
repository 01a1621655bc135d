"""Flavor assignment: pick a flavor for each pod group from the flavors it allows, in the
queue's order, accounting quota per flavor (Kueue's flavorassigner, default fungibility:
take the first flavor that fits, borrowing if need be; failing that, the first one that
preemption could make room in).

Spot capacity (`CapacityType.SPOT`) goes to the jobs that can lose it: a preemptible job tries the
queue's spot flavors first, then its on-demand ones, each kind in the queue's order. A job that may
not be preempted tries only the on-demand flavors it may use, and spot ones only when spot is all the
queue offers it (the operator made that queue spot-only; the job runs there or nowhere). Kueue tries
flavors in the queue's order alone; operators get its behaviour by listing spot first and marking
non-preemptible work with a flavor of its own. A spot node's interruption then evicts preemptible,
usually checkpointable, work, which the checkpoint service saves first. When no spot node is free
for a job the spot flavor's quota would take, the cycle tries it on its on-demand flavors instead
(spot capacity comes and goes; quota alone does not say it is there).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from tessera.admission.domain.queueing.affinity import flavor_label_keys
from tessera.admission.domain.queueing.model import FlavorSpec, PodGroup, QueueSpec, Workload
from tessera.admission.domain.queueing.quota import QuotaTree
from tessera.admission.domain.queueing.resources import FlavorResource


class FitMode(IntEnum):
    """Ordered worst to best, so the mode of a whole workload is the min over its groups."""

    NO_FIT = 0
    PREEMPT = 1
    FIT = 2


@dataclass(frozen=True, slots=True)
class Assignment:
    mode: FitMode
    flavors: tuple[str, ...]
    """The chosen flavor per pod group, in pod-group order (empty when NO_FIT)."""
    usage: dict[FlavorResource, int]
    borrows: bool
    message: str


def candidate_flavors(
    queue: QueueSpec,
    group: PodGroup,
    preemptible: bool,
    spot: Collection[str] = (),
    exclude: Collection[str] = (),
) -> list[str]:
    """The flavors a pod group tries, in order (see the module's docstring), less ``exclude``."""
    allowed = [
        f for f in queue.flavor_order if (not group.flavors or f in group.flavors) and f not in exclude
    ]
    on_spot = [f for f in allowed if f in spot]
    on_demand = [f for f in allowed if f not in spot]
    if preemptible:
        return on_spot + on_demand
    return on_demand or on_spot


def matching_flavors(
    queue: QueueSpec, group: PodGroup, flavors: list[str], specs: Mapping[str, FlavorSpec]
) -> list[str]:
    """Those of ``flavors`` whose node labels do not contradict what the group's pods require of a
    node (`NodeRequirement.allows_flavor`, on the label keys the queue's flavors name). A flavor the
    configuration does not describe names no labels and contradicts nothing."""
    if not group.node:
        return flavors
    keys = flavor_label_keys([specs[f].node_labels for f in queue.flavor_order if f in specs])
    return [
        f
        for f in flavors
        if f not in specs or group.node.allows_flavor(specs[f].node_labels, keys, specs[f].gpu_model)
    ]


def no_flavor_matches(queue: QueueSpec, group: PodGroup, tried: Collection[str]) -> str:
    """Why no flavor can ever hold the group's pods: `queue q: no flavor (a, b) matches ...`."""
    return (
        f"queue {queue.name}: no flavor ({', '.join(tried)}) matches the pods' required node affinity "
        f"of pod group {group.name}: {group.node.describe()}"
    )


def assign_flavors(
    tree: QuotaTree,
    queue: QueueSpec,
    workload: Workload,
    spot: Collection[str] = (),
    exclude: Collection[str] = (),
    specs: Mapping[str, FlavorSpec] | None = None,
) -> Assignment:
    """``spot``: the names of the configuration's spot flavors; ``exclude``: flavors not to try;
    ``specs``: the flavors described (their node labels), by name. A pod group no flavor's node labels
    allow (`matching_flavors`) does not fit, saying which requirement."""
    usage: dict[FlavorResource, int] = {}
    chosen: list[str] = []
    mode = FitMode.FIT
    covered = queue.quotas
    for group in workload.pod_groups:
        requests = group.total_requests
        best_preempt: str | None = None
        picked: str | None = None
        reasons: list[str] = []
        tried = candidate_flavors(queue, group, workload.preemptible, spot, exclude)
        allowed = matching_flavors(queue, group, tried, specs or {})
        if tried and not allowed:
            return Assignment(FitMode.NO_FIT, (), {}, False, no_flavor_matches(queue, group, tried))
        for flavor in allowed:
            group_mode = FitMode.FIT
            for res, qty in requests.items():
                fr = (flavor, res)
                if fr not in covered:
                    group_mode = FitMode.NO_FIT
                    reasons.append(f"flavor {flavor} has no {res} quota")
                    break
                need = usage.get(fr, 0) + qty
                if need <= tree.available(queue.name, fr):
                    continue
                if need <= tree.potential_available(queue.name, fr):
                    group_mode = FitMode.PREEMPT
                    reasons.append(f"insufficient unused {res} quota in flavor {flavor}")
                else:
                    group_mode = FitMode.NO_FIT
                    reasons.append(f"{res} request {need} exceeds what flavor {flavor} can ever offer")
                    break
            if group_mode is FitMode.FIT:
                picked = flavor
                break
            if group_mode is FitMode.PREEMPT and best_preempt is None:
                best_preempt = flavor
        if picked is None:
            if best_preempt is None:
                detail = "; ".join(reasons) or "no allowed flavor in this queue"
                return Assignment(FitMode.NO_FIT, (), {}, False, f"pod group {group.name}: {detail}")
            picked = best_preempt
            mode = FitMode.PREEMPT
        chosen.append(picked)
        for res, qty in requests.items():
            fr = (picked, res)
            usage[fr] = usage.get(fr, 0) + qty
    borrows = any(tree.usage(queue.name, fr) + v > tree.nominal(queue.name, fr) for fr, v in usage.items())
    message = "fits" if mode is FitMode.FIT else "fits only if admitted workloads are preempted"
    return Assignment(mode, tuple(chosen), usage, borrows, message)


def fits(tree: QuotaTree, queue: str, usage: dict[FlavorResource, int], allow_borrowing: bool) -> bool:
    """Whether `usage` fits the queue now; without borrowing it must stay within nominal quota."""
    for fr, value in usage.items():
        if not allow_borrowing and tree.usage(queue, fr) + value > tree.nominal(queue, fr):
            return False
        if value > tree.available(queue, fr):
            return False
    return True


def flavor_of_node(model: str, labels: Mapping[str, str], flavors: Iterable[FlavorSpec]) -> str | None:
    """The flavor a node's GPUs are: of the flavors of its GPU model whose node labels it has all of,
    the one that names the most (a spot flavor labelled `karpenter.sh/capacity-type: spot` beats an
    on-demand one of the same model that names none); the first of those on a tie. None: no flavor."""
    best: FlavorSpec | None = None
    for flavor in flavors:
        if (flavor.gpu_model or flavor.name).lower() != model.lower():
            continue
        if any(labels.get(key) != value for key, value in flavor.node_labels.items()):
            continue
        if best is None or len(flavor.node_labels) > len(best.node_labels):
            best = flavor
    return best.name if best is not None else None
