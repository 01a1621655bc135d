"""The scheduler's view built from the cluster library's domain model (``tessera.cluster.domain``).

The cluster model is what the watches report; :class:`NodeInfo`, :class:`PodSpec` and
:class:`GangSpec` are what a scheduling cycle reads. Only what placement needs is carried over.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from tessera.cluster.conventions.device_plugin import time_sliced_by_slicing
from tessera.cluster.conventions.names import GPU_REPLICAS_LABEL
from tessera.cluster.domain import GpuRequestKind, Node, Pod, PodGroup
from tessera.cluster.domain import Link as ClusterLink
from tessera.cluster.domain.gpu import MigMode, MigStrategy
from tessera.cluster.domain.node import TaintEffect
from tessera.scheduler.domain.framework.pod import MIG_RESOURCE_PREFIX, InvalidSpec, PodSpec
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import GpuInfo, Link, NodeInfo, Topology

_LINKS: dict[ClusterLink, Link] = {
    ClusterLink.SELF: Link.NVLINK,
    ClusterLink.NVLINK: Link.NVLINK,
    ClusterLink.PCIE_SWITCH: Link.PCIE_SWITCH,
    ClusterLink.PCIE_HOST: Link.PCIE_HOST,
    ClusterLink.CROSS_NUMA: Link.CROSS_NUMA,
}


def placement_replicas(labels: Mapping[str, str]) -> int:
    """Replicas the scheduler places shares of a GPU by: the device plugin's time-slicing replicas
    where slicing chose them (its config on the node), so a GPU of N replicas takes N shares whatever
    their milli, as the device plugin does; 1 elsewhere (shares counted by milli within 1000, also
    under MPS or a time-slicing config set by hand). A replicas label that is not a positive integer
    is read as 1, the safer reading, so the node stays schedulable by milli from the API and from
    the inventory alike. See ADR 0021."""
    if not time_sliced_by_slicing(labels):
        return 1
    try:
        replicas = int(labels.get(GPU_REPLICAS_LABEL, "1"))
    except ValueError:
        return 1
    return max(replicas, 1)


def node_info(node: Node) -> NodeInfo:
    """Capacity, health, wiring and MIG inventory of a cluster node, with nothing allocated yet.

    A GPU in MIG mode is handed out only as the MIG devices the device plugin advertises
    (``nvidia.com/mig-<profile>``, the mixed strategy): it is kept (indices and wiring stay those of
    the board) but marked ``mig``, and never offered whole or in shares, or one GPU would be given
    out twice. Under the single strategy the plugin advertises the MIG devices as ``nvidia.com/gpu``
    and no MIG resource: the GPUs stay offered whole, as that is the only way they are asked for."""
    gpus = sorted(node.gpus, key=lambda gpu: gpu.index)
    if [gpu.index for gpu in gpus] != list(range(len(gpus))):
        raise InvalidSpec(f"node {node.name}.gpus", f"indices must be 0..{len(gpus) - 1}")
    if node.interconnect is not None:
        size = len(gpus)
        links = tuple(tuple(_LINKS[node.interconnect.link(a, b)] for b in range(size)) for a in range(size))
        topology = Topology(links)
    else:
        topology = Topology.build(len(gpus), numa_of=[gpu.numa_node or 0 for gpu in gpus])
    mig = {
        resource.removeprefix(MIG_RESOURCE_PREFIX): count
        for resource, count in node.extended_allocatable.items()
        if resource.startswith(MIG_RESOURCE_PREFIX) and count > 0
    }
    replicas = placement_replicas(node.labels)
    single = node.mig_strategy is MigStrategy.SINGLE
    return NodeInfo(
        name=node.name,
        gpus=tuple(
            GpuInfo(
                gpu.index,
                gpu.model,
                healthy=gpu.healthy,
                replicas=1 if gpu.mig_mode is MigMode.ENABLED else replicas,
                mig=gpu.mig_mode is MigMode.ENABLED and not single,
            )
            for gpu in gpus
        ),
        topology=topology,
        cpu_milli=node.allocatable_cpu_milli,
        memory_mib=node.allocatable_memory_mib,
        labels=MappingProxyType(dict(node.labels)),
        mig_capacity=MappingProxyType(mig),
        schedulable=node.ready and not node.unschedulable,
        taints=tuple(t for t in node.taints if t.effect is not TaintEffect.PREFER_NO_SCHEDULE),
    )


def pod_spec(pod: Pod, gang: str) -> PodSpec:
    """A cluster pod as a gang member; ``gang`` names its pod group (or the pod itself if alone)."""
    request = pod.requirements.gpu
    common = {
        "name": pod.name,
        "gang": gang,
        "cpu_milli": pod.requirements.cpu_milli,
        "memory_mib": pod.requirements.memory_mib,
        "gpu_models": request.allowed_models,
        "node_selector": tuple(sorted(pod.requirements.node_selector.items())),
        "tolerations": pod.requirements.tolerations,
        "node_affinity": pod.requirements.node_affinity,
    }
    if request.kind is GpuRequestKind.WHOLE:
        return PodSpec(gpu_count=request.count, **common)  # type: ignore[arg-type]
    if request.kind is GpuRequestKind.FRACTIONAL:
        return PodSpec(gpu_count=1, gpu_milli=request.milli, **common)  # type: ignore[arg-type]
    if request.kind is GpuRequestKind.MIG:
        assert request.mig_profile is not None
        mig = MappingProxyType({request.mig_profile: request.count})
        return PodSpec(mig=mig, **common)  # type: ignore[arg-type]
    return PodSpec(**common)  # type: ignore[arg-type]


def gang_spec(group: PodGroup, members: Iterable[Pod], submitted_at: float) -> GangSpec:
    """A PodGroup and the member pods seen so far; ``minMember`` may exceed them (members still coming)."""
    pods = sorted(members, key=lambda pod: pod.name)
    priority = max((pod.requirements.priority for pod in pods), default=0)
    timeout = float(group.schedule_timeout_seconds) if group.schedule_timeout_seconds else None
    specs = tuple(pod_spec(pod, group.key) for pod in pods)
    return GangSpec(group.key, specs, group.min_member, priority, submitted_at, timeout)
