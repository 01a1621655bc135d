"""Kubernetes-native workloads under `tessera up`, driven with the real kubectl: the example Indexed
Job, labelled `tessera.io/queue`, is held by admission's webhook, admitted against its namespace's
queue, and its pods are bound all-or-nothing with the template's image until the Job succeeds; a
second copy over quota stays suspended and its job says why; deleting the first admits the second."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.harness import Stack, until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "k8s" / "ddp-indexed-job.yaml"
NS = "ml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]}],
    "tenant_queues": [{"tenant": NS, "queue": "team-a"}],
}


@pytest.fixture
def admission(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.env["TESSERA_ADMISSION_URL"], timeout=10) as client:
        yield client


def job_json(stack: Stack, name: str) -> dict[str, Any]:
    return dict(json.loads(stack.kubectl("get", "job", name, "-n", NS, "-o", "json")))


def tessera_job(stack: Stack, admission: httpx.Client, name: str) -> dict[str, Any]:
    job_id = job_json(stack, name)["metadata"]["labels"]["tessera.io/job-id"]
    return dict(admission.get(f"/v1/jobs/{job_id}").json())


def test_an_applied_indexed_job_is_queued_bound_and_succeeds(
    stack: Stack, admission: httpx.Client, tmp_path: Path
) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(yaml.safe_dump(QUEUES))
    applied = stack.tessera("queues", "apply", str(queues))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    stack.kubectl("create", "namespace", NS)
    second = yaml.safe_load(EXAMPLE.read_text())
    second["metadata"]["name"] = "ddp-llama-2"
    try:
        stack.kubectl("apply", "-f", str(EXAMPLE))
        # held by the webhook at creation (admission may already have released it: the second Job,
        # over quota, shows the hold below)
        assert "tessera.io/job-id" in job_json(stack, "ddp-llama")["metadata"]["labels"], (
            "taken in at creation"
        )
        stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(second))

        def pods(job: str) -> list[dict[str, Any]]:
            listed = json.loads(stack.kubectl("get", "pods", "-n", NS, "-l", f"job-name={job}", "-o", "json"))
            return list(listed["items"])

        bound = until(
            lambda: (
                (p := pods("ddp-llama")) and len(p) == 2 and all(x["spec"].get("nodeName") for x in p) and p
            ),
            "both pods of the first Job bound",
            90,
        )
        assert {p["spec"]["containers"][0]["image"] for p in bound} == {IMAGE}
        assert {p["spec"]["schedulerName"] for p in bound} == {"tessera"}

        # The second waits: suspended, no pods, and admission says why.
        waiting = until(
            lambda: (j := tessera_job(stack, admission, "ddp-llama-2")).get("waiting") and j,
            "the second Job's job to wait for quota",
            60,
        )
        assert waiting["state"] == "queued" and waiting["waiting"]["reason"] == "QuotaExhausted"
        assert job_json(stack, "ddp-llama-2")["spec"]["suspend"] is True and pods("ddp-llama-2") == []
        # kubectl describe answers "why is my job pending?": the QuotaReserved Event with the numbers.
        shown: list[str] = []

        def why() -> str | None:
            shown[:] = [stack.kubectl("describe", "job", "ddp-llama-2", "-n", NS)]
            return shown[0] if "QuotaExhausted" in shown[0] else None

        try:
            described = until(why, "kubectl describe to show why the second Job waits", 60)
        except AssertionError as timeout:
            raise AssertionError(
                f"{timeout}; kubectl describe printed:\n{shown[0] if shown else ''}"
            ) from None
        assert "Suspend:" in described and "free in quota" in described, described  # with the numbers

        until(
            lambda: any(
                c["type"] == "Complete" for c in job_json(stack, "ddp-llama")["status"].get("conditions", [])
            ),
            "the first Job to succeed (60 simulated seconds)",
            120,
        )
        # Deleting the first frees its quota: the second is admitted and runs.
        stack.kubectl("delete", "job", "ddp-llama", "-n", NS)
        until(lambda: job_json(stack, "ddp-llama-2")["spec"]["suspend"] is False, "the second admitted", 60)
        until(
            lambda: (p := pods("ddp-llama-2")) and all(x["spec"].get("nodeName") for x in p) and len(p) == 2,
            "the second Job's pods bound",
            90,
        )
    finally:
        for name in ("ddp-llama", "ddp-llama-2"):
            stack.kubectl("delete", "job", name, "-n", NS, "--ignore-not-found")
        until(
            lambda: all(
                j["state"] in ("succeeded", "failed", "cancelled")
                for j in admission.get("/v1/jobs", params={"tenant": NS}).json()
            ),
            "the jobs ended or cancelled",
            60,
        )
        for path in (f"tenant-queues/{NS}", "queues/team-a", "flavors/a100-80gb"):
            admission.delete(f"/v1/{path}")
