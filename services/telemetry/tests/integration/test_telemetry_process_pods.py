"""Host pids named by pod and container: a proc root in tmp_path whose cgroup files name pods created
on the devcluster, resolved through the official client against its API server (the pods on the
node, by UID; containers by the ids their statuses report), wired as the service wires it from a
kubeconfig, and a shared GPU then split by the processes' SM share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tessera.devcluster.runner import DevCluster
from tessera.devcluster.testing import NODE, api_client, start_cluster, wait_for
from tessera.telemetry.adapters.processes import KubeNodePods, ProcessResolver
from tessera.telemetry.bootstrap import make_process_resolver
from tessera.telemetry.config import TelemetrySettings
from tessera.telemetry.domain.attribution import SPLIT_SM, GpuProcess, Holder, split_reading
from tessera.telemetry.domain.cgroups import ProcessOwner

pytestmark = pytest.mark.integration

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
WORKER_ID = "0f" * 32  # what containerd would call the trainer's worker container
SIDECAR_ID = "1e" * 32


@pytest.fixture(scope="module")
def cluster() -> Iterator[DevCluster]:
    devcluster = start_cluster()
    yield devcluster
    devcluster.stop()


def pod(name: str, containers: list[str], node: str | None = NODE) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="team-a"),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[
                client.V1Container(
                    name=c,
                    image=IMAGE,
                    resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
                )
                for c in containers
            ],
        ),
    )


def _any(value: Any) -> Any:
    return value


def running(core: client.CoreV1Api, name: str) -> Any:
    return wait_for(
        lambda: (p := _any(core.read_namespaced_pod(name, "team-a"))).status.phase == "Running" and p,
        what=f"pod {name} running",
    )


def write_proc(root: Path, cgroups: dict[int, str]) -> Path:
    for pid, path in {1: "/init.scope", **cgroups}.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(f"0::{path}\n")
    return root


@pytest.fixture(scope="module")
def pods(cluster: DevCluster) -> dict[str, str]:
    """name -> UID of the pods made for these tests: two on the node (the trainer's two containers
    reporting their runtime ids, as a real kubelet does), one not scheduled anywhere."""
    with api_client(cluster) as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-a")))
        core.create_namespaced_pod("team-a", pod("trainer", ["worker", "sidecar"]))
        core.create_namespaced_pod("team-a", pod("server", ["model"]))
        core.create_namespaced_pod("team-a", pod("elsewhere", ["main"], node=None))
        running(core, "trainer")
        running(core, "server")
        ids = [
            {"name": "worker", "containerID": f"containerd://{WORKER_ID}"},
            {"name": "sidecar", "containerID": f"containerd://{SIDECAR_ID}"},
        ]
        core.patch_namespaced_pod_status("trainer", "team-a", {"status": {"containerStatuses": ids}})
        made: list[Any] = core.list_namespaced_pod("team-a").items
        return {str(p.metadata.name): str(p.metadata.uid) for p in made}


def test_the_resolver_names_devcluster_pods_and_containers_from_cgroups(
    cluster: DevCluster, pods: dict[str, str], tmp_path: Path
) -> None:
    trainer, server, elsewhere = pods["trainer"], pods["server"], pods["elsewhere"]
    with api_client(cluster) as api:  # the id the devcluster's kubelet reported for the server
        status = client.CoreV1Api(api).read_namespaced_pod("server", "team-a").status
        server_id = str(status.container_statuses[0].container_id).removeprefix("containerd://")
    proc = write_proc(
        tmp_path / "proc",
        {
            # systemd driver: the trainer's worker and sidecar
            101: f"/kubepods.slice/kubepods-pod{trainer.replace('-', '_')}.slice/cri-containerd-{WORKER_ID}.scope",
            102: f"/kubepods.slice/kubepods-pod{trainer.replace('-', '_')}.slice/cri-containerd-{SIDECAR_ID}.scope",
            # cgroupfs driver: the server's only container, by the id its status reports
            103: f"/kubepods/burstable/pod{server}/{server_id}",
            104: f"/kubepods/burstable/pod{elsewhere}/{'3c' * 32}",  # a pod on no node, not this one's
            105: "/system.slice/nvidia-persistenced.service",
        },
    )
    with api_client(cluster) as api:
        resolver = ProcessResolver(KubeNodePods(api, NODE), proc)
        owners = resolver.resolve([101, 102, 103, 104, 105, 106])
    assert owners == {
        101: ProcessOwner("team-a/trainer", "worker"),
        102: ProcessOwner("team-a/trainer", "sidecar"),
        103: ProcessOwner("team-a/server", "model"),
        104: None,
        105: None,
        106: None,  # gone before its cgroup was read
    }
    assert (resolver.unknown, resolver.problem) == (3, None)
    # the trainer's processes split its GPU share by SM, the server's by its own
    held = [
        Holder("team-a", "trainer", "worker", "GPU-0", 250),
        Holder("team-a", "trainer", "sidecar", "GPU-0", 250),
        Holder("team-a", "server", "model", "GPU-0", 500),
    ]
    processes = [
        GpuProcess(pid, 1000, o.pod, o.container, sm)
        for (pid, o), sm in zip(((p, owners[p]) for p in (101, 102, 103)), (30.0, 10.0, 40.0), strict=True)
        if o is not None
    ]
    worker, sidecar, model = split_reading(80.0, 3000, held, processes)
    assert {worker.split, sidecar.split, model.split} == {SPLIT_SM}
    assert (worker.used_gpus, sidecar.used_gpus, model.used_gpus) == pytest.approx((0.3, 0.1, 0.4))


def test_the_service_wires_the_resolver_from_its_kubeconfig(
    cluster: DevCluster, pods: dict[str, str], tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "dev", "cluster": {"server": cluster.url}}],
                "users": [{"name": "dev", "user": {}}],
                "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "dev"}}],
                "current-context": "dev",
            }
        )
    )
    proc = write_proc(tmp_path / "proc", {7: f"/kubepods/pod{pods['server']}/{'4b' * 32}"})
    settings = TelemetrySettings(
        source="nvml", node_name=NODE, kubeconfig=kubeconfig, usage={"proc_root": str(proc)}
    )
    resolver = make_process_resolver(settings, NODE)
    assert resolver is not None and resolver.proc_root == proc
    assert resolver.resolve([7]) == {7: ProcessOwner("team-a/server", "model")}
    assert make_process_resolver(TelemetrySettings(source="nvml", node_name=NODE), NODE) is None
