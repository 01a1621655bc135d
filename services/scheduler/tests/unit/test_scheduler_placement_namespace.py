"""`gang_placed` names each pod's namespace with its name: two tenants' pods of one name are two pods."""

from __future__ import annotations

from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.gangs import placement_of


def test_a_placement_names_the_pods_namespace_and_name() -> None:
    for namespace in ("team-a", "team-b"):
        allocation = Allocation(f"{namespace}/llama-0", "job", "n1", ((0, 1000),), 1000, 1024)
        placement = placement_of(allocation, "worker", {0: "GPU-0"})
        assert (placement.namespace, placement.pod) == (namespace, "llama-0")
