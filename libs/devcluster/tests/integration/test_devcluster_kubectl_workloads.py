"""The real `kubectl` against the devcluster's workload controllers: apply, get, describe, wait,
scale, rollout status, patch and delete of Jobs, Deployments and JobSets."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tessera.devcluster.runner import DevCluster
from tessera.devcluster.testing import api_client, binding_scheduler, start_cluster, wait_for

pytestmark = pytest.mark.integration

Kubectl = Callable[..., str]

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: ddp
spec:
  completionMode: Indexed
  completions: 2
  parallelism: 2
  template:
    metadata:
      annotations:
        tessera.io/sim-duration: 2s
    spec:
      restartPolicy: Never
      containers:
        - name: trainer
          image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
          command: ["torchrun", "train.py"]
"""

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: server
          image: vllm/vllm-openai:v0.6.3
"""

JOBSET = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: pretrain
spec:
  replicatedJobs:
    - name: driver
      template:
        spec:
          parallelism: 1
          completions: 1
          template:
            spec:
              containers: [{name: driver, image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime}]
    - name: workers
      replicas: 2
      template:
        spec:
          parallelism: 2
          completions: 2
          template:
            spec:
              containers: [{name: worker, image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime}]
"""


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running = start_cluster()
    yield running
    running.stop()


@pytest.fixture
def api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    with api_client(cluster) as api:
        yield api


@pytest.fixture
def kubectl(kubectl_path: str, cluster: DevCluster, tmp_path: Path) -> Kubectl:
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")

    def run(*args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            [kubectl_path, "--kubeconfig", str(kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    return run


def manifest(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_kubectl_applies_waits_for_describes_and_deletes_an_indexed_job(
    kubectl: Kubectl, api: client.ApiClient, tmp_path: Path
) -> None:
    assert kubectl("apply", "-f", manifest(tmp_path, "job.yaml", JOB)).strip() == "job.batch/ddp created"
    with binding_scheduler(api):
        kubectl("wait", "--for=condition=complete", "job/ddp", "--timeout=30s")

    header, row = kubectl("get", "jobs").splitlines()
    assert header.split() == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert row.split()[:3] == ["ddp", "Complete", "2/2"]
    described = kubectl("describe", "job", "ddp")
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in described.splitlines())}
    assert fields["Completion Mode"] == "Indexed" and fields["Completed Indexes"] == "0-1"
    assert fields["Pods Statuses"] == "0 Active (0 Ready) / 2 Succeeded / 0 Failed"
    events = described.split("Events:", 1)[1]
    assert events.count("SuccessfulCreate") == 2 and "Job completed" in events

    kubectl("delete", "job", "ddp")
    core = client.CoreV1Api(api)
    wait_for(lambda: core.list_namespaced_pod("default").items == [], what="the Job's pods collected")


def test_kubectl_scales_and_waits_for_a_deployment_rollout(
    kubectl: Kubectl, api: client.ApiClient, tmp_path: Path
) -> None:
    kubectl("apply", "-f", manifest(tmp_path, "deploy.yaml", DEPLOYMENT))
    with binding_scheduler(api):
        assert "deployment.apps/web scaled" in kubectl("scale", "deployment", "web", "--replicas=3")
        out = kubectl("rollout", "status", "deployment/web", "--timeout=30s")
        assert 'deployment "web" successfully rolled out' in out
        kubectl("set", "image", "deployment/web", "server=vllm/vllm-openai:v0.6.4")
        kubectl("rollout", "status", "deployment/web", "--timeout=30s")

    rows = [line.split() for line in kubectl("get", "deployments").splitlines()[1:]]
    assert rows[0][:4] == ["web", "3/3", "3", "3"]
    images = kubectl("get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.containers[0].image}")
    assert images.split() == ["vllm/vllm-openai:v0.6.4"] * 3
    assert len(kubectl("get", "replicasets", "-l", "app=web", "-o", "name").split()) == 2


def test_kubectl_applies_a_jobset_lists_its_jobs_and_suspends_it(
    kubectl: Kubectl, api: client.ApiClient, tmp_path: Path
) -> None:
    created = kubectl("apply", "-f", manifest(tmp_path, "jobset.yaml", JOBSET)).strip()
    assert created == "jobset.jobset.x-k8s.io/pretrain created"
    selector = "jobset.sigs.k8s.io/jobset-name=pretrain"
    wait_for(lambda: len(kubectl("get", "jobs", "-l", selector, "-o", "name").split()) == 3, what="3 jobs")

    kubectl("patch", "jobset", "pretrain", "--type=merge", "-p", '{"spec":{"suspend":true}}')

    def suspended() -> list[str]:
        return kubectl("get", "jobs", "-l", selector, "-o", "jsonpath={.items[*].spec.suspend}").split()

    wait_for(lambda: suspended() == ["true"] * 3, what="the child Jobs suspended")
    assert kubectl("get", "jobsets", "pretrain", "-o", "jsonpath={.status.conditions[0].type}") == "Suspended"
    assert kubectl("get", "service", "pretrain", "-o", "jsonpath={.spec.clusterIP}") == "None"
