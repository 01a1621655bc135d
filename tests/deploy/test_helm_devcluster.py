"""The rendered chart, applied with the real `kubectl apply --server-side` to the devcluster's API server."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.devcluster.apiserver import ApiServer
from tests.deploy.chart import NAMESPACE, VALUE_SETS, render
from tests.e2e.harness import KUBECTL_HINT

pytestmark = pytest.mark.integration


class Kubectl:
    def __init__(self, path: str, kubeconfig: Path) -> None:
        self.path, self.kubeconfig = path, kubeconfig

    def __call__(self, *args: str) -> str:
        result = subprocess.run(
            [self.path, "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    def failing(self, *args: str) -> str:
        """The error of a command that must fail."""
        result = subprocess.run(
            [self.path, "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode != 0, f"kubectl {' '.join(args)} succeeded: {result.stdout}"
        return result.stderr


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[Kubectl]:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(KUBECTL_HINT)
    server = ApiServer()
    server.start()
    try:
        # objects without a namespace go to the release's, as `helm install -n tessera` puts them
        run = Kubectl(path, server.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE))
        run("create", "namespace", NAMESPACE)
        yield run
    finally:
        server.stop()


QUEUE = "tessera.io/queue"


def _job(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
                    ],
                }
            }
        },
    }


def _write(path: Path, objects: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return path


@pytest.mark.parametrize("name", ["evaluation", "default"])
def test_the_rendered_chart_is_accepted_and_its_crd_served(
    kubectl: Kubectl, tmp_path: Path, name: str
) -> None:
    chart = render(VALUE_SETS[name])
    crds, objects = (
        _write(tmp_path / "crds.yaml", chart.crds),
        _write(tmp_path / "objects.yaml", chart.objects),
    )

    # as helm does: the CRDs first, established before anything that may use them
    kubectl("apply", "--server-side", "-f", str(crds))
    for crd in ("podgroups.scheduling.x-k8s.io", "predictiveautoscalers.tessera.io"):
        kubectl("wait", "--for", "condition=established", "--timeout=30s", f"crd/{crd}")
    applied = kubectl("apply", "--server-side", "-f", str(objects)).splitlines()
    assert len(applied) == len(chart.objects)
    assert all(line.endswith(" serverside-applied") for line in applied), applied

    stored = json.loads(kubectl("get", "-f", str(objects), "-o", "json"))["items"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in stored) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in chart.objects
    )
    role = json.loads(kubectl("get", "clusterrole", "tessera-scheduler", "-o", "json"))
    assert role["rules"] == chart.get("ClusterRole", "tessera-scheduler")["rules"]
    # the scheduler creates no pods: its only Role is the Lease's, in the release's namespace
    lease_role = json.loads(
        kubectl("get", "role", "tessera-scheduler-release", "-n", NAMESPACE, "-o", "json")
    )
    assert lease_role["rules"] == chart.get("Role", "tessera-scheduler-release")["rules"]

    # admission's webhook is registered: labelled Jobs go to the Service over TLS with the chart's
    # CA, which the devcluster cannot reach (it calls URLs only), so Fail refuses them; an unlabelled
    # Job is never sent to it
    (stored,) = json.loads(kubectl("get", "mutatingwebhookconfiguration", "tessera-admission", "-o", "json"))[
        "webhooks"
    ]
    (rendered,) = chart.get("MutatingWebhookConfiguration", "tessera-admission")["webhooks"]
    assert stored["clientConfig"] == rendered["clientConfig"]
    assert [{k: v for k, v in rule.items() if k != "scope"} for rule in stored["rules"]] == rendered["rules"]
    kubectl("apply", "--server-side", "-f", str(_write(tmp_path / "free.yaml", [_job("free", {})])))
    refused = kubectl.failing(
        "apply", "--server-side", "-f", str(_write(tmp_path / "held.yaml", [_job("held", {QUEUE: "q"})]))
    )
    assert 'failed calling webhook "workloads.admission.tessera.io"' in refused
    assert f"service {NAMESPACE}/tessera-admission" in refused

    # applying again (an upgrade with nothing changed) is accepted as well
    assert len(kubectl("apply", "--server-side", "-f", str(objects)).splitlines()) == len(chart.objects)

    # the PodGroup CRD is served: a gang's PodGroup can be made and listed
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "trainer", "namespace": "default"},
        "spec": {"minMember": 2},
    }
    kubectl("apply", "--server-side", "-f", str(_write(tmp_path / "group.yaml", [group])))
    listed = kubectl("get", "podgroups", "-n", "default")
    assert listed.splitlines()[0].split()[:3] == ["NAME", "PHASE", "MINMEMBER"]
    assert listed.splitlines()[1].split()[:3] == ["trainer", "Pending", "2"]

    # and the PredictiveAutoscaler CRD: its printer columns are what `kubectl get` shows
    autoscaler = {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "PredictiveAutoscaler",
        "metadata": {"name": "llm", "namespace": "default"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 8,
            "metric": {"type": "events", "events": {"name": "qps"}},
            "target": 10,
            "mode": "Preview",
            "via": "hpa",
        },
    }
    kubectl("apply", "--server-side", "-f", str(_write(tmp_path / "pa.yaml", [autoscaler])))
    listed = kubectl("get", "predictiveautoscalers", "-n", "default").splitlines()
    assert listed[0].split()[:4] == ["NAME", "TARGET", "MODE", "VIA"]
    assert listed[1].split()[:4] == ["llm", "llm", "Preview", "hpa"]
