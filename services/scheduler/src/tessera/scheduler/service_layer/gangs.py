"""Translations between the published language and the scheduling domain. Pure.

An admitted job becomes one gang named by its ``job_id``, its quorum the sum of the groups'
``min_available``. On a cluster its members are the pods its workloads' controllers create,
labelled with the job's id, in the namespaces where its pods live (:func:`job_members`,
:func:`job_namespaces`); in inventory mode, where nothing runs, they are named
``<namespace>/<job>-<id>-<group>-<i>`` (:func:`job_pod_names`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from tessera.cluster.cache import pod_key
from tessera.cluster.conventions.names import JOB_ID_LABEL, JOB_POD_GROUP_LABEL, SCHEDULER_NAME
from tessera.cluster.domain import Pod
from tessera.contracts.events import GpuAssignment, GpuDemand, NodeInventory, PodPlacement
from tessera.contracts.jobs import JobSpec, PodGroupSpec, TopologyPreference
from tessera.scheduler.domain.framework.cluster_view import placement_replicas, pod_spec
from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, Allocation, GpuInfo, NodeInfo, Topology

_NOT_DNS = re.compile(r"[^a-z0-9]")


@dataclass(frozen=True)
class MemberName:
    """Where a gang member lives: the domain keys pods by ``namespace/name``."""

    namespace: str
    name: str
    group: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def job_group_name(job_id: str, spec: JobSpec) -> str:
    """The PodGroup of a job: ``<job>-<first 8 of its id>``."""
    short = _NOT_DNS.sub("", job_id.lower())[:8] or "job"
    return f"{spec.name}-{short}"


def job_pod_names(job_id: str, spec: JobSpec, namespace: str) -> list[MemberName]:
    """The pods a job is made of, in group order: ``<job>-<first 8 of id>-<group>-<i>``."""
    prefix = job_group_name(job_id, spec)
    return [
        MemberName(namespace, f"{prefix}-{group.name}-{i}", group.name)
        for group in spec.pod_groups
        for i in range(group.replicas)
    ]


def policies(spec: JobSpec) -> tuple[Policy | None, Policy | None]:
    """(node, GPU) policy: the job's own ``placement`` at both levels; otherwise a job that wants
    to sit together (same node, NVLink) packs nodes; ``None`` leaves it to the plugins' defaults."""
    if spec.placement is not None:
        chosen = Policy(spec.placement.value)
        return chosen, chosen
    if spec.topology in (TopologyPreference.SAME_NODE, TopologyPreference.NVLINK):
        return Policy.BINPACK, None
    return None, None


def _pod(name: str, gang: str, group: PodGroupSpec, spec: JobSpec) -> PodSpec:
    node_policy, gpu_policy = policies(spec)
    common = {
        "name": name,
        "gang": gang,
        "cpu_milli": group.cpu_milli,
        "memory_mib": group.memory_mib,
        "node_policy": node_policy,
        "gpu_policy": gpu_policy,
    }
    gpu = group.gpu
    if gpu is None:
        return PodSpec(**common)  # type: ignore[arg-type]
    models = frozenset(gpu.models)
    if gpu.count is not None:
        return PodSpec(gpu_count=gpu.count, gpu_models=models, **common)  # type: ignore[arg-type]
    if gpu.milli is not None:
        return PodSpec(gpu_count=1, gpu_milli=gpu.milli, gpu_models=models, **common)  # type: ignore[arg-type]
    assert gpu.mig_profile is not None
    mig = MappingProxyType({gpu.mig_profile: 1})
    return PodSpec(mig=mig, gpu_models=models, **common)  # type: ignore[arg-type]


def job_gang(
    job_id: str, spec: JobSpec, namespace: str, submitted_at: float, timeout_s: float | None
) -> GangSpec:
    groups = {group.name: group for group in spec.pod_groups}
    members = tuple(
        _pod(member.key, job_id, groups[member.group], spec)
        for member in job_pod_names(job_id, spec, namespace)
    )
    quorum = sum(group.quorum for group in spec.pod_groups)
    return GangSpec(job_id, members, quorum, spec.priority, submitted_at, timeout_s)


def job_namespaces(spec: JobSpec, jobs_namespace: str) -> frozenset[str]:
    """Where an admitted job's pods live: ``jobs_namespace`` (the scheduler's ``namespace``, where
    admission makes the workloads of submitted jobs), or the job's tenant, which for a user's own
    Job, JobSet, LeaderWorkerSet or Pod that admission adopted is the namespace it was made in.

    The job-id label alone proves nothing: any user who may create a pod can write it, and a pod
    without ``tessera.io/queue`` never reaches the admission webhook, so nothing gates it. The
    domain's pods carry no owner references, so the namespace is the check; a pod elsewhere is no
    member, whatever it requests."""
    return frozenset({jobs_namespace, spec.tenant})


def _candidate(pod: Pod, job_id: str) -> bool:
    """Labelled with ``job_id`` and, but for its namespace, a pod of ours to place."""
    return (
        pod.labels.get(JOB_ID_LABEL) == job_id
        and pod.scheduler_name == SCHEDULER_NAME
        and not pod.terminated
        and not pod.deleting
        and not pod.gated
    )


def job_members(pods: Iterable[Pod], job_id: str, namespaces: Collection[str]) -> list[Pod]:
    """The live pods of a job for this scheduler: those its workloads created, labelled with its id,
    in one of ``namespaces`` (:func:`job_namespaces`), that no scheduling gate holds (admission
    removes its gate when it admits a gated pod)."""
    return sorted(
        (pod for pod in pods if _candidate(pod, job_id) and pod.namespace in namespaces), key=pod_key
    )


def job_strangers(pods: Iterable[Pod], job_id: str, namespaces: Collection[str]) -> list[Pod]:
    """Pods that carry a job's id but live outside ``namespaces``: never its members."""
    return sorted(
        (pod for pod in pods if _candidate(pod, job_id) and pod.namespace not in namespaces), key=pod_key
    )


def member_group(pod: Pod) -> str:
    """The job spec's pod group a member belongs to (its label), else its pod-group label."""
    return pod.labels.get(JOB_POD_GROUP_LABEL) or pod.pod_group or ""


def job_gang_of_pods(
    job_id: str, spec: JobSpec, members: Iterable[Pod], submitted_at: float, timeout_s: float | None
) -> GangSpec:
    """A job's gang from the pods seen so far (the quorum may exceed them: members still coming);
    each member keeps what its pod requests, with the job's placement policies."""
    node_policy, gpu_policy = policies(spec)
    pods = tuple(
        replace(pod_spec(pod, job_id), name=pod_key(pod), node_policy=node_policy, gpu_policy=gpu_policy)
        for pod in members
    )
    quorum = sum(group.quorum for group in spec.pod_groups)
    return GangSpec(job_id, pods, quorum, spec.priority, submitted_at, timeout_s)


def inventory_node(node: NodeInventory) -> NodeInfo:
    """A node as telemetry reports it; without a wiring report, GPUs are taken to share one host.
    A node slicing time-sliced places shares by its replicas, as from the API (ADR 0021)."""
    gpus = sorted(node.gpus, key=lambda gpu: gpu.index)
    replicas = placement_replicas(node.labels)
    return NodeInfo(
        name=node.name,
        gpus=tuple(
            GpuInfo(i, gpu.model, healthy=gpu.healthy, replicas=replicas) for i, gpu in enumerate(gpus)
        ),
        topology=Topology.build(len(gpus)),
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        labels=MappingProxyType(dict(node.labels)),
    )


def inventory_uuids(node: NodeInventory) -> dict[int, str]:
    return {i: gpu.uuid for i, gpu in enumerate(sorted(node.gpus, key=lambda gpu: gpu.index))}


def pod_name(key: str) -> str:
    """The pod's name from its ``namespace/name`` key, as events name pods."""
    return key.partition("/")[2] or key


def placement_of(allocation: Allocation, group: str, uuids: Mapping[int, str]) -> PodPlacement:
    namespace, _, name = allocation.pod.rpartition("/")
    return PodPlacement(
        pod=name,
        namespace=namespace,
        group=group,
        node=allocation.node,
        gpus=[
            GpuAssignment(index=index, uuid=uuids.get(index, f"{allocation.node}/{index}"), milli=milli)
            for index, milli in allocation.gpu_milli
        ],
    )


def waiting_demand(pods: Iterable[PodSpec]) -> list[GpuDemand]:
    """Pods that wait for GPUs, counted by shape (largest first); CPU-only pods are left out."""
    shapes: Counter[tuple[int, int, str | None, tuple[str, ...]]] = Counter()
    for pod in pods:
        models = tuple(sorted(pod.gpu_models))
        if pod.mig:
            for profile, count in pod.mig.items():
                shapes[(0, MILLI_PER_GPU, profile, models)] += count
        elif pod.gpu_count:
            shapes[(pod.gpu_count, pod.gpu_milli, None, models)] += 1
    return [
        GpuDemand(gpus=gpus, milli=milli, mig_profile=mig, models=list(models), pods=count)
        for (gpus, milli, mig, models), count in sorted(
            shapes.items(), key=lambda item: (-item[0][0] * item[0][1], item[0][2] or "", item[0][3])
        )
    ]
