"""The mutating webhook holds labelled workloads (Kueue's model) and leaves the rest alone."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tessera.admission.domain.webhook import Mutation, mutate, review_response
from tessera.devcluster.apiserver.patching import json_patch

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def job(labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "labels": labels or {}, **meta},
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": IMAGE}]}}},
    }


def test_a_labelled_job_is_suspended_and_its_pods_go_to_tessera() -> None:
    mutation = mutate("Job", job({"tessera.io/queue": "team-a"}))
    assert mutation.patch == [
        {"op": "add", "path": "/spec/suspend", "value": True},
        {"op": "add", "path": "/spec/template/spec/schedulerName", "value": "tessera"},
    ]
    assert mutation.reason == "suspended for queue team-a"


def test_an_unlabelled_workload_is_untouched() -> None:
    assert mutate("Job", job()).patch == []
    assert mutate("Pod", {"metadata": {"name": "p"}, "spec": {}}).patch == []


def jobset() -> dict[str, Any]:
    worker = {
        "spec": {"containers": [{"name": "w", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}]}
    }
    return {
        "metadata": {"name": "train", "labels": {"tessera.io/queue": "team-a"}},
        "spec": {
            "replicatedJobs": [
                {"name": "driver", "template": {"spec": {"template": {"spec": dict(worker["spec"])}}}},
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {
                        "metadata": {"labels": {"app": "w"}},
                        "spec": {
                            "parallelism": 2,
                            "template": {"metadata": {}, "spec": dict(worker["spec"])},
                        },
                    },
                },
            ]
        },
    }


def test_a_labelled_jobset_is_suspended_and_its_pods_made_one_gang() -> None:
    mutation = mutate("JobSet", jobset(), "j-1")
    held = json_patch(jobset(), mutation.patch)
    assert held["spec"]["suspend"] is True and held["metadata"]["labels"]["tessera.io/job-id"] == "j-1"
    for rjob in held["spec"]["replicatedJobs"]:
        assert rjob["template"]["metadata"]["labels"]["tessera.io/job-id"] == "j-1"
        pods = rjob["template"]["spec"]["template"]
        assert pods["spec"]["schedulerName"] == "tessera"
        assert pods["metadata"]["labels"] == {
            "tessera.io/job-id": "j-1",
            "tessera.io/pod-group-name": rjob["name"],
        }
    assert held["spec"]["replicatedJobs"][1]["template"]["metadata"]["labels"]["app"] == "w"
    assert mutation.reason == "suspended for queue team-a"


def test_a_refusal_is_an_admission_review_that_disallows_with_the_message() -> None:
    mutation = Mutation(reason="refused", denied="no such thing")
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-2"}}
    response = review_response(review, mutation)["response"]
    assert response["allowed"] is False and response["status"]["message"] == "no such thing"
    assert "patch" not in response


def test_the_pods_of_a_held_job_are_left_to_the_job() -> None:
    of_a_job = {
        "metadata": {
            "labels": {"tessera.io/queue": "team-a"},
            "ownerReferences": [{"kind": "Job", "name": "j"}],
        },
        "spec": {"containers": []},
    }
    assert mutate("Pod", of_a_job).patch == [] and not mutate("Pod", of_a_job).denied


def test_the_review_answers_with_the_request_s_uid_and_a_base64_jsonpatch() -> None:
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-1"}}
    mutation = mutate("Job", job({"tessera.io/queue": "team-a"}))
    answer = review_response(review, mutation)
    response = answer["response"]
    assert (answer["kind"], response["uid"], response["allowed"], response["patchType"]) == (
        "AdmissionReview",
        "u-1",
        True,
        "JSONPatch",
    )
    assert json.loads(base64.b64decode(response["patch"])) == mutation.patch
    assert "patch" not in review_response(review, mutate("Job", job()))["response"]


def test_a_labelled_job_and_its_pods_get_the_id_of_the_tessera_job_it_becomes() -> None:
    patch = mutate("Job", job({"tessera.io/queue": "team-a"}), "j-1").patch
    assert patch[2:] == [
        {"op": "add", "path": "/metadata/labels/tessera.io~1job-id", "value": "j-1"},
        {
            "op": "add",
            "path": "/spec/template/metadata",
            "value": {"labels": {"tessera.io/job-id": "j-1", "tessera.io/pod-group-name": "pods"}},
        },
    ]


@pytest.mark.parametrize(
    "owners", [[], [{"kind": "ReplicaSet", "name": "web-5d8f"}], [{"kind": "StatefulSet"}]]
)
def test_a_labelled_pod_is_gated_for_admission_as_a_job_of_its_own(owners: list[dict[str, str]]) -> None:
    pod = {
        "metadata": {"name": "web-1", "labels": {"tessera.io/queue": "serving"}, "ownerReferences": owners},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
    }
    mutation = mutate("Pod", pod, "j-7")
    assert mutation.reason == "gated for queue serving" and not mutation.denied
    assert mutation.patch == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "tessera.io/admission"}]},
        {"op": "add", "path": "/spec/schedulerName", "value": "tessera"},
        {"op": "add", "path": "/metadata/labels/tessera.io~1job-id", "value": "j-7"},
        {"op": "add", "path": "/metadata/labels/tessera.io~1pod-group-name", "value": "pods"},
    ]


def test_a_pod_s_own_scheduling_gates_are_kept_and_ours_added_once() -> None:
    spec: dict[str, Any] = {"containers": [], "schedulingGates": [{"name": "example.com/quota"}]}
    pod = {"metadata": {"labels": {"tessera.io/queue": "serving"}}, "spec": spec}
    (gate, *_) = mutate("Pod", pod).patch
    assert gate == {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "tessera.io/admission"}}
    spec["schedulingGates"].append({"name": "tessera.io/admission"})
    assert [p["path"] for p in mutate("Pod", pod).patch] == ["/spec/schedulerName"]
