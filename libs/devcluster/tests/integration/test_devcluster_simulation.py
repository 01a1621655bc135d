"""The devcluster simulation: kubelet lifecycle, GPU Operator (device plugin, MIG manager), NVML, faults."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.devcluster.apiserver import CONFIGMAPS, NODES, PODS, Selector
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SIM_DURATION_ANNOTATION, SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace

pytestmark = pytest.mark.integration

FAST = SimSettings(speed=50.0, pod_start_seconds=1.0, mig_reconfigure_seconds=5.0)


def a100_node(name: str = "gpu-0", count: int = 8, labels: dict[str, str] | None = None) -> NodeSpec:
    return NodeSpec(name, 96_000, 1_048_576, "A100-80GB", count, 81920, labels or {})


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    nodes = [a100_node("gpu-0"), a100_node("gpu-1"), NodeSpec("cpu-0", 64_000, 262_144)]
    async with DevCluster(nodes, settings=FAST, duty_cycle=DutyCycleTrace.synthetic()) as running:
        yield running


async def eventually(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Poll until `check` returns something truthy; fail with the last value when it never does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            pytest.fail(f"condition never held; last value: {value!r}")
        await asyncio.sleep(0.02)


def run_pod(cluster: DevCluster, name: str, node: str, manifest: PodManifest | None = None) -> None:
    pod = (manifest or PodManifest(name).scheduler()).obj()
    cluster.store.create(PODS, "default", pod)
    cluster.store.bind("default", name, node)


def phase(cluster: DevCluster, name: str) -> str:
    return str(cluster.store.get(PODS, "default", name)["status"]["phase"])


def allocatable(cluster: DevCluster, node: str) -> dict[str, str]:
    return dict(cluster.store.get(NODES, None, node)["status"]["allocatable"])


def label(cluster: DevCluster, node: str, key: str, value: str) -> None:
    cluster.store.patch(
        NODES, None, node, {"metadata": {"labels": {key: value}}}, "application/merge-patch+json"
    )


def mig_state(cluster: DevCluster, node: str) -> str | None:
    labels = cluster.store.get(NODES, None, node)["metadata"]["labels"]
    return labels.get(MIG_CONFIG_STATE_LABEL)


async def test_nodes_advertise_their_gpus(cluster: DevCluster) -> None:
    gpu_node = cluster.store.get(NODES, None, "gpu-0")
    cpu_node = cluster.store.get(NODES, None, "cpu-0")

    assert gpu_node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert gpu_node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert len(json.loads(gpu_node["metadata"]["annotations"]["tessera.io/gpus"])) == 8
    assert "nvidia.com/gpu" not in cpu_node["status"]["allocatable"]


async def test_a_bound_pod_runs_then_succeeds_after_its_sim_duration(cluster: DevCluster) -> None:
    watch = cluster.store.watch(PODS, "default")
    run_pod(
        cluster,
        "job",
        "gpu-0",
        PodManifest("job").scheduler().gpus(1).annotate("tessera.io/sim-duration", "20"),
    )

    phases: list[str] = []
    while not phases or phases[-1] not in ("Succeeded", "Failed"):
        event = await asyncio.wait_for(watch.next(), 20)
        assert event is not None
        current = event["object"]["status"]["phase"]
        if not phases or phases[-1] != current:
            phases.append(current)
    watch.close()

    final = cluster.store.get(PODS, "default", "job")
    assert phases == ["Pending", "Running", "Succeeded"]
    assert final["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert final["status"]["podIP"] and final["status"]["hostIP"]


async def test_a_pod_without_sim_duration_keeps_running(cluster: DevCluster) -> None:
    run_pod(cluster, "server", "gpu-0")
    await eventually(lambda: phase(cluster, "server") == "Running")
    # a pod started after it, asking for 15 simulated seconds, runs them and ends
    timed = PodManifest("timed").scheduler().annotate(SIM_DURATION_ANNOTATION, "15")
    run_pod(cluster, "timed", "gpu-0", timed)

    await eventually(lambda: phase(cluster, "timed") == "Succeeded")

    assert phase(cluster, "server") == "Running"
    # each container carries the id its runtime gave it, distinct per pod, as the kubelet reports
    ids = [
        cluster.store.get(PODS, "default", name)["status"]["containerStatuses"][0]["containerID"]
        for name in ("server", "timed")
    ]
    assert all(re.fullmatch(r"containerd://[0-9a-f]{64}", i) for i in ids) and len(set(ids)) == 2, ids


async def test_pods_fail_with_node_lost_when_their_node_is_lost(cluster: DevCluster) -> None:
    run_pod(cluster, "victim", "gpu-1", PodManifest("victim").scheduler().gpus(2))
    await eventually(lambda: phase(cluster, "victim") == "Running")

    cluster.inject_fault("gpu-1", None, "lost")

    pod = cluster.store.get(PODS, "default", "victim")
    ready = {c["type"]: c["status"] for c in cluster.store.get(NODES, None, "gpu-1")["status"]["conditions"]}
    assert (pod["status"]["phase"], pod["status"]["reason"]) == ("Failed", "NodeLost")
    assert ready["Ready"] == "Unknown"


async def test_a_pod_asking_for_more_gpus_than_the_node_has_fails_admission(cluster: DevCluster) -> None:
    run_pod(cluster, "greedy", "gpu-0", PodManifest("greedy").scheduler().gpus(9))

    await eventually(lambda: phase(cluster, "greedy") == "Failed")
    assert cluster.store.get(PODS, "default", "greedy")["status"]["reason"] == "UnexpectedAdmissionError"


async def test_mig_config_on_an_idle_node_is_applied(cluster: DevCluster) -> None:
    watch = cluster.store.watch(NODES, selector=Selector.parse(None, "metadata.name=gpu-0"))
    label(cluster, "gpu-0", MIG_CONFIG_LABEL, "all-1g.10gb")

    states: list[tuple[str | None, str | None]] = []
    while not states or states[-1][0] != "success":
        event = await asyncio.wait_for(watch.next(), 20)
        assert event is not None
        node = event["object"]
        state = node["metadata"]["labels"].get(MIG_CONFIG_STATE_LABEL)
        if not states or states[-1][0] != state:
            states.append((state, node["status"]["allocatable"].get("nvidia.com/gpu")))
    watch.close()

    # Pending, with the GPUs withdrawn while the MIG manager works; then success.
    assert states[-2:] == [("pending", None), ("success", "0")]
    resources = allocatable(cluster, "gpu-0")
    assert resources["nvidia.com/mig-1g.10gb"] == str(7 * 8)
    assert resources["nvidia.com/gpu"] == "0"


async def test_mig_config_on_a_busy_node_fails_and_changes_nothing(cluster: DevCluster) -> None:
    run_pod(cluster, "busy", "gpu-1", PodManifest("busy").scheduler().gpus(8))
    await eventually(lambda: phase(cluster, "busy") == "Running")

    label(cluster, "gpu-1", MIG_CONFIG_LABEL, "all-balanced")

    await eventually(lambda: mig_state(cluster, "gpu-1") == "failed")
    node = cluster.store.get(NODES, None, "gpu-1")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert not any(key.startswith("nvidia.com/mig-") for key in node["status"]["allocatable"])


async def test_an_unknown_mig_config_fails(cluster: DevCluster) -> None:
    label(cluster, "gpu-0", MIG_CONFIG_LABEL, "all-9g.999gb")

    await eventually(lambda: mig_state(cluster, "gpu-0") == "failed")
    assert allocatable(cluster, "gpu-0")["nvidia.com/gpu"] == "8"


async def test_time_slicing_multiplies_nvidia_gpu_by_the_replicas(cluster: DevCluster) -> None:
    label(cluster, "gpu-0", DEVICE_PLUGIN_CONFIG_LABEL, "ts-4")
    await eventually(lambda: allocatable(cluster, "gpu-0")["nvidia.com/gpu"] == "32")

    configmap = cluster.store.get(CONFIGMAPS, "gpu-operator", "device-plugin-config")
    configmap["data"]["ts-4"] = configmap["data"]["ts-4"].replace("replicas: 4", "replicas: 3")
    cluster.store.replace(CONFIGMAPS, "gpu-operator", "device-plugin-config", configmap)

    await eventually(lambda: allocatable(cluster, "gpu-0")["nvidia.com/gpu"] == "24")
    assert cluster.store.get(NODES, None, "gpu-0")["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "3"


async def test_nvml_readings_follow_the_pods_placed_on_the_gpus(cluster: DevCluster) -> None:
    idle = cluster.nvml_readings("gpu-0")
    run_pod(cluster, "train", "gpu-0", PodManifest("train").scheduler().gpus(2))
    await eventually(lambda: phase(cluster, "train") == "Running")

    busy = cluster.nvml_readings("gpu-0")

    assert all(r.utilisation_pct == 0 and r.memory_used_mib == 0 for r in idle)
    loaded = [r for r in busy if r.pods]
    assert len(loaded) == 2 and all(r.pods == ("default/train",) for r in loaded)
    assert all(r.utilisation_pct > 80 and r.memory_used_mib > 0 for r in loaded)
    assert all(
        r.power_w > i.power_w and r.temperature_c > i.temperature_c
        for r, i in zip(loaded, idle[:2], strict=True)
    )
    assert all(r.utilisation_pct == 0 for r in busy if not r.pods)


async def test_a_fractional_inference_pod_replays_the_duty_cycle(cluster: DevCluster) -> None:
    run_pod(cluster, "infer", "gpu-0", PodManifest("infer").scheduler().gpu_milli(500))
    await eventually(lambda: phase(cluster, "infer") == "Running")

    (reading,) = [r for r in cluster.nvml_readings("gpu-0") if r.pods]
    expected = cluster.nvml.trace.value("default/infer", reading.sampled_at_s)

    assert reading.utilisation_pct == pytest.approx(expected, abs=0.1)
    assert 0 < reading.memory_used_mib <= reading.memory_total_mib // 2


async def test_an_injected_xid_shows_in_readings_and_withdraws_the_gpu(cluster: DevCluster) -> None:
    cluster.inject_fault("gpu-0", 3, "xid", 79)

    reading = cluster.nvml_readings("gpu-0")[3]
    assert reading.xid_errors == (79,) and reading.health == "unhealthy"
    assert allocatable(cluster, "gpu-0")["nvidia.com/gpu"] == "7"
    inventory = json.loads(
        cluster.store.get(NODES, None, "gpu-0")["metadata"]["annotations"]["tessera.io/gpus"]
    )
    assert [g["health"] for g in inventory].count("unhealthy") == 1

    cluster.clear_faults("gpu-0")
    assert allocatable(cluster, "gpu-0")["nvidia.com/gpu"] == "8"


async def test_nvml_and_faults_over_http(cluster: DevCluster) -> None:
    def request(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            cluster.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    status, injected = await asyncio.to_thread(
        request, "POST", "/faults/gpu-1", {"kind": "overheating", "gpu": 5}
    )
    _, readings = await asyncio.to_thread(request, "GET", "/nvml/gpu-1")
    missing, _ = await asyncio.to_thread(request, "GET", "/nvml/no-such-node")
    bad, problem = await asyncio.to_thread(request, "POST", "/faults/gpu-1", {"kind": "meteor"})

    assert status == 200 and injected["injected"]["kind"] == "overheating"
    assert [r["index"] for r in readings["readings"] if r["throttled"]] == [5]
    assert readings["readings"][5]["temperature_c"] >= 90
    assert missing == 404
    assert bad == 400 and "kind" in problem["message"]


async def test_a_time_sliced_node_runs_a_pod_per_replica(cluster: DevCluster) -> None:
    label(cluster, "gpu-0", DEVICE_PLUGIN_CONFIG_LABEL, "ts-2")
    await eventually(lambda: allocatable(cluster, "gpu-0")["nvidia.com/gpu"] == "16")

    for i in range(17):
        run_pod(cluster, f"replica-{i}", "gpu-0", PodManifest(f"replica-{i}").scheduler().gpus(1))

    await eventually(lambda: phase(cluster, "replica-16") == "Failed")
    await eventually(lambda: all(phase(cluster, f"replica-{i}") == "Running" for i in range(16)))
    readings = cluster.nvml_readings("gpu-0")
    assert [len(r.pods) for r in readings] == [2] * 8


async def test_the_kubelet_rejects_a_pod_that_overflows_the_node_cpu(cluster: DevCluster) -> None:
    run_pod(cluster, "big", "cpu-0", PodManifest("big").scheduler().requests(cpu="40"))
    await eventually(lambda: phase(cluster, "big") == "Running")

    run_pod(cluster, "bigger", "cpu-0", PodManifest("bigger").scheduler().requests(cpu="30"))

    await eventually(lambda: phase(cluster, "bigger") == "Failed")
    status = cluster.store.get(PODS, "default", "bigger")["status"]
    assert status["reason"] == "OutOfcpu" and "requested: 30000, used: 40000" in status["message"]
