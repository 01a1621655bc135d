"""`kubectl get jobset -o yaml` answers "why is my JobSet pending?" as `kubectl describe job` does for
a Job: admission writes QuotaReserved, Admitted and Inadmissible into a labelled JobSet's
`status.conditions` (through its status subresource, the JobSet controller's own kept) with the
numbers, and a changed QuotaReserved is an Event on the JobSet. A JobSet whose pods require GPUs no
flavor of its queue has (their required node affinity) is Inadmissible, naming the affinity, and stays
suspended. All through the official client against the devcluster."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s

from tessera.admission.entrypoints.webhook import webhook_configuration
from tessera.cluster.kube import api_client
from tessera.testing.services import eventually

from .test_admission_job_conditions_devcluster import _contains
from .test_admission_native_jobs_devcluster import kubeconfig, serving

pytestmark = pytest.mark.integration

__all__ = ["kubeconfig"]  # the fixture: a devcluster of 4 nodes of 8 A100-80GB GPUs

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "k8s" / "jobset-driver-workers.yaml"
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
NS = "ml"
QUEUES = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]}],
    "tenant_queues": [{"tenant": NS, "queue": "team-a"}],
}
H100_ONLY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
                ]
            }
        ]
    }
}


def jobset(name: str, node_affinity: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example JobSet (a driver and two workers, 2 GPUs each: 6 GPUs), named ``name``."""
    found: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    made = copy.deepcopy(found)
    made["metadata"]["name"] = name
    if node_affinity is not None:
        for rjob in made["spec"]["replicatedJobs"]:
            rjob["template"]["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": node_affinity}
    return made


async def test_a_jobsets_conditions_and_events_say_why_it_waits_and_when_it_never_can(
    admission_db: tuple[str, str], kubeconfig: Path
) -> None:
    api = api_client(kubeconfig=str(kubeconfig))
    custom: Any = k8s.CustomObjectsApi(api)
    core: Any = k8s.CoreV1Api(api)
    await asyncio.to_thread(core.create_namespace, {"metadata": {"name": NS}})

    async def read(name: str) -> dict[str, Any]:
        found = await asyncio.to_thread(custom.get_namespaced_custom_object, *JOBSET, NS, "jobsets", name)
        return dict(found)

    async def conditions(name: str) -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in ((await read(name)).get("status") or {}).get("conditions") or []}

    async def events(name: str) -> list[tuple[str, str, str]]:
        """The JobSet's Events as `kubectl describe jobset` finds them: by the object's name and uid."""
        uid = (await read(name))["metadata"]["uid"]
        selector = f"involvedObject.kind=JobSet,involvedObject.name={name},involvedObject.uid={uid}"
        listed = await asyncio.to_thread(core.list_namespaced_event, NS, field_selector=selector)
        return [(e.type, e.reason, e.message) for e in listed.items]

    def status(name: str, kind: str, want: str, reason: str | None = None) -> Any:
        async def probe() -> dict[str, dict[str, Any]] | None:
            found = await conditions(name)
            cond = found.get(kind)
            ok = cond is not None and cond["status"] == want and reason in (None, cond["reason"])
            return found if ok else None

        return probe

    async with serving(admission_db, kubeconfig) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.put("/v1/config", json=QUEUES)).status_code == 200
        admission_api = k8s.AdmissionregistrationV1Api(api)
        await asyncio.to_thread(
            admission_api.create_mutating_webhook_configuration, webhook_configuration(url)
        )

        await asyncio.to_thread(
            custom.create_namespaced_custom_object, *JOBSET, NS, "jobsets", jobset("first")
        )
        first = await eventually(
            status("first", "Admitted", "True"), what="first's Admitted condition", timeout=30
        )
        assert (first["QuotaReserved"]["status"], first["QuotaReserved"]["message"]) == (
            "True",
            "queue team-a: quota reserved in flavor a100-80gb",
        )
        assert first["Inadmissible"]["status"] == "False"
        assert all("lastProbeTime" not in c for c in first.values()), "metav1.Conditions have no probe time"

        async def released() -> bool:  # the workload sync may unsuspend it after the condition is written
            return (await read("first"))["spec"]["suspend"] is False

        await eventually(released, what="first unsuspended", timeout=30)

        # Over quota (6 GPUs, 2 left): QuotaReserved False with the numbers, and an Event.
        await asyncio.to_thread(
            custom.create_namespaced_custom_object, *JOBSET, NS, "jobsets", jobset("second")
        )
        second = await eventually(
            status("second", "QuotaReserved", "False", "QuotaExhausted"),
            what="second's QuotaReserved=False",
            timeout=30,
        )
        why = second["QuotaReserved"]["message"]
        assert why.startswith("queue team-a: needs 6 A100-80GB GPUs, 2 free in quota"), why
        assert second["Inadmissible"]["status"] == "False", "quota may free up: not inadmissible"
        assert second["Suspended"]["status"] == "True", "the JobSet controller's own condition is kept"
        await eventually(  # the Event is written just after the condition
            lambda: _contains(events("second"), ("Normal", "QuotaExhausted", why)),
            what="second's QuotaExhausted Event",
            timeout=30,
        )
        assert (await read("second"))["spec"]["suspend"] is True

        # Pods that require H100s, in a queue of A100s: Inadmissible, naming the affinity, and held.
        await asyncio.to_thread(
            custom.create_namespaced_custom_object, *JOBSET, NS, "jobsets", jobset("h100s", H100_ONLY)
        )
        never = await eventually(
            status("h100s", "Inadmissible", "True"), what="the H100 JobSet Inadmissible", timeout=30
        )
        assert never["Inadmissible"]["reason"] == "NoMatchingFlavor"
        assert never["Inadmissible"]["message"] == (
            "queue team-a: no flavor (a100-80gb) matches the pods' required node affinity of pod group "
            "driver: nvidia.com/gpu.product In [NVIDIA-H100-80GB-HBM3]"
        )
        assert never["QuotaReserved"]["status"] == "False"
        assert (await read("h100s"))["spec"]["suspend"] is True
        # The JobSet ahead of it in the queue still waits for quota, not for it.
        assert (await conditions("second"))["QuotaReserved"]["reason"] == "QuotaExhausted"
