"""A user's labelled JobSet as one Tessera job: its replicated jobs are its pod groups of
`replicas x parallelism` pods, all needed; a JobSet's child Job is not a job of its own; admitted, each
replicated job's pods go to its pod group's flavor."""

from __future__ import annotations

from typing import Any

from tessera.admission.domain.flavor_placement import FlavorPlacement, jobset_placed
from tessera.admission.domain.native import KubePriorities, native_job
from tessera.admission.domain.native_jobsets import native_jobset
from tessera.contracts.jobs import JobSpec

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def rjob(name: str, replicas: int, parallelism: int, gpus: int) -> dict[str, Any]:
    container = {"name": name, "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": parallelism,
                "template": {"spec": {"priorityClassName": "high", "containers": [container]}},
            }
        },
    }


def jobset(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml", "labels": labels},
        "spec": {"replicatedJobs": [rjob("driver", 1, 1, 1), rjob("workers", 2, 2, 4)]},
    }


def test_a_jobset_is_one_job_whose_pod_groups_are_its_replicated_jobs() -> None:
    found = native_jobset(
        jobset({"tessera.io/queue": "team-a", "tessera.io/job-id": "j-1"}), KubePriorities({"high": 50})
    )
    assert found is not None and (found.job_id, found.namespace, found.name) == ("j-1", "ml", "train")
    spec = JobSpec.model_validate(found.spec)
    assert (spec.tenant, spec.queue, spec.priority) == ("ml", "team-a", 50)
    groups = [(g.name, g.replicas, g.min_available) for g in spec.pod_groups]
    assert groups == [("driver", 1, 1), ("workers", 4, 4)]


def test_a_jobset_the_webhook_did_not_hold_is_not_adopted() -> None:
    assert native_jobset(jobset({"tessera.io/queue": "team-a"})) is None


def test_a_child_job_of_a_jobset_is_not_a_job_of_its_own() -> None:
    child = {
        "metadata": {
            "name": "train-workers-0",
            "namespace": "ml",
            "labels": {"tessera.io/queue": "team-a", "tessera.io/job-id": "j-1"},
            "ownerReferences": [{"kind": "JobSet", "name": "train"}],
        },
        "spec": rjob("workers", 1, 2, 4)["template"]["spec"],
    }
    assert native_job(child) is None


def test_admitted_each_replicated_job_goes_to_its_flavor_and_the_rest_is_kept() -> None:
    rjobs = jobset({})["spec"]["replicatedJobs"]
    placements = [FlavorPlacement("a"), FlavorPlacement("b", {"pool": "b"}, ({"key": "spot"},))]
    placed = jobset_placed(rjobs, placements)
    assert placed[0] == rjobs[0]
    pods = placed[1]["template"]["spec"]["template"]["spec"]
    assert pods["nodeSelector"] == {"pool": "b"} and pods["tolerations"] == [{"key": "spot"}]
    assert pods["containers"] == rjobs[1]["template"]["spec"]["template"]["spec"]["containers"]
    assert placed[1]["template"]["metadata"]["annotations"]["tessera.io/flavor"] == "b"
    assert jobset_placed(rjobs, [FlavorPlacement("a"), FlavorPlacement("b")]) == []
