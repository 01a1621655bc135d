"""A user's labelled Job as a Tessera job: the namespace is the tenant, the label the queue, the
template its one pod group of `parallelism` pods; a user's rejected Job stays suspended."""

from __future__ import annotations

from typing import Any

from tessera.admission.domain.model import JobState
from tessera.admission.domain.native import KubePriorities, native_job
from tessera.admission.domain.workload_sync import Applied, Owner, desired
from tessera.contracts.jobs import JobSpec

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def manifest(labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml", "labels": labels},
        "spec": {
            "parallelism": 4,
            "template": {
                "metadata": {"labels": {"tessera.io/job-id": "j-1"}},
                "spec": {
                    "priorityClassName": "research-high",
                    "containers": [
                        {"name": "m", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "2"}}}
                    ],
                },
            },
            **spec,
        },
    }


def test_a_labelled_job_maps_to_a_job_of_its_namespace_and_queue() -> None:
    found = native_job(manifest({"tessera.io/queue": "team-a", "tessera.io/job-id": "j-1"}))
    assert found is not None
    assert (found.job_id, found.namespace, found.name) == ("j-1", "ml", "train")
    spec = JobSpec.model_validate(found.spec)
    assert (spec.tenant, spec.queue, spec.priority_class) == ("ml", "team-a", "research-high")
    (group,) = spec.pod_groups
    assert (group.replicas, group.quorum) == (4, 4)
    assert group.gpu is not None and group.gpu.count == 2


def test_its_priority_is_the_value_of_the_kubernetes_priority_class_its_template_names() -> None:
    labels = {"tessera.io/queue": "team-a", "tessera.io/job-id": "j-1"}
    cluster = KubePriorities.of(
        [
            {"metadata": {"name": "research-high"}, "value": 5000},
            {"metadata": {"name": "everyday"}, "value": 10, "globalDefault": True},
        ]
    )
    named = native_job(manifest(labels), cluster)
    assert named is not None
    spec = JobSpec.model_validate(named.spec)
    assert (spec.priority, spec.priority_class) == (5000, None)
    unnamed = manifest(labels)
    del unnamed["spec"]["template"]["spec"]["priorityClassName"]
    by_default = native_job(unnamed, cluster)
    assert by_default is not None and JobSpec.model_validate(by_default.spec).priority == 10, "globalDefault"
    unknown = native_job(manifest(labels), KubePriorities())
    assert unknown is not None
    assert JobSpec.model_validate(unknown.spec).priority_class == "research-high", "one of Tessera's, if any"


def test_a_job_the_webhook_did_not_hold_is_not_adopted() -> None:
    assert native_job(manifest({"tessera.io/queue": "team-a"})) is None
    assert native_job(manifest({"tessera.io/job-id": "j-1"})) is None


def test_a_user_s_rejected_or_cancelled_job_stays_suspended_ours_are_deleted() -> None:
    for state in (JobState.REJECTED, JobState.CANCELLED):
        assert desired(state, Owner.USER) is Applied.SUSPENDED
        assert desired(state, Owner.TESSERA) is Applied.DELETED
