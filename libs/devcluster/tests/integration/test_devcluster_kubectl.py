"""The real `kubectl` binary against the emulated API server: a client nobody here wrote."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.devcluster.apiserver import NODES, PODGROUPS, PODS, ApiServer

pytestmark = pytest.mark.integration


@pytest.fixture
def kubectl(kubectl_path: str) -> Callable[..., str]:
    def run(kubeconfig: Path, *args: str) -> str:
        result = subprocess.run(
            [kubectl_path, "--kubeconfig", str(kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    return run


@pytest.fixture
def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> Path:
    store = apiserver.store
    for name in ("gpu-0", "gpu-1"):
        store.create(
            NODES,
            None,
            {
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "addresses": [{"type": "InternalIP", "address": f"10.0.0.{name[-1]}"}],
                    "nodeInfo": {"kubeletVersion": "v1.31.0-devcluster"},
                },
            },
        )
    store.create(
        PODS, "default", {"metadata": {"name": "trainer-0"}, "spec": {"containers": [{"name": "m"}]}}
    )
    store.bind("default", "trainer-0", "gpu-1")
    store.create(PODGROUPS, "default", {"metadata": {"name": "trainer"}, "spec": {"minMember": 2}})
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


def test_kubectl_gets_nodes_and_pods_wide(kubectl: Callable[..., str], kubeconfig: Path) -> None:
    output = kubectl(kubeconfig, "get", "nodes,pods", "-o", "wide")
    lines = output.splitlines()

    node_lines = [line.split() for line in lines if line.startswith("node/")]
    pod_lines = [line.split() for line in lines if line.startswith("pod/")]
    assert [(cells[0], cells[1]) for cells in node_lines] == [
        ("node/gpu-0", "Ready"),
        ("node/gpu-1", "Ready"),
    ]
    assert "10.0.0.1" in next(line for line in lines if line.startswith("node/gpu-1"))
    assert len(pod_lines) == 1 and pod_lines[0][0] == "pod/trainer-0"
    assert "gpu-1" in pod_lines[0]  # the NODE column of -o wide


def test_kubectl_gets_podgroups(kubectl: Callable[..., str], kubeconfig: Path) -> None:
    output = kubectl(kubeconfig, "get", "podgroups")

    header, *rows = output.splitlines()
    assert header.split()[:3] == ["NAME", "PHASE", "MINMEMBER"]
    assert [row.split()[0] for row in rows] == ["trainer"]


def test_kubectl_labels_a_node(kubectl: Callable[..., str], kubeconfig: Path, apiserver: ApiServer) -> None:
    output = kubectl(kubeconfig, "label", "node", "gpu-0", "nvidia.com/mig.config=all-1g.10gb")

    assert "labeled" in output
    labels = apiserver.store.get(NODES, None, "gpu-0")["metadata"]["labels"]
    assert labels["nvidia.com/mig.config"] == "all-1g.10gb"
    assert "nvidia.com/mig.config=all-1g.10gb" in kubectl(kubeconfig, "get", "node", "gpu-0", "--show-labels")


def test_kubectl_cordons_a_node(kubectl: Callable[..., str], kubeconfig: Path, apiserver: ApiServer) -> None:
    kubectl(kubeconfig, "cordon", "gpu-1")

    assert apiserver.store.get(NODES, None, "gpu-1")["spec"]["unschedulable"] is True
    assert "SchedulingDisabled" in kubectl(kubeconfig, "get", "node", "gpu-1")


def test_kubectl_reports_a_missing_object_as_not_found(kubectl_path: str, kubeconfig: Path) -> None:
    result = subprocess.run(
        [kubectl_path, "--kubeconfig", str(kubeconfig), "get", "pod", "ghost"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode != 0
    assert 'pods "ghost" not found' in result.stderr


def test_kubectl_creates_applies_and_deletes_from_a_manifest(
    kubectl: Callable[..., str], kubeconfig: Path, apiserver: ApiServer, tmp_path: Path
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: demo, labels: {v: '1'}}\n"
        "spec:\n  schedulerName: tessera\n"
        "  containers: [{name: main, image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime, resources: {limits: {nvidia.com/gpu: 2}}}]\n"
    )

    assert "pod/demo created" in kubectl(kubeconfig, "apply", "-f", str(manifest))
    created = apiserver.store.get(PODS, "default", "demo")
    manifest.write_text(manifest.read_text().replace("v: '1'", "v: '2'"))
    assert "pod/demo configured" in kubectl(kubeconfig, "apply", "-f", str(manifest))
    applied = apiserver.store.get(PODS, "default", "demo")
    assert 'pod "demo" deleted' in kubectl(kubeconfig, "delete", "-f", str(manifest))

    assert created["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    assert applied["metadata"]["labels"] == {"v": "2"}
    assert apiserver.store.find(PODS, "default", "demo") is None
