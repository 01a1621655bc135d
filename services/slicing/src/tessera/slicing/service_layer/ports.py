"""What the slicing service layer needs from the cluster, as a port; `adapters.kube` implements it
with the official `kubernetes` client, and unit tests with a fake."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import Pod

#: on a node whose busy GPUs slicing drains, until the operation ends: the checkpoint service reads it
#: (with the deadline annotation) as the node going away and asks its checkpointable jobs to save
DRAIN_LABEL = "tessera.io/slicing-drain"
DEADLINE_ANNOTATION = "tessera.io/termination-deadline"
#: on a node slicing cordoned, naming the operation that did (set and removed in the cordon's own patch):
#: a step re-run after a crash knows the cordon it finds is its own, and undoes it when it ends
CORDONED_BY_ANNOTATION = "tessera.io/cordoned-by"


class ClusterOps(Protocol):
    async def nodes(self) -> list[Node]: ...

    async def node(self, name: str) -> Node: ...

    async def bound_pods(self) -> list[Pod]:
        """Pods bound to any node that still hold their devices."""
        ...

    async def pods_on(self, node: str) -> list[Pod]:
        """Pods bound to the node that still hold their devices (not Succeeded or Failed)."""
        ...

    async def cordon(self, node: str, unschedulable: bool, operation_id: str) -> None:
        """Set the node's `spec.unschedulable`; the same patch annotates the node
        `tessera.io/cordoned-by=<operation_id>` (cordoning) or removes that annotation (uncordoning),
        so every cordon slicing writes names its operation. Idempotent."""
        ...

    async def write_mig_config(self, node: str, config: str, body: str) -> None:
        """Put `config` (mig-parted device entries, YAML) in the MIG manager's ConfigMap, then label
        the node `nvidia.com/mig.config=<config>` and, in the same patch, `nvidia.com/mig.config.state=
        pending` (the MIG manager only writes the state, so an earlier attempt's outcome can never be
        read beside this attempt's name). Idempotent: when the label already names `config`, the node
        is left as it is (the MIG manager acts once per label change, and may have reported since)."""
        ...

    async def write_sharing_config(self, node: str, config: str, body: str) -> None:
        """Put `config` (a device-plugin config, YAML) in the device plugin's ConfigMap, then label the
        node `nvidia.com/device-plugin.config=<config>`. Idempotent."""
        ...

    async def forget_configs(self, mig: bool, configs: list[str]) -> None:
        """Remove these named configs from the MIG manager's (`mig`) or the device plugin's ConfigMap:
        earlier attempts that no node label names any more."""
        ...

    async def report_failure(self, node: str, operation_id: str, reason: str) -> None:
        """Set the node's slicing condition to failed and record a Warning Event naming the reason."""
        ...

    async def clear_failure(self, node: str) -> None:
        """Set the node's slicing condition back to healthy, if it was failed."""
        ...

    async def mark_draining(self, node: str, deadline: datetime | None) -> None:
        """Label the node `tessera.io/slicing-drain` and annotate it `tessera.io/termination-deadline`
        (the checkpoint service asks the checkpointable jobs on it to save before then), or remove
        both (None). Idempotent."""
        ...

    async def evict(self, pod: Pod) -> None:
        """Evict the pod through the Eviction API; a pod already gone is no error."""
        ...
