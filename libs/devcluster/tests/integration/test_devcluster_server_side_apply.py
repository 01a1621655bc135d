"""`kubectl apply --server-side` against the emulated API server, and CRDs that start being served."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tessera.devcluster.apiserver import ApiServer

pytestmark = pytest.mark.integration

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def run(kubectl_path: str, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_path, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
    )


def test_a_crd_applied_server_side_serves_its_resource(
    apiserver: ApiServer, kubectl_path: str, tmp_path: Path
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    (tmp_path / "widget.yaml").write_text(yaml.safe_dump(widget))
    assert run(kubectl_path, kubeconfig, "get", "widgets").returncode != 0  # not served yet

    (tmp_path / "crd.yaml").write_text(yaml.safe_dump(WIDGET_CRD))
    applied = run(kubectl_path, kubeconfig, "apply", "--server-side", "-f", str(tmp_path / "crd.yaml"))
    assert applied.returncode == 0, applied.stderr
    established = run(
        kubectl_path, kubeconfig, "wait", "--for", "condition=established", "crd/widgets.example.com"
    )
    assert established.returncode == 0, established.stderr

    created = run(kubectl_path, kubeconfig, "apply", "--server-side", "-f", str(tmp_path / "widget.yaml"))
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "widget.example.com/w1 serverside-applied"
    listed = run(kubectl_path, kubeconfig, "get", "wd", "-o", "json")
    assert [item["spec"] for item in json.loads(listed.stdout)["items"]] == [{"size": 3}]


def test_apply_server_side_updates_what_the_configuration_changes(
    apiserver: ApiServer, kubectl_path: str, tmp_path: Path
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default", "labels": {"a": "1"}},
        "data": {"mode": "fast"},
    }
    path = tmp_path / "cm.yaml"
    for mode in ("fast", "careful"):
        config["data"] = {"mode": mode}
        path.write_text(yaml.safe_dump(config))
        applied = run(kubectl_path, kubeconfig, "apply", "--server-side", "-f", str(path))
        assert applied.returncode == 0, applied.stderr
    stored = json.loads(run(kubectl_path, kubeconfig, "get", "cm", "settings", "-o", "json").stdout)
    assert stored["data"] == {"mode": "careful"} and stored["metadata"]["labels"] == {"a": "1"}
