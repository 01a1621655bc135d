"""`tessera up` with its devcluster, as a user meets it: the real kubectl, GPU faults, MIG, a replay."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from kubernetes import client, config

from tessera.contracts import subjects
from tessera.testing.services import read_stream
from tests.e2e.harness import Stack, until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_the_kubeconfig_is_in_the_state_dir_and_kubectl_lists_the_gpu_nodes(stack: Stack) -> None:
    assert stack.kubeconfig == stack.state.resolve() / "kubeconfig"
    lines = stack.kubectl("get", "nodes,pods", "-o", "wide").splitlines()
    nodes = [line.split() for line in lines if line.startswith("node/")]
    assert [(cells[0], cells[1]) for cells in nodes] == [(f"node/gpu-node-{i}", "Ready") for i in range(4)]
    allocatable = stack.node("gpu-node-0")["status"]["allocatable"]
    assert allocatable["nvidia.com/gpu"] == "8"


async def test_an_injected_xid_is_reported_as_gpu_unhealthy_within_15_seconds(stack: Stack) -> None:
    injected = stack.tessera(
        "devcluster",
        "fault",
        "gpu-node-1",
        "--gpu",
        "5",
        "--code",
        "79",
        "--kubeconfig",
        str(stack.kubeconfig),
    )
    assert injected.returncode == 0, injected.stderr
    started = time.monotonic()
    nc = await nats.connect(stack.nats_url)
    try:
        found: list[dict[str, Any]] = []
        while time.monotonic() - started < 15 and not found:
            events = await read_stream(nc.jetstream(), subjects.GPU_UNHEALTHY, idle_s=0.3)
            found = [e.data for e in events if e.data["node"] == "gpu-node-1" and e.data["gpu_index"] == 5]
    finally:
        await nc.close()
    assert found, "no gpu_unhealthy event for gpu-node-1 GPU 5 within 15 s of the XID"
    assert found[0]["faults"] == ["xid"] and found[0]["xid"] == 79
    # the device plugin withdrew it as well
    until(
        lambda: stack.node("gpu-node-1")["status"]["allocatable"]["nvidia.com/gpu"] == "7",
        "the device plugin to withdraw the GPU",
    )


BUSY_POD = """
apiVersion: v1
kind: Pod
metadata: {name: holds-a-gpu, namespace: default}
spec:
  nodeName: gpu-node-3
  containers:
    - name: main
      image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
      resources: {limits: {nvidia.com/gpu: "1"}}
"""


def test_mig_config_succeeds_on_an_idle_node_and_fails_on_a_busy_one(stack: Stack) -> None:
    stack.kubectl("apply", "-f", "-", stdin=BUSY_POD)
    until(
        lambda: stack.kubectl("get", "pod", "holds-a-gpu", "-o", "jsonpath={.status.phase}") == "Running",
        "the GPU-holding pod to run",
    )
    # the official client reads the running pod's status back (it requires each container's imageID)
    api = config.new_client_from_config(config_file=str(stack.kubeconfig))  # type: ignore[no-untyped-call]
    status = client.CoreV1Api(api).read_namespaced_pod("holds-a-gpu", "default").status
    assert status.container_statuses[0].image_id.startswith("pytorch/pytorch@sha256:")
    for node in ("gpu-node-2", "gpu-node-3"):
        stack.kubectl("label", "node", node, "nvidia.com/mig.config=all-1g.10gb", "--overwrite")

    def state_of(node: str) -> str | None:
        labels: dict[str, str] = stack.node(node)["metadata"]["labels"]
        return labels.get("nvidia.com/mig.config.state")

    until(lambda: state_of("gpu-node-2") == "success", "MIG success on the idle node")
    allocatable = stack.node("gpu-node-2")["status"]["allocatable"]
    assert allocatable.get("nvidia.com/mig-1g.10gb") == "56"  # 7 instances on each of 8 A100-80GB
    assert allocatable.get("nvidia.com/gpu", "0") == "0"
    until(lambda: state_of("gpu-node-3") == "failed", "MIG failed on the busy node")
    busy = stack.node("gpu-node-3")["status"]["allocatable"]
    assert "nvidia.com/mig-1g.10gb" not in busy and busy["nvidia.com/gpu"] == "8"


def test_replayed_trace_pods_go_through_the_scheduler_to_the_kubelet(stack: Stack) -> None:
    replayed = stack.tessera(
        "devcluster", "replay", "--skip", "2000", "--limit", "8", "--speed", "1000", "--gangs",
        "--kubeconfig", str(stack.kubeconfig),
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "replayed 8 pods, 0 rejected" in replayed.stdout

    def placed() -> list[str]:
        out = stack.kubectl(
            "get", "pods", "-l", "tessera.io/trace=openb", "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase}{'\\n'}{end}",
        )  # fmt: skip
        rows = [line.split() for line in out.splitlines() if line.strip()]
        done = len(rows) == 8 and all(len(r) == 2 and r[1] in ("Running", "Succeeded") for r in rows)
        return [r[0] for r in rows] if done else []

    nodes = until(placed, "the scheduler to bind every replayed pod and the kubelet to run it", timeout=60)
    assert set(nodes) <= {f"gpu-node-{i}" for i in range(4)}


def test_a_job_submitted_with_the_cli_is_bound_runs_and_succeeds(stack: Stack, tmp_path: Path) -> None:
    job = tmp_path / "short-ddp.yaml"
    job.write_text(
        "name: short-ddp\ntenant: research\nestimated_duration_s: 40\n"
        "pod_groups:\n  - {name: worker, replicas: 2, cpu: '8', memory: 64Gi, gpu: {count: 4},\n"
        "     template: {spec: {containers: [{name: ddp, image: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime'}]}}}\n"
    )
    submitted = stack.tessera("jobs", "submit", str(job))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    def pods(phase: str) -> list[list[str]]:
        rows = [
            line.split() for line in stack.kubectl("get", "pods", "-o", "wide", "--no-headers").splitlines()
        ]
        return [r for r in rows if r[0].startswith("short-ddp-") and r[2] == phase]

    running = until(lambda: len(pods("Running")) == 2 and pods("Running"), "both pods bound and Running")
    assert all(row[6].startswith("gpu-node-") for row in running), running  # NODE is filled in
    until(lambda: len(pods("Succeeded")) == 2, "both pods to succeed after their duration", timeout=60)

    def job() -> dict[str, Any]:
        shown = stack.tessera("jobs", "get", job_id, "--json")
        found: dict[str, Any] = json.loads(shown.stdout)
        return found

    until(lambda: job()["state"] == "succeeded", "the job to end succeeded")
    states = [step["state"] for step in job()["history"]]
    assert states == ["submitted", "queued", "admitted", "placed", "running", "succeeded"], states
