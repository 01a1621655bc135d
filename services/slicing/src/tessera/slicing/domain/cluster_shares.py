"""The cluster plan's fractional pass: pending shares into free replicas, more replicas on busy
time-sliced nodes by measured use, then idle exclusive nodes shared (MPS or time-sliced); see
:mod:`tessera.slicing.domain.cluster_plan`."""

from __future__ import annotations

from collections.abc import Mapping

from tessera.cluster.domain.gpu import MILLI_PER_GPU
from tessera.slicing.domain.cluster_state import GpuState, NodeState, PlanDraft
from tessera.slicing.domain.layout import MPS_ARCHITECTURES, GpuLayout, PlanScore, SharingMode
from tessera.slicing.domain.time_slicing import PodUse, choose_replicas, fit_by_usage, sharing_layout


def plan_shares(draft: PlanDraft, shares: list[int]) -> list[str]:
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
    draft: PlanDraft, shares: list[int], assigned: Mapping[tuple[str, int], list[int]]
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
    draft: PlanDraft, node: NodeState, whole: list[GpuState], bins: list[tuple[int, ...]], replicas: int
) -> GpuLayout:
    """MPS on the node's whole GPUs where it serves ``bins`` (Volta or newer, no MIG on the node)."""
    mps_possible = (
        draft.settings.prefer_mps
        and all(g.model.architecture in MPS_ARCHITECTURES for g in whole)
        and not any(draft.layout(node.name, g).mode is SharingMode.MIG for g in node.gpus)
    )
    return sharing_layout(bins, replicas, mps_possible)
