"""The scheduler's view built from the cluster library's nodes, pods and pod groups."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.domain import GpuHealth, GpuRequest, Pod, PodGroup, PodRequirements
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.cluster_view import gang_spec, node_info, pod_spec
from tessera.scheduler.domain.framework.pod import InvalidSpec
from tessera.scheduler.domain.gang.assembly import assemble
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import Link


def test_an_sxm_node_keeps_its_wiring_health_and_capacity() -> None:
    node = gpu_node("n1", "A100-80GB", 8, sxm=True)
    sick = replace(node, gpus=(replace(node.gpus[0], health=GpuHealth.UNHEALTHY), *node.gpus[1:]))
    info = node_info(sick)
    assert info.gpu_count == 8 and info.models == {"A100-80GB"}
    assert not info.gpus[0].healthy and info.free_whole_gpus == 7
    assert info.topology.link(0, 1) is Link.NVLINK
    assert info.cpu_milli == node.allocatable_cpu_milli
    SchedulerCache().upsert_node(info)  # capacity only: the cache accepts it


def test_mig_slices_advertised_by_the_device_plugin_become_mig_capacity() -> None:
    info = node_info(gpu_node("n1", "A100-80GB", 2, mig_config="all-balanced"))
    assert info.mig_capacity and all(count > 0 for count in info.mig_capacity.values())


def test_a_cordoned_or_not_ready_node_is_unschedulable() -> None:
    assert not node_info(replace(gpu_node("n1", "A100-80GB", 1), unschedulable=True)).schedulable
    assert not node_info(replace(gpu_node("n1", "A100-80GB", 1), ready=False)).schedulable


def test_gaps_in_gpu_indices_are_refused() -> None:
    node = gpu_node("n1", "A100-80GB", 2)
    with pytest.raises(InvalidSpec, match="indices"):
        node_info(replace(node, gpus=(replace(node.gpus[1], index=3),), interconnect=None))


@pytest.mark.parametrize(
    ("request_", "gpus", "milli", "mig"),
    [
        (GpuRequest.whole(4), 4, 1000, {}),
        (GpuRequest.fraction(250), 1, 250, {}),
        (GpuRequest.mig("1g.10gb", 2), 0, 1000, {"1g.10gb": 2}),
        (GpuRequest.none(), 0, 1000, {}),
    ],
)
def test_pod_requests_map_to_pod_specs(
    request_: GpuRequest, gpus: int, milli: int, mig: dict[str, int]
) -> None:
    pod = Pod("default", "p", PodRequirements(cpu_milli=500, gpu=request_))
    spec = pod_spec(pod, "default/g")
    assert (spec.gpu_count, spec.gpu_milli, dict(spec.mig), spec.cpu_milli) == (gpus, milli, mig, 500)


def test_a_pod_group_becomes_a_gang_placed_whole() -> None:
    group = PodGroup("default", "train", min_member=2, schedule_timeout_seconds=90)
    pods = [Pod("default", f"w{i}", PodRequirements(gpu=GpuRequest.whole(4), priority=3)) for i in range(2)]
    spec = gang_spec(group, pods, submitted_at=5.0)
    assert (spec.name, spec.min_available, spec.priority, spec.timeout_s) == ("default/train", 2, 3, 90.0)
    world = assemble([node_info(gpu_node("n1", "A100-80GB", 8, sxm=True))], RecordingBinder())
    world.scheduler.submit(spec)
    [outcome] = world.scheduler.run(now=5.0)
    assert outcome.kind is OutcomeKind.PLACED and len(outcome.bound) == 2


def test_a_pods_node_selector_and_tolerations_and_a_nodes_blocking_taints_reach_the_scheduler() -> None:
    from tessera.cluster.conventions.pods import parse_pod
    from tessera.cluster.domain.node import Taint, TaintEffect

    pod = parse_pod(
        {
            "metadata": {"name": "w-0", "namespace": "ml"},
            "spec": {
                "nodeSelector": {"pool": "a100", "karpenter.sh/capacity-type": "spot"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        }
    )
    spec = pod_spec(pod, "g")
    assert spec.node_selector == (("karpenter.sh/capacity-type", "spot"), ("pool", "a100"))
    assert [t.key for t in spec.tolerations] == ["nvidia.com/gpu"]
    node = replace(
        gpu_node("n0", "A100-80GB", 1),
        taints=(
            Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE),
            Taint("soft", TaintEffect.PREFER_NO_SCHEDULE),
        ),
    )
    assert [t.key for t in node_info(node).taints] == ["nvidia.com/gpu"]  # PreferNoSchedule never blocks
