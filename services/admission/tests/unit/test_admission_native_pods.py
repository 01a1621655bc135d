"""A user's gated Pod as a Tessera job of one pod: the namespace is the tenant, the label the queue,
its fractional GPU read from the pod; a pod a Job owns, or one the webhook never saw, is not one."""

from __future__ import annotations

from typing import Any

from tessera.admission.domain.native import KubePriorities
from tessera.admission.domain.native_pods import gated, native_pod, without_gate
from tessera.contracts.jobs import JobSpec

IMAGE = "vllm/vllm-openai:v0.6.4"


def pod(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "serve-7f9c-x2k4q",
            "namespace": "ml",
            "labels": {"tessera.io/queue": "team-a", "tessera.io/job-id": "j-9", "app": "serve"},
            "annotations": {"tessera.io/gpu-milli": "500"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "serve-7f9c"}],
            **meta,
        },
        "spec": {
            "schedulerName": "tessera",
            "schedulingGates": [{"name": "tessera.io/admission"}],
            "priorityClassName": "serving",
            "containers": [
                {"name": "vllm", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
        "status": {"phase": "Pending"},
    }


def test_a_gated_pod_is_a_job_of_one_pod_in_its_namespace_and_queue() -> None:
    found = native_pod(pod(), KubePriorities.of([{"metadata": {"name": "serving"}, "value": 900}]))
    assert found is not None
    assert (found.job_id, found.namespace, found.name) == ("j-9", "ml", "serve-7f9c-x2k4q")
    spec = JobSpec.model_validate(found.spec)
    assert (spec.tenant, spec.queue, spec.priority) == ("ml", "team-a", 900)
    assert spec.labels == {"kubernetes.io/pod": "ml/serve-7f9c-x2k4q"}
    (group,) = spec.pod_groups
    assert (group.replicas, group.quorum) == (1, 1)
    assert group.gpu is not None and group.gpu.milli == 500
    template = group.template or {}
    assert "schedulingGates" not in template["spec"] and template["metadata"]["labels"]["app"] == "serve"


def test_a_tenant_label_on_the_pod_does_not_choose_its_tenant() -> None:
    sneaky = pod()
    sneaky["metadata"]["labels"]["tessera.io/tenant"] = "someone-else"
    found = native_pod(sneaky)
    assert found is not None and JobSpec.model_validate(found.spec).tenant == "ml"


def test_pods_that_are_not_jobs_of_their_own() -> None:
    of_a_job = pod(ownerReferences=[{"kind": "Job", "name": "train"}])
    assert native_pod(of_a_job) is None
    never_seen = pod()
    del never_seen["metadata"]["labels"]["tessera.io/job-id"]
    assert native_pod(never_seen) is None


def test_only_admission_s_gate_is_removed() -> None:
    gates = [{"name": "example.com/quota"}, {"name": "tessera.io/admission"}]
    assert gated({"spec": {"schedulingGates": gates}})
    assert without_gate(gates) == [{"name": "example.com/quota"}]
    assert not gated({"spec": {"schedulingGates": without_gate(gates)}}) and not gated({"spec": {}})
