"""Why a job does not fit its queue's quota, in numbers a user can act on. Pure.

`queue team-a: needs 8 A100-80GB GPUs, 4 free in quota, borrowing limit reached`: what the job asks
in the flavor it was assigned, what the queue could take there now (its unused quota plus what its
cohort can lend it), and what stops it getting more.
"""

from __future__ import annotations

from collections.abc import Mapping

from tessera.admission.domain.queueing.model import FlavorSpec, QueueSpec
from tessera.admission.domain.queueing.quota import QuotaTree
from tessera.admission.domain.queueing.resources import (
    CPU,
    GPU,
    GPU_MILLI,
    MEMORY,
    MIG_PREFIX,
    FlavorResource,
)


def quota_shortfall(
    tree: QuotaTree,
    queue: QueueSpec,
    usage: Mapping[FlavorResource, int],
    flavors: Mapping[str, FlavorSpec],
) -> str | None:
    """The first resource of ``usage`` the queue cannot take now, said with its numbers; None when
    all of it fits."""
    for fr, need in usage.items():
        free = tree.available(queue.name, fr)
        if need <= free:
            continue
        flavor, res = fr
        quota = queue.quotas.get(fr)
        used, nominal = tree.usage(queue.name, fr), tree.nominal(queue.name, fr)
        if (
            quota is not None
            and quota.borrowing_limit is not None
            and used + need > nominal + quota.borrowing_limit
        ):
            why = "borrowing limit reached"
        elif queue.cohort is None:
            why = "no cohort to borrow from"
        elif tree.potential_available(queue.name, fr) >= need:
            why = "the rest is in use in its cohort"
        else:
            why = "more than its cohort can lend"
        return f"queue {queue.name}: needs {_amount(need, flavor, res, flavors)}, {free} free in quota, {why}"
    return None


def _amount(qty: int, flavor: str, res: str, flavors: Mapping[str, FlavorSpec]) -> str:
    spec = flavors.get(flavor)
    model = (spec.gpu_model if spec is not None else None) or flavor
    if res == GPU:
        return f"{qty} {model} GPU{'s' if qty != 1 else ''}"
    if res == GPU_MILLI:
        return f"{qty} milli-GPUs of {model}"
    if res.startswith(MIG_PREFIX):
        return f"{qty} MIG {res.removeprefix(MIG_PREFIX)} slices of {model}"
    unit = {CPU: "milli-CPU", MEMORY: "MiB of memory"}.get(res, res)
    return f"{qty} {unit} in flavor {flavor}"
