"""Admitted jobs as gangs, inventory as nodes, allocations as placements: the service's translations."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.cluster.conventions.names import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_REPLICAS_LABEL,
    GPU_SHARING_STRATEGY_LABEL,
    SLICING_DEVICE_PLUGIN_CONFIG_PREFIX,
)
from tessera.cluster.domain import Pod
from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.contracts.jobs import JobSpec
from tessera.scheduler.domain.framework.pod import Policy
from tessera.scheduler.domain.framework.status import Diagnosis, Status
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.gangs import (
    inventory_node,
    job_gang,
    job_group_name,
    job_members,
    job_pod_names,
    placement_of,
    pod_name,
    waiting_demand,
)
from tessera.scheduler.service_layer.outcomes import rejected_nodes

JOB_ID = "3F2A9C1E-0000-4000-8000-000000000001"


def job(**overrides: Any) -> JobSpec:
    spec: dict[str, Any] = {
        "name": "train",
        "tenant": "research",
        "priority": 7,
        "pod_groups": [
            {
                "name": "worker",
                "replicas": 3,
                "min_available": 2,
                "cpu": "4",
                "memory": "8Gi",
                "gpu": {"count": 2},
            },
            {"name": "ps", "replicas": 1, "cpu": "500m", "memory": "1Gi"},
        ],
    }
    spec.update(overrides)
    return JobSpec.model_validate(spec)


def test_a_job_is_one_gang_of_every_replica_with_the_summed_quorum() -> None:
    gang = job_gang(JOB_ID, job(), "default", submitted_at=10.0, timeout_s=30.0)

    assert gang.name == JOB_ID
    assert [pod.name for pod in gang.members] == [
        "default/train-3f2a9c1e-worker-0",
        "default/train-3f2a9c1e-worker-1",
        "default/train-3f2a9c1e-worker-2",
        "default/train-3f2a9c1e-ps-0",
    ]
    assert gang.min_available == 3
    assert (gang.priority, gang.submitted_at, gang.timeout_s) == (7, 10.0, 30.0)
    worker, ps = gang.members[0], gang.members[3]
    assert (worker.gpu_count, worker.cpu_milli, worker.memory_mib) == (2, 4000, 8192)
    assert (ps.gpu_count, ps.cpu_milli) == (0, 500)


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ({"count": 4, "models": ["H100-80GB"]}, (4, 1000, {}, frozenset({"H100-80GB"}))),
        ({"milli": 250}, (1, 250, {}, frozenset())),
        ({"mig_profile": "1g.10gb"}, (0, 1000, {"1g.10gb": 1}, frozenset())),
    ],
)
def test_gpu_requests_become_whole_shared_or_mig_pods(gpu: dict[str, Any], expected: tuple[Any, ...]) -> None:
    spec = job(pod_groups=[{"name": "w", "replicas": 1, "gpu": gpu}])
    (pod,) = job_gang(JOB_ID, spec, "ns", 0.0, None).members
    assert (pod.gpu_count, pod.gpu_milli, dict(pod.mig), pod.gpu_models) == expected


def test_the_job_placement_policy_applies_at_node_and_gpu_level() -> None:
    (pod, *_) = job_gang(JOB_ID, job(placement="spread"), "default", 0.0, None).members
    assert (pod.node_policy, pod.gpu_policy) == (Policy.SPREAD, Policy.SPREAD)
    (pod, *_) = job_gang(JOB_ID, job(), "default", 0.0, None).members
    assert (pod.node_policy, pod.gpu_policy) == (None, None)
    (pod, *_) = job_gang(JOB_ID, job(topology="nvlink"), "default", 0.0, None).members
    assert (pod.node_policy, pod.gpu_policy) == (Policy.BINPACK, None), "a tightly coupled job packs nodes"


def test_pod_and_group_names_are_unique_per_job() -> None:
    other = "77770000-0000-4000-8000-000000000002"
    assert job_group_name(JOB_ID, job()) != job_group_name(other, job())
    names = [m.key for m in job_pod_names(JOB_ID, job(), "default")]
    assert len(set(names)) == len(names) == 4


def test_inventory_nodes_keep_gpu_health_and_uuids_in_placements() -> None:
    node = NodeInventory(
        name="n1",
        cpu_milli=64_000,
        memory_mib=512_000,
        gpus=[
            GpuInventory(index=i, uuid=f"GPU-{i}", model="A100-80GB", memory_mib=81920, healthy=i != 2)
            for i in range(4)
        ],
    )
    info = inventory_node(node)
    assert [gpu.healthy for gpu in info.gpus] == [True, True, False, True]
    allocation = Allocation("default/p-0", JOB_ID, "n1", ((1, 1000), (3, 500)), 1000, 1024)
    placement = placement_of(allocation, "worker", {1: "GPU-1", 3: "GPU-3"})
    assert placement.pod == "p-0" == pod_name("default/p-0")
    assert [(g.index, g.uuid, g.milli) for g in placement.gpus] == [(1, "GPU-1", 1000), (3, "GPU-3", 500)]


@pytest.mark.parametrize(
    ("diagnosis", "expected"),
    [
        (
            Diagnosis({"insufficient GPU": 1102, "model not allowed": 96}, 1198),
            {"insufficient GPU": 1102, "model not allowed": 96},
        ),
        (
            Diagnosis.whole_pod(Status.unschedulable("gang needs more GPUs than are free (32 > 0)"), 4),
            {"gang needs more GPUs than are free (32 > 0)": 4},
        ),
        (None, {}),
    ],
)
def test_unschedulable_gangs_count_rejected_nodes_per_reason(
    diagnosis: Diagnosis | None, expected: dict[str, int]
) -> None:
    outcome = GangOutcome("g", OutcomeKind.UNSCHEDULABLE, diagnosis=diagnosis)
    assert rejected_nodes(outcome) == expected


def test_waiting_demand_counts_pods_by_gpu_shape_largest_first() -> None:
    pods = [
        *job_gang(JOB_ID, job(), "default", 0.0, None).members,
        *job_gang(
            "b", job(pod_groups=[{"name": "s", "replicas": 2, "gpu": {"milli": 250}}]), "d", 0.0, None
        ).members,
        *job_gang(
            "c",
            job(pod_groups=[{"name": "m", "replicas": 1, "gpu": {"mig_profile": "1g.10gb"}}]),
            "d",
            0.0,
            None,
        ).members,
    ]
    demand = [(d.gpus, d.milli, d.mig_profile, d.pods) for d in waiting_demand(pods)]
    assert demand == [(2, 1000, None, 3), (1, 250, None, 2), (0, 1000, "1g.10gb", 1)]


def test_a_job_s_gated_pods_are_not_its_members_until_admission_removes_the_gate() -> None:
    labels = {"tessera.io/job-id": JOB_ID}
    gated = Pod("ml", "web-a", scheduler_name="tessera", labels=labels, gated=True)
    released = Pod("ml", "web-b", scheduler_name="tessera", labels=labels)
    other = Pod("ml", "web-c", scheduler_name="default-scheduler", labels=labels)
    assert [p.name for p in job_members([gated, released, other], JOB_ID, {"ml"})] == ["web-b"]


def test_inventory_nodes_slicing_time_sliced_place_shares_by_their_replicas() -> None:
    def node(labels: dict[str, str]) -> NodeInventory:
        gpus = [GpuInventory(index=i, uuid=f"GPU-{i}", model="A100-80GB", memory_mib=81920) for i in range(2)]
        return NodeInventory(name="n1", cpu_milli=64_000, memory_mib=512_000, labels=labels, gpus=gpus)

    sliced = {
        GPU_SHARING_STRATEGY_LABEL: "time-slicing",
        DEVICE_PLUGIN_CONFIG_LABEL: f"{SLICING_DEVICE_PLUGIN_CONFIG_PREFIX}a100",
        GPU_REPLICAS_LABEL: "4",
    }
    assert [gpu.replicas for gpu in inventory_node(node(sliced)).gpus] == [4, 4]
    by_hand = {**sliced, DEVICE_PLUGIN_CONFIG_LABEL: "ts-4"}
    assert [gpu.replicas for gpu in inventory_node(node(by_hand)).gpus] == [1, 1]
    malformed = {**sliced, GPU_REPLICAS_LABEL: "four"}
    assert [gpu.replicas for gpu in inventory_node(node(malformed)).gpus] == [1, 1]
