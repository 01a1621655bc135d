"""Pods on a node whose GPUs are shared by MPS: each client gets 1/replicas of a GPU, no more."""

from __future__ import annotations

from tessera.cluster.conventions.names import GPU_REPLICAS_LABEL, GPU_SHARING_STRATEGY_LABEL
from tessera.cluster.conventions.nodes import parse_node
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.framework.cluster_view import node_info
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.framework.status import Reason
from tessera.scheduler.domain.gang.queue import hints_for
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.plugins.filters import mps_client_milli
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import NodeInfo


def mps_node(name: str, replicas: int, gpus: int = 2) -> NodeInfo:
    return (
        make_node(name)
        .gpus(gpus)
        .label(GPU_SHARING_STRATEGY_LABEL, "mps")
        .label(GPU_REPLICAS_LABEL, str(replicas))
        .build()
    )


def schedule(cache: SchedulerCache, pod: PodSpec) -> tuple[str | None, str]:
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    state = CycleState()
    result = framework.schedule_pod(state, pod, cache.snapshot())
    if result.node is not None:
        assert framework.run_reserve(state, pod, result.node).ok
    return result.node, result.diagnosis.message() if result.diagnosis is not None else ""


def test_the_client_limit_is_a_gpu_over_the_replicas_only_under_mps() -> None:
    assert mps_client_milli(mps_node("m", 4)) == 250
    assert mps_client_milli(mps_node("m", 3)) == 333
    assert mps_client_milli(mps_node("m", 1)) is None
    sliced = (
        make_node("t")
        .gpus(2)
        .label(GPU_SHARING_STRATEGY_LABEL, "time-slicing")
        .label(GPU_REPLICAS_LABEL, "4")
    )
    assert mps_client_milli(sliced.build()) is None
    assert mps_client_milli(make_node("e").gpus(2).build()) is None


def test_a_share_larger_than_an_mps_client_goes_elsewhere_and_a_fitting_one_stays() -> None:
    cache = SchedulerCache.rebuild([mps_node("mps", 4), make_node("plain").gpus(1).build()])
    # 300 milli is more than the 250 an MPS client of four gets: only the plain node can hold it.
    assert schedule(cache, make_pod("big", gang="g1", gpus=1, milli=300))[0] == "plain"
    assert schedule(cache, make_pod("rest", gang="g2", gpus=1, milli=700))[0] == "plain"
    for i in range(4):
        assert schedule(cache, make_pod(f"small{i}", gang=f"s{i}", gpus=1, milli=250))[0] == "mps"
    node, why = schedule(cache, make_pod("over", gang="g3", gpus=1, milli=300))
    assert node is None
    assert why == f"{Reason.OVER_MPS_CLIENT_LIMIT} on 1 node; insufficient GPU on 1"


def test_whole_gpus_and_oversized_shares_are_refused_on_an_mps_only_cluster_with_the_reason() -> None:
    cache = SchedulerCache.rebuild([mps_node("mps-a", 2), mps_node("mps-b", 4)])
    node, why = schedule(cache, make_pod("whole", gpus=1))
    assert node is None
    assert why == f"{Reason.OVER_MPS_CLIENT_LIMIT} on 2 nodes"
    node, why = schedule(cache, make_pod("share", gpus=1, milli=400))
    assert node == "mps-a"  # half a GPU per client there
    node, why = schedule(cache, make_pod("share2", gang="g2", gpus=1, milli=600))
    assert node is None and why == f"{Reason.OVER_MPS_CLIENT_LIMIT} on 2 nodes"


def test_the_labels_the_device_plugin_writes_reach_the_filter_through_the_cluster_model() -> None:
    manifest = {
        "metadata": {
            "name": "n1",
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.memory": "81920",
                GPU_SHARING_STRATEGY_LABEL: "mps",
                GPU_REPLICAS_LABEL: "2",
            },
        },
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "4"}},
    }
    info = node_info(parse_node(manifest))
    assert len(info.gpus) == 2 and mps_client_milli(info) == 500


def test_a_pod_refused_for_the_client_limit_wakes_when_a_layout_changes() -> None:
    hints = hints_for([Reason.OVER_MPS_CLIENT_LIMIT])
    assert {e.name for e in hints} >= {"LAYOUT_CHANGED", "NODE_CHANGED"}
    assert "CAPACITY_FREED" not in {e.name for e in hints}
