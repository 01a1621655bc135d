"""A LeaderWorkerSet's groups as Tessera jobs: each group (a leader and its workers) is one job of two
pod groups, all of them needed; its id is the group's (the same listing gives the same id, a leader
made again a new one); the webhook labels the templates and gates the pods without a job id, and a
LeaderWorkerSet's pod is never a job of its own."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch  # type: ignore[import-untyped]

from tessera.admission.domain.native import KubePriorities
from tessera.admission.domain.native_lws import complete, group_job, groups_of, member_labels
from tessera.admission.domain.native_pods import native_pod
from tessera.admission.domain.webhook import mutate, review_response
from tessera.contracts.jobs import JobSpec

P = "leaderworkerset.sigs.k8s.io/"
IMAGE = "vllm/vllm-openai:v0.6.4"
GATE = {"name": "tessera.io/admission"}


def template(role: str, gpus: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "llm", "role": role}},
        "spec": {
            "priorityClassName": "serving",
            "containers": [{"name": role, "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
    }


def lws(size: int = 3, uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "llm", "namespace": "ml", "uid": uid, "labels": {"tessera.io/queue": "serving"}},
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {
                "size": size,
                "leaderTemplate": template("leader", "1"),
                "workerTemplate": template("worker", "2"),
            },
        },
    }


def pod(
    name: str, group: str, worker: str, uid: str = "", gated: bool = True, **labels: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid or f"uid-{name}",
            "labels": {
                f"{P}name": "llm",
                f"{P}group-index": group,
                f"{P}group-key": f"key-{group}",
                f"{P}worker-index": worker,
                "tessera.io/queue": "serving",
                **labels,
            },
        },
        "spec": {"schedulingGates": [GATE] if gated else [], "containers": [{"name": "c", "image": IMAGE}]},
        "status": {"phase": "Pending"},
    }


def listing() -> list[dict[str, Any]]:
    return [
        pod("llm-1-2", "1", "2"),
        pod("llm-0", "0", "0"),
        pod("llm-0-2", "0", "2"),
        pod("llm-0-1", "0", "1"),
        pod("llm-1", "1", "0"),
    ]


def test_each_group_is_its_leader_then_its_workers_in_order() -> None:
    first, second = groups_of(listing())
    assert (first.lws, first.index, first.leader, first.queue) == ("llm", "0", "llm-0", "serving")
    assert first.pods == (("llm-0", "leader"), ("llm-0-1", "workers"), ("llm-0-2", "workers"))
    assert second.pods == (("llm-1", "leader"), ("llm-1-2", "workers"))
    assert complete(lws(), first) and not complete(lws(), second)  # llm-1-1 not made yet


def test_a_group_is_one_job_of_a_leader_and_its_workers_all_needed() -> None:
    first, _ = groups_of(listing())
    priorities = KubePriorities.of([{"metadata": {"name": "serving"}, "value": 900}])
    found = group_job(lws(), first, priorities)
    spec = JobSpec.model_validate(found.spec)
    assert (spec.tenant, spec.queue, spec.priority, spec.name) == ("ml", "serving", 900, "llm-0")
    leader, workers = spec.pod_groups
    assert (leader.name, leader.replicas, leader.quorum) == ("leader", 1, 1)
    assert (workers.name, workers.replicas, workers.quorum) == ("workers", 2, 2)
    assert (workers.template or {})["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert spec.labels == {"tessera.io/leaderworkerset-group": "ml/llm/0"}
    assert member_labels(found.job_id, "workers") == {
        "tessera.io/job-id": found.job_id,
        "tessera.io/pod-group-name": "workers",
    }


def test_a_size_one_group_has_no_workers_and_the_worker_template_leads_without_a_leader_template() -> None:
    one = lws(size=1)
    del one["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    group = groups_of([pod("llm-0", "0", "0")])[0]
    spec = JobSpec.model_validate(group_job(one, group).spec)
    (leader,) = spec.pod_groups
    assert (leader.name, leader.replicas) == ("leader", 1)
    assert (leader.template or {})["metadata"]["labels"]["role"] == "worker"


def test_the_job_id_is_the_group_s_own_and_a_leader_made_again_is_a_new_job() -> None:
    first = groups_of(listing())[0]
    again = groups_of(listing())[0]
    assert group_job(lws(), first).job_id == group_job(lws(), again).job_id  # a restart finds the same
    remade = groups_of([pod("llm-0", "0", "0", uid="new-leader")])[0]
    assert group_job(lws(), remade).job_id != group_job(lws(), first).job_id
    assert group_job(lws(uid="u-2"), first).job_id != group_job(lws(), first).job_id  # another LWS


def test_only_leaders_the_webhook_held_make_groups_and_ended_pods_count_for_none() -> None:
    foreign = pod("llm-0", "0", "0", gated=False)  # made before the webhook: not Tessera's
    released = pod("llm-1", "1", "0", gated=False, **{"tessera.io/job-id": "j-1"})
    ended = pod("llm-1-1", "1", "1")
    ended["status"]["phase"] = "Failed"
    (group,) = groups_of([foreign, released, ended])
    assert group.pods == (("llm-1", "leader"),)


def test_the_webhook_labels_a_lws_s_templates_and_gates_its_pods_without_a_job_id() -> None:
    manifest = lws()
    mutation = mutate("LeaderWorkerSet", manifest, "ignored")
    patched = jsonpatch.apply_patch(manifest, mutation.patch)
    lwt = patched["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        assert lwt[key]["metadata"]["labels"]["tessera.io/queue"] == "serving"
        assert lwt[key]["spec"]["schedulerName"] == "tessera"
        assert lwt[key]["metadata"]["labels"]["app"] == "llm"

    member = pod("llm-0", "0", "0", gated=False)
    review = {"request": {"uid": "r-1", "kind": {"kind": "Pod"}, "object": member}}
    answer = review_response(review, mutate("Pod", member, "j-should-not-be-used"))["response"]
    ops = json.loads(base64.b64decode(answer["patch"]))
    gated_pod = jsonpatch.apply_patch(member, ops)
    assert gated_pod["spec"]["schedulingGates"] == [GATE] and gated_pod["spec"]["schedulerName"] == "tessera"
    assert "tessera.io/job-id" not in gated_pod["metadata"]["labels"]


def test_a_lws_pod_is_not_a_job_of_its_own_even_once_labelled_with_its_group_s_job() -> None:
    labelled = pod("llm-0", "0", "0", **{"tessera.io/job-id": "j-1", "tessera.io/pod-group-name": "leader"})
    assert native_pod(labelled) is None
