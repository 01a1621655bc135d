"""A job as Kubernetes objects: Indexed Jobs that the API server takes, and the env of distributed
training (MASTER_ADDR at the first group's index 0, WORLD_SIZE, RANK from the completion index)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tessera.admission.domain.kube_objects import base_name, job_objects
from tessera.admission.domain.model import JobState
from tessera.admission.domain.workload_sync import Applied, desired
from tessera.contracts.jobs import JobSpec

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def spec(**changes: Any) -> JobSpec:
    raw: dict[str, Any] = {
        "name": "llama",
        "tenant": "research",
        "estimated_duration_s": 60,
        "pod_groups": [
            {
                "name": "worker",
                "replicas": 4,
                "gpu": {"count": 8},
                "template": {
                    "metadata": {"labels": {"app": "llama"}},
                    "spec": {
                        "containers": [
                            {"name": "trainer", "image": IMAGE, "env": [{"name": "RANK", "value": "stale"}]}
                        ]
                    },
                },
            }
        ],
    }
    raw.update(changes)
    return JobSpec.model_validate(raw)


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_each_pod_group_is_a_suspended_indexed_job_the_api_server_takes() -> None:
    objects = job_objects("0f3c9a1e-77", spec(), "ml")
    (job,) = objects.jobs
    for manifest in (job, objects.service):
        kubernetes_validate.validate(manifest, "1.31", strict=True)
    assert job["metadata"]["name"] == "llama-0f3c9a1e-worker"
    assert {k: job["spec"][k] for k in ("suspend", "completionMode", "parallelism", "completions")} == {
        "suspend": True,
        "completionMode": "Indexed",
        "parallelism": 4,
        "completions": 4,
    }
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"] == {
        "app": "llama",
        "tessera.io/job-id": "0f3c9a1e-77",
        "tessera.io/pod-group-name": "worker",
    }
    assert pod["metadata"]["annotations"]["tessera.io/sim-duration"] == "60"
    assert pod["spec"]["schedulerName"] == "tessera"
    assert pod["spec"]["subdomain"] == objects.service["metadata"]["name"] == "llama-0f3c9a1e"
    assert pod["spec"]["containers"][0]["image"] == IMAGE
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert objects.service["spec"]["clusterIP"] == "None"
    assert [(r.kind, r.name) for r in objects.refs] == [
        ("Service", "llama-0f3c9a1e"),
        ("Job", "llama-0f3c9a1e-worker"),
    ]


def test_the_env_of_distributed_training() -> None:
    two_groups = spec(
        pod_groups=[
            {
                "name": "driver",
                "replicas": 1,
                "template": {"spec": {"containers": [{"name": "d", "image": IMAGE}]}},
            },
            {
                "name": "worker",
                "replicas": 3,
                "template": {"spec": {"containers": [{"name": "w", "image": IMAGE}]}},
            },
        ]
    )
    driver, worker = job_objects("abc", two_groups, "ml").jobs
    for job, offset in ((driver, "0"), (worker, "1")):
        env = env_of(job)
        assert env["MASTER_ADDR"] == "llama-abc-driver-0.llama-abc.ml.svc"
        assert env["MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == "4"
        assert env["TESSERA_JOB_ID"] == "abc"
        assert env["TESSERA_RANK_OFFSET"] == offset
        assert env["RANK"] == {
            "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
        }


def test_the_conventions_replace_a_variable_the_template_sets() -> None:
    (job,) = job_objects("abc", spec(), "ml").jobs
    names = [item["name"] for item in job["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names.count("RANK") == 1


def test_a_checkpointable_job_s_pods_are_annotated_for_its_trainer() -> None:
    (job,) = job_objects(
        "abc", spec(checkpointable=True, labels={"tessera.io/sim-state-bytes": "4096"}), "ml"
    ).jobs
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["tessera.io/checkpointable"] == "true"
    assert annotations["tessera.io/sim-state-bytes"] == "4096"


def test_names_stay_dns_labels_for_long_jobs() -> None:
    long = spec(name="a" * 63, pod_groups=[{**spec().pod_groups[0].model_dump(), "name": "w" * 40}])
    (job,) = job_objects("0f3c9a1e", long, "ml").jobs
    hostname = f"{job['metadata']['name']}-1023"
    assert len(hostname) <= 63 and len(base_name("0f3c9a1e", long)) <= 40


def test_a_group_without_a_template_cannot_run() -> None:
    bare = JobSpec.model_validate({"name": "x", "tenant": "t", "pod_groups": [{"name": "w", "replicas": 1}]})
    with pytest.raises(ValueError, match="pod group 'w' has no template"):
        job_objects("abc", bare, "ml")


@pytest.mark.parametrize(
    ("state", "want"),
    [
        (JobState.QUEUED, Applied.SUSPENDED),
        (JobState.PREEMPTED, Applied.SUSPENDED),
        (JobState.ADMITTED, Applied.RUNNING),
        (JobState.PLACED, Applied.RUNNING),
        (JobState.RUNNING, Applied.RUNNING),
        (JobState.CANCELLED, Applied.DELETED),
        (JobState.REJECTED, Applied.DELETED),
        (JobState.SUCCEEDED, None),
        (JobState.FAILED, None),
    ],
)
def test_what_each_state_wants_of_the_objects(state: JobState, want: Applied | None) -> None:
    assert desired(state) is want
