"""A GPU in MIG mode is handed out only as its MIG devices. Before, the scheduler's view kept it as
an ordinary healthy, idle GPU beside the MIG slices counted in the node's MIG capacity, so one
physical GPU went both to a whole-GPU (or fractional) pod and to MIG pods."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions.names import GPU_RESOURCE
from tessera.cluster.domain.gpu import MigMode, MigStrategy
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import NodeInfo


def place(info: NodeInfo, *pods: PodSpec) -> dict[str, str | None]:
    """Each pod in turn, reserved where it fits: pod -> node (None where it fits nowhere)."""
    cache = SchedulerCache.rebuild([info])
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    placed: dict[str, str | None] = {}
    for pod in pods:
        state = CycleState()
        result = framework.schedule_pod(state, pod, cache.snapshot())
        if result.node is not None:
            assert framework.run_reserve(state, pod, result.node).ok
        placed[pod.name] = result.node
    return placed


def mig(name: str, profile: str, count: int) -> PodSpec:
    return PodSpec(name, name, mig=MappingProxyType({profile: count}))


def test_a_node_all_in_mig_mode_offers_only_its_slices() -> None:
    info = node_info(gpu_node("n1", "A100-80GB", 1, mig_config="all-1g.10gb"))

    assert [gpu.mig for gpu in info.gpus] == [True] and dict(info.mig_capacity) == {"1g.10gb": 7}
    assert (info.free_whole_gpus, info.free_healthy_milli, info.has_unhealthy) == (0, 0, False)
    placed = place(
        info,
        PodSpec("whole", "whole", gpu_count=1),
        PodSpec("share", "share", gpu_count=1, gpu_milli=500),
        mig("slices", "1g.10gb", 7),
    )
    assert placed == {"whole": None, "share": None, "slices": "n1"}


def test_a_node_with_some_gpus_in_mig_mode_offers_the_others_whole() -> None:
    node = gpu_node("n1", "A100-80GB", 2, mig_config="all-1g.10gb")
    gpus = (node.gpus[0], dataclasses.replace(node.gpus[1], mig_mode=MigMode.DISABLED, mig_instances=()))
    node = dataclasses.replace(
        node, gpus=gpus, extended_allocatable={GPU_RESOURCE: 1, "nvidia.com/mig-1g.10gb": 7}
    )
    info = node_info(node)

    assert [gpu.mig for gpu in info.gpus] == [True, False]
    placed = place(
        info,
        PodSpec("pair", "pair", gpu_count=2),
        PodSpec("whole", "whole", gpu_count=1),
        PodSpec("share", "share", gpu_count=1, gpu_milli=500),
        mig("slices", "1g.10gb", 7),
    )
    assert placed == {"pair": None, "whole": "n1", "share": None, "slices": "n1"}


def test_a_share_goes_only_to_a_gpu_out_of_mig_mode() -> None:
    node = gpu_node("n1", "A100-80GB", 2, mig_config="all-1g.10gb")
    gpus = (node.gpus[0], dataclasses.replace(node.gpus[1], mig_mode=MigMode.DISABLED, mig_instances=()))
    info = node_info(dataclasses.replace(node, gpus=gpus))
    cache = SchedulerCache.rebuild([info])
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    state = CycleState()
    pod = PodSpec("share", "share", gpu_count=1, gpu_milli=500)
    assert framework.schedule_pod(state, pod, cache.snapshot()).node == "n1"
    assert framework.run_reserve(state, pod, "n1").ok
    allocation = cache.allocation("share")
    assert allocation is not None and allocation.gpu_indices == (1,)


def test_time_sliced_gpus_out_of_mig_mode_are_still_shared_by_replicas() -> None:
    info = node_info(gpu_node("n1", "A100-80GB", 1, replicas=4))
    assert [(gpu.mig, gpu.offered) for gpu in info.gpus] == [(False, True)]
    assert info.free_whole_gpus == 1


def test_under_the_single_strategy_mig_gpus_stay_offered_as_gpus() -> None:
    """The device plugin then advertises the MIG devices as nvidia.com/gpu, and no MIG resource."""
    node = gpu_node("n1", "A100-80GB", 1, mig_config="all-1g.10gb")
    node = dataclasses.replace(node, mig_strategy=MigStrategy.SINGLE, extended_allocatable={GPU_RESOURCE: 7})
    info = node_info(node)
    assert [gpu.mig for gpu in info.gpus] == [False] and dict(info.mig_capacity) == {}
