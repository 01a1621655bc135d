"""The devcluster's API server calls admission's mutating webhook over HTTP, as a real API server
does: a Job labelled `tessera.io/queue` is held at creation (suspended), with its
pods sent to Tessera's scheduler; an unlabelled one is created untouched. Read back through the
official client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from kubernetes import client as k8s

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.admission.entrypoints.webhook import MUTATE_PATH
from tessera.cluster.kube import api_client
from tessera.core.runner import create_app
from tessera.devcluster.runner import DevCluster
from tessera.testing.services import eventually, settings_for

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        yield dev.write_kubeconfig(tmp_path / "kubeconfig")


@contextlib.asynccontextmanager
async def serving(db: tuple[str, str]) -> AsyncIterator[str]:
    """Admission's app on a loopback port; yields its base URL."""
    settings = settings_for(AdmissionSettings, *db, auth="disabled")
    server = uvicorn.Server(uvicorn.Config(create_app(build(settings), settings), host="127.0.0.1", port=0))
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: _started(server), what="admission serving HTTP")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def _started(server: uvicorn.Server) -> bool:
    return server.started


def register(api: Any, url: str) -> None:
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "tessera-admission"},
        "webhooks": [
            {
                "name": "workloads.tessera.io",
                "clientConfig": {"url": url + MUTATE_PATH},
                "rules": [
                    {
                        "apiGroups": ["batch"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["jobs"],
                    },
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    },
                ],
                "objectSelector": {"matchExpressions": [{"key": "tessera.io/queue", "operator": "Exists"}]},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
        ],
    }
    k8s.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(config)


def job(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                },
            },
        },
    }


async def test_labelled_workloads_are_held_and_unlabelled_ones_untouched(
    admission_db: tuple[str, str], cluster: Path
) -> None:
    api = api_client(kubeconfig=str(cluster))
    batch, core = k8s.BatchV1Api(api), k8s.CoreV1Api(api)
    async with serving(admission_db) as url:
        await asyncio.to_thread(register, api, url)
        await asyncio.to_thread(
            batch.create_namespaced_job, "default", job("held", {"tessera.io/queue": "team-a"})
        )
        await asyncio.to_thread(batch.create_namespaced_job, "default", job("free", {"app": "x"}))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "server-0", "labels": {"tessera.io/queue": "serving"}},
            "spec": {"containers": [{"name": "main", "image": IMAGE}]},
        }
        gated = await asyncio.to_thread(core.create_namespaced_pod, "default", pod)
        assert [g.name for g in gated.spec.scheduling_gates] == ["tessera.io/admission"]
        assert gated.spec.scheduler_name == "tessera" and gated.metadata.labels["tessera.io/job-id"]

        held = await asyncio.to_thread(batch.read_namespaced_job, "held", "default")
        assert held.spec.suspend is True
        assert held.spec.template.spec.scheduler_name == "tessera"
        free = await asyncio.to_thread(batch.read_namespaced_job, "free", "default")
        assert not free.spec.suspend and free.spec.template.spec.scheduler_name != "tessera"
        held_pods = await asyncio.to_thread(
            core.list_namespaced_pod, "default", label_selector="job-name=held"
        )
        assert held_pods.items == [], "a suspended Job makes no pods"
