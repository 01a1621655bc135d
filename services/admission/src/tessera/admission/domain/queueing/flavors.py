"""Flavor assignment: pick a flavor for each pod group from the flavors it allows, in the
queue's order, accounting quota per flavor (Kueue's flavorassigner, default fungibility:
take the first flavor that fits, borrowing if need be; failing that, the first one that
preemption could make room in)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from tessera.admission.domain.queueing.model import QueueSpec, Workload
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


def assign_flavors(tree: QuotaTree, queue: QueueSpec, workload: Workload) -> Assignment:
    usage: dict[FlavorResource, int] = {}
    chosen: list[str] = []
    mode = FitMode.FIT
    covered = queue.quotas
    for group in workload.pod_groups:
        requests = group.total_requests
        best_preempt: str | None = None
        picked: str | None = None
        reasons: list[str] = []
        for flavor in queue.flavor_order:
            if group.flavors and flavor not in group.flavors:
                continue
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
