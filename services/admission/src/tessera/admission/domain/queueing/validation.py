"""Checks a workload against the configuration before it is queued."""

from __future__ import annotations

from tessera.admission.domain.queueing.config import QueueingConfig
from tessera.admission.domain.queueing.errors import QueueingValidationError
from tessera.admission.domain.queueing.flavors import candidate_flavors
from tessera.admission.domain.queueing.model import Workload
from tessera.admission.domain.queueing.quota import QuotaTree
from tessera.admission.domain.queueing.resources import is_known_resource


def validate_workload(config: QueueingConfig, tree: QuotaTree, workload: Workload) -> None:
    """Raise `QueueingValidationError` naming the field when the workload can never be admitted."""
    if not workload.name:
        raise QueueingValidationError("name", "must not be empty")
    queue = config.queues.get(workload.queue)
    if queue is None:
        raise QueueingValidationError("queue", f"unknown queue {workload.queue!r}")
    if not workload.pod_groups:
        raise QueueingValidationError("pod_groups", "a job needs at least one pod group")
    offered = set(queue.flavor_order)
    reachable: set[str] = set()
    for i, group in enumerate(workload.pod_groups):
        path = f"pod_groups[{i}]"
        if group.count < 1:
            raise QueueingValidationError(f"{path}.count", f"must be at least 1, got {group.count}")
        for res, qty in group.requests.items():
            if not is_known_resource(res):
                raise QueueingValidationError(f"{path}.requests.{res}", "unknown resource")
            if qty < 0:
                raise QueueingValidationError(f"{path}.requests.{res}", f"below zero ({qty})")
        unknown = sorted(group.flavors - config.flavors)
        if unknown:
            raise QueueingValidationError(f"{path}.flavors", f"unknown flavor {unknown[0]!r}")
        candidates = candidate_flavors(queue, group, workload.preemptible, config.spot_flavors)
        if not candidates:
            raise QueueingValidationError(
                f"{path}.flavors",
                f"queue {queue.name!r} offers none of {sorted(group.flavors)} (it offers {sorted(offered)})",
            )
        reachable.update(candidates)
        _check_group_capacity(tree, queue.name, path, group.total_requests, candidates)
    totals: dict[str, int] = {}
    for group in workload.pod_groups:
        for res, qty in group.total_requests.items():
            totals[res] = totals.get(res, 0) + qty
    for res, qty in totals.items():
        ceiling = sum(tree.potential_available(queue.name, (f, res)) for f in reachable)
        if qty > ceiling:
            raise QueueingValidationError(
                f"requests.{res}",
                f"exceeds queue capacity: the job asks {qty} in all, queue {queue.name!r} "
                f"can reach at most {ceiling}",
            )


def _check_group_capacity(
    tree: QuotaTree, queue: str, path: str, requests: dict[str, int], flavors: list[str]
) -> None:
    worst: tuple[str, int, int, str] | None = None
    for flavor in flavors:
        shortfall: tuple[str, int, int, str] | None = None
        for res, qty in requests.items():
            fr = (flavor, res)
            ceiling = tree.potential_available(queue, fr) if tree.covers(queue, fr) else 0
            if qty > ceiling:
                shortfall = (res, qty, ceiling, flavor)
                break
        if shortfall is None:
            return
        worst = worst or shortfall
    assert worst is not None
    res, qty, ceiling, flavor = worst
    raise QueueingValidationError(
        f"{path}.requests.{res}",
        f"exceeds queue capacity: asks {qty}, queue {queue!r} can reach at most {ceiling} in flavor {flavor}",
    )
