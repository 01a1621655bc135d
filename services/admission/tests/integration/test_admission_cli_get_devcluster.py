"""`tessera jobs get` against the real admission app (Postgres and NATS behind it) with the devcluster
configured: a job over quota prints why it waits, with the numbers, and the Indexed Job and Service
admission made for it, named as the API server holds them (read through the official client)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from starlette.testclient import TestClient
from typer.testing import CliRunner

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.cli import jobs
from tessera.cli.main import app
from tessera.cluster.kube import api_client
from tessera.core.runner import create_app
from tessera.devcluster.runner import DevCluster
from tessera.testing.services import settings_for

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 4}}]}],
    "tenant_queues": [{"tenant": "research", "queue": "team-a"}],
}
JOB = """\
name: {name}
tenant: research
pod_groups:
  - name: worker
    replicas: 1
    gpu: {{count: 4, models: [A100-80GB]}}
    template:
      spec:
        containers: [{{name: trainer, image: "{image}", command: [torchrun, train.py]}}]
"""
T = TypeVar("T")


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0) as dev:
        yield dev.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def admission(
    admission_db: tuple[str, str], kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestClient]:
    settings = settings_for(
        AdmissionSettings, *admission_db, cycle_interval_s=0.05, auth="disabled", kubeconfig=kubeconfig
    )
    with TestClient(create_app(build(settings), settings), base_url="http://admission") as client:

        @contextmanager
        def shared(api: str | None, handled: frozenset[int] = frozenset()) -> Iterator[Any]:
            yield client

        monkeypatch.setattr(jobs, "_client", shared)
        yield client


def until(probe: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while (found := probe()) is None or found is False:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def submit(runner: CliRunner, tmp_path: Path, name: str) -> str:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(JOB.format(name=name, image=IMAGE))
    submitted = runner.invoke(app, ["jobs", "submit", str(spec)])
    assert submitted.exit_code == 0, submitted.output
    return submitted.output.strip()


def test_jobs_get_shows_why_a_job_waits_and_its_kubernetes_objects(
    admission: TestClient, kubeconfig: Path, tmp_path: Path
) -> None:
    assert admission.put("/v1/config", json=QUEUES).status_code == 200
    runner = CliRunner()
    first = submit(runner, tmp_path, "first")
    until(lambda: admission.get(f"/v1/jobs/{first}").json()["state"] == "admitted", what="first admitted")
    second = submit(runner, tmp_path, "second")

    def waiting() -> dict[str, Any] | None:
        found: dict[str, Any] | None = admission.get(f"/v1/jobs/{second}").json()["waiting"]
        return found if found and found["reason"] == "QuotaExhausted" else None

    until(waiting, what="second waits for quota")
    until(lambda: admission.get(f"/v1/jobs/{second}").json()["kubernetes"], what="second's objects made")

    api = api_client(kubeconfig=str(kubeconfig))
    selector = f"tessera.io/job-id={second}"
    made: Any
    service: Any
    (made,) = k8s.BatchV1Api(api).list_namespaced_job("default", label_selector=selector).items
    (service,) = k8s.CoreV1Api(api).list_namespaced_service("default", label_selector=selector).items
    assert made.spec.completion_mode == "Indexed" and made.spec.suspend is True

    shown = runner.invoke(app, ["jobs", "get", second], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].startswith(f"second ({second}) tenant=research queue=team-a state=queued"), lines[0]
    assert (
        "waiting: QuotaExhausted: queue team-a: needs 4 A100-80GB GPUs, 0 free in quota, "
        "no cohort to borrow from; no preemptible victims"
    ) in lines, shown.output
    # the title wraps to the table's width: compare it with the whitespace collapsed
    assert "Kubernetes objects in default: suspended" in " ".join(shown.output.split())
    rows = {tuple(c.strip() for c in line.split("│")[1:-1]) for line in lines if line.count("│") == 3}
    assert {("Job", made.metadata.name), ("Service", service.metadata.name)} <= rows, shown.output
