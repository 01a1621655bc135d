"""The JobSet controller, through the official client over HTTP: replicated jobs become child Jobs and
a headless Service, suspend propagates to the children, and the JobSet completes or fails with them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION
from tessera.devcluster.testing import api_client, binding_scheduler, start_cluster, wait_for

pytestmark = pytest.mark.integration

NS = "default"
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running = start_cluster()
    yield running
    running.stop()


@pytest.fixture
def api(cluster: DevCluster) -> Iterator[client.ApiClient]:
    with api_client(cluster) as api:
        yield api


def replicated_job(name: str, replicas: int, pods: int, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "backoffLimit": 0,
                "template": {
                    "metadata": {"annotations": annotations},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": name, "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
                        ],
                    },
                },
            }
        },
    }


def jobset(
    name: str, *, suspend: bool, driver: dict[str, str], workers: dict[str, str], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "suspend": suspend,
            "replicatedJobs": [
                replicated_job("driver", 1, 1, driver),
                replicated_job("workers", 2, 2, workers),
            ],
            **spec,
        },
    }


def read(api: client.ApiClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, name
    )
    return found


def condition(obj: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return c["status"], c["reason"]
    return None


def children(api: client.ApiClient, name: str) -> dict[str, client.V1Job]:
    jobs = client.BatchV1Api(api).list_namespaced_job(
        NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
    )
    return {j.metadata.name: j for j in jobs.items}


def test_a_suspended_jobset_makes_suspended_children_and_a_headless_service_then_completes(
    api: client.ApiClient,
) -> None:
    quick = {SIM_DURATION_ANNOTATION: "2s"}
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, jobset("train", suspend=True, driver=quick, workers=quick)
    )

    jobs = wait_for(lambda: len(c := children(api, "train")) == 3 and c, what="three child Jobs")
    assert sorted(jobs) == ["train-driver-0", "train-workers-0", "train-workers-1"]
    assert all(j.spec.suspend for j in jobs.values())
    worker = jobs["train-workers-1"]
    labels = worker.spec.template.metadata.labels
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "workers"
    assert (
        labels["jobset.sigs.k8s.io/job-index"] == "1" and labels["jobset.sigs.k8s.io/job-global-index"] == "2"
    )
    assert labels["jobset.sigs.k8s.io/replicatedjob-replicas"] == "2"
    assert worker.spec.template.spec.subdomain == "train"
    assert worker.spec.completion_mode == "Indexed"
    assert (worker.metadata.owner_references[0].kind, worker.metadata.owner_references[0].name) == (
        "JobSet",
        "train",
    )
    service = client.CoreV1Api(api).read_namespaced_service("train", NS)
    assert service.spec.cluster_ip == "None" and service.spec.selector == {
        "jobset.sigs.k8s.io/jobset-name": "train"
    }
    assert wait_for(lambda: condition(read(api, "train"), "Suspended")) == ("True", "SuspendedJobs")

    # Admission resumes it with the flavor's node selector on the replicated jobs' pod templates.
    selector = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    resumed = read(api, "train")
    resumed["spec"]["suspend"] = False
    for rjob in resumed["spec"]["replicatedJobs"]:
        rjob["template"]["spec"]["template"]["spec"]["nodeSelector"] = selector
    client.CustomObjectsApi(api).replace_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "train", resumed
    )
    with binding_scheduler(api):
        done = wait_for(
            lambda: condition(j := read(api, "train"), "Completed") and j, what="the JobSet completed"
        )

    assert condition(done, "Completed") == ("True", "AllJobsCompleted")
    assert condition(done, "Suspended") == ("False", "ResumeJobs")
    statuses = {s["name"]: s for s in done["status"]["replicatedJobsStatus"]}
    assert statuses["driver"]["succeeded"] == 1 and statuses["workers"]["succeeded"] == 2
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=train")
        .items
    )
    assert len(pods) == 5 and all(p.spec.node_selector == selector for p in pods)
    assert all(p.spec.subdomain == "train" for p in pods)


def test_suspending_a_running_jobset_suspends_its_jobs_and_their_pods_go(api: client.ApiClient) -> None:
    objects = client.CustomObjectsApi(api)
    objects.create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, jobset("serve", suspend=False, driver={}, workers={})
    )
    core = client.CoreV1Api(api)
    selector = "jobset.sigs.k8s.io/jobset-name=serve"
    wait_for(lambda: len(core.list_namespaced_pod(NS, label_selector=selector).items) == 5, what="five pods")

    objects.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "serve", {"spec": {"suspend": True}})

    wait_for(lambda: all(j.spec.suspend for j in children(api, "serve").values()), what="children suspended")
    wait_for(lambda: core.list_namespaced_pod(NS, label_selector=selector).items == [], what="pods deleted")
    assert wait_for(lambda: condition(read(api, "serve"), "Suspended")) == ("True", "SuspendedJobs")
    statuses = {s["name"]: s for s in read(api, "serve")["status"]["replicatedJobsStatus"]}
    assert (statuses["driver"]["suspended"], statuses["workers"]["suspended"]) == (1, 2)


def test_a_failed_child_restarts_the_jobset_until_max_restarts_then_fails_it(api: client.ApiClient) -> None:
    crash = {SIM_DURATION_ANNOTATION: "1s", SIM_EXIT_CODE_ANNOTATION: "1"}
    body = jobset("flaky", suspend=False, driver={}, workers=crash, failurePolicy={"maxRestarts": 1})

    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    with binding_scheduler(api):
        failed = wait_for(
            lambda: condition(j := read(api, "flaky"), "Failed") and j, what="the JobSet failed"
        )

    assert condition(failed, "Failed") == ("True", "ReachedMaxRestarts")
    assert failed["status"]["restarts"] == 1
    # a finished JobSet deletes its active children (the driver, which would run forever)
    wait_for(lambda: "flaky-driver-0" not in children(api, "flaky"), what="the driver deleted")
    attempts = {
        j.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for j in children(api, "flaky").values()
    }
    assert attempts <= {"1"}
