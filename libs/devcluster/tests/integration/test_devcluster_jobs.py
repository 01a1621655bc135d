"""The Job controller, through the official client over HTTP: Indexed Jobs that complete, suspend
and resume, fail past their backoffLimit, and whose pods are collected when the Job is deleted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION
from tessera.devcluster.testing import api_client, binding_scheduler, conditions, start_cluster, wait_for

pytestmark = pytest.mark.integration

INDEX = "batch.kubernetes.io/job-completion-index"
NS = "default"


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running = start_cluster()
    yield running
    running.stop()


@pytest.fixture
def api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    with api_client(cluster) as api:
        yield api


def indexed_job(
    name: str,
    completions: int,
    *,
    suspend: bool = False,
    annotations: dict[str, str] | None = None,
    backoff_limit: int = 6,
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "completionMode": "Indexed",
            "suspend": suspend,
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": {"team": "a"}, "annotations": annotations or {}},
                "spec": {
                    "schedulerName": "tessera",
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "trainer", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
                    ],
                },
            },
        },
    }


def job_pods(core: client.CoreV1Api, job: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={job}").items)


def test_an_indexed_job_runs_one_pod_per_index_and_completes(api: client.ApiClient) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(NS, indexed_job("ddp", 3, annotations={SIM_DURATION_ANNOTATION: "2s"}))

    pods = wait_for(lambda: len(job_pods(core, "ddp")) == 3 and job_pods(core, "ddp"), what="3 pods")
    by_index = {int(p.metadata.annotations[INDEX]): p for p in pods}
    assert sorted(by_index) == [0, 1, 2]
    for index, pod in by_index.items():
        assert pod.metadata.name.startswith(f"ddp-{index}-")
        assert pod.metadata.labels[INDEX] == str(index) and pod.metadata.labels["team"] == "a"
        assert pod.spec.hostname == f"ddp-{index}"
        assert pod.spec.scheduler_name == "tessera"
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["JOB_COMPLETION_INDEX"].value_from.field_ref.field_path == (
            f"metadata.annotations['{INDEX}']"
        )
        (owner,) = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == ("Job", "ddp", True)
    assert wait_for(lambda: batch.read_namespaced_job("ddp", NS).status.active == 3, what="3 active")

    with binding_scheduler(api):
        job = wait_for(
            lambda: (j := batch.read_namespaced_job("ddp", NS)).status.succeeded == 3 and j,
            what="3 succeeded",
        )
    assert conditions(job)["Complete"] == ("True", "CompletionsReached")
    assert job.status.completed_indexes == "0-2" and job.status.failed == 0
    assert job.status.active == 0
    assert job.status.start_time is not None and job.status.completion_time is not None
    reasons = [
        e.reason for e in core.list_namespaced_event(NS, field_selector="involvedObject.name=ddp").items
    ]
    assert reasons.count("SuccessfulCreate") == 3 and "Completed" in reasons


def test_a_suspended_job_makes_no_pods_resumes_and_suspending_again_deletes_its_pods(
    api: client.ApiClient,
) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(NS, indexed_job("held", 2, suspend=True))

    job = wait_for(lambda: "Suspended" in conditions(j := batch.read_namespaced_job("held", NS)) and j)
    assert conditions(job)["Suspended"] == ("True", "JobSuspended")
    assert job_pods(core, "held") == [] and job.status.start_time is None

    batch.patch_namespaced_job("held", NS, {"spec": {"suspend": False}})
    with binding_scheduler(api):
        job = wait_for(lambda: (j := batch.read_namespaced_job("held", NS)).status.ready == 2 and j)
    assert conditions(job)["Suspended"] == ("False", "JobResumed")
    assert job.status.start_time is not None
    assert {p.status.phase for p in job_pods(core, "held")} == {"Running"}

    batch.patch_namespaced_job("held", NS, {"spec": {"suspend": True}})
    job = wait_for(
        lambda: conditions(j := batch.read_namespaced_job("held", NS))["Suspended"][0] == "True" and j
    )
    wait_for(lambda: job_pods(core, "held") == [], what="the pods deleted")
    job = batch.read_namespaced_job("held", NS)
    assert (job.status.active, job.status.failed) == (0, 0)  # suspension is not a failure
    # not started again: its pod template's nodeSelector may change before it resumes
    job = wait_for(lambda: (j := batch.read_namespaced_job("held", NS)).status.start_time is None and j)
    batch.patch_namespaced_job("held", NS, {"spec": {"template": {"spec": {"nodeSelector": {"pool": "b"}}}}})
    counts: dict[str, int] = {}
    for event in core.list_namespaced_event(NS, field_selector="involvedObject.name=held").items:
        counts[event.reason] = counts.get(event.reason, 0) + event.count
    assert (counts["Suspended"], counts["Resumed"], counts["SuccessfulDelete"]) == (2, 1, 2)
    # the same event twice is one Event counted twice, as the event correlator aggregates it
    assert len([e for e in core.list_namespaced_event(NS).items if e.reason == "Suspended"]) == 1


def test_failed_pods_past_the_backoff_limit_fail_the_job(api: client.ApiClient) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    failing = {SIM_DURATION_ANNOTATION: "1s", SIM_EXIT_CODE_ANNOTATION: "3"}
    batch.create_namespaced_job(NS, indexed_job("crash", 1, annotations=failing, backoff_limit=1))

    with binding_scheduler(api):
        job = wait_for(lambda: "Failed" in conditions(j := batch.read_namespaced_job("crash", NS)) and j)

    assert conditions(job)["Failed"] == ("True", "BackoffLimitExceeded")
    assert job.status.failed == 2 and job.status.succeeded == 0  # index 0 retried once, then given up
    pods = job_pods(core, "crash")
    assert len(pods) == 2 and {p.status.phase for p in pods} == {"Failed"}
    terminated = pods[0].status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")


def test_deleting_a_job_in_background_collects_its_pods_and_orphaning_keeps_them(
    api: client.ApiClient,
) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(NS, indexed_job("gc", 2))
    batch.create_namespaced_job(NS, indexed_job("kept", 2))
    wait_for(lambda: len(job_pods(core, "gc")) == 2 and len(job_pods(core, "kept")) == 2)

    batch.delete_namespaced_job("gc", NS, propagation_policy="Background")
    batch.delete_namespaced_job("kept", NS)  # a batch/v1 Job orphans its pods by default

    wait_for(lambda: job_pods(core, "gc") == [], what="the pods of gc collected")
    kept = job_pods(core, "kept")
    assert len(kept) == 2 and all(not p.metadata.owner_references for p in kept)


def test_a_job_that_may_restart_always_is_refused_naming_the_field(api: client.ApiClient) -> None:
    job = indexed_job("bad", 1)
    job["spec"]["template"]["spec"]["restartPolicy"] = "Always"

    with pytest.raises(ApiException) as refused:
        client.BatchV1Api(api).create_namespaced_job(NS, job)

    assert refused.value.status == 422
    assert "spec.template.spec.restartPolicy" in refused.value.body


def test_a_pod_failure_policy_fails_the_job_at_once_or_ignores_the_failure(api: client.ApiClient) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    fatal = indexed_job(
        "fatal", 1, annotations={SIM_DURATION_ANNOTATION: "1s", SIM_EXIT_CODE_ANNOTATION: "42"}
    )
    fatal["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
    }
    flaky = indexed_job(
        "flaky",
        1,
        annotations={SIM_DURATION_ANNOTATION: "1s", SIM_EXIT_CODE_ANNOTATION: "3"},
        backoff_limit=0,
    )
    flaky["spec"]["podFailurePolicy"] = {
        "rules": [
            {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [3]}}
        ]
    }
    batch.create_namespaced_job(NS, fatal)
    batch.create_namespaced_job(NS, flaky)

    with binding_scheduler(api):
        job = wait_for(lambda: "Failed" in conditions(j := batch.read_namespaced_job("fatal", NS)) and j)
        wait_for(lambda: len(job_pods(core, "flaky")) >= 3, what="ignored failures replaced")

    assert conditions(job)["Failed"] == ("True", "PodFailurePolicy")
    failed_condition = next(c for c in job.status.conditions if c.type == "Failed")
    assert "failed with exit code 42 matching FailJob rule at index 0" in failed_condition.message
    assert job.status.failed == 1  # backoffLimit 6 was not waited for
    flaky_job = batch.read_namespaced_job("flaky", NS)
    assert flaky_job.status.failed == 0 and "Failed" not in conditions(flaky_job)
