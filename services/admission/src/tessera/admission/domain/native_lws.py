"""The groups of a user's LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`) as Tessera jobs. Pure.

A LeaderWorkerSet whose pod templates carry `tessera.io/queue` (the webhook puts the LeaderWorkerSet's
own label there) makes pods that the webhook creates gated (`tessera.io/admission`), with no job id:
a pod of a LeaderWorkerSet is not a job of its own. Each group, a leader pod and its `size - 1`
workers, is one Tessera job and one gang: the pod group `leader` (one pod, of `leaderTemplate`, or
`workerTemplate` when there is none) and the pod group `workers` (`size - 1` pods of
`workerTemplate`), all of them needed. Admission gives the group's pods the job's id and their pod
group as labels, and removes their gates, only once the whole group is admitted.

A group is queued once its leader and all its workers exist. Its job id is derived from the
LeaderWorkerSet's uid, the group's index and its leader pod's uid, so a restart adopts nothing twice,
and a group made again (its leader deleted: by a preemption, a restart of the group, or a scale down
and up) is a new job, as a Deployment's new pod is. As for a labelled Job (`domain.native`), its
tenant is its namespace and its priority that of the PriorityClass its leader's template names.

Each Event on the LeaderWorkerSet is named for what it tells (`group_event_name`), as the workload
sync names its Events (`domain.workload_sync.WorkloadDue.event_name`): a round cut short after it
told an Event, before it made the change, tells it again in a later round under the same name, which
the API server keeps once.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.admission.domain.native import KubePriorities, NativeJob, priority_of
from tessera.admission.domain.native_pods import gated
from tessera.admission.domain.webhook import LWS_NAME_LABEL, QUEUE_LABEL
from tessera.admission.domain.workload_sync import event_base
from tessera.cluster.conventions.names import JOB_ID_LABEL, JOB_POD_GROUP_LABEL

LWS_API = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
"""group, version and plural of the LeaderWorkerSet resource."""
LWS_PREFIX = "leaderworkerset.sigs.k8s.io/"
GROUP_INDEX_LABEL = f"{LWS_PREFIX}group-index"
GROUP_KEY_LABEL = f"{LWS_PREFIX}group-key"
WORKER_INDEX_LABEL = f"{LWS_PREFIX}worker-index"
LWS_GROUP_LABEL = "tessera.io/leaderworkerset-group"
"""The job spec label naming the group a Tessera job stands for (`namespace/name/index`)."""
LEADER_GROUP = "leader"
WORKER_GROUP = "workers"


@dataclass(frozen=True)
class LwsGroup:
    """One group of a LeaderWorkerSet's pods, as listed."""

    namespace: str
    lws: str
    index: str
    leader: str
    leader_uid: str
    queue: str
    #: pod name -> its pod group (leader or workers), leader first
    pods: tuple[tuple[str, str], ...]

    def size(self) -> int:
        return len(self.pods)


def _live(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


def is_lws_pod(pod: Mapping[str, Any]) -> bool:
    return LWS_NAME_LABEL in ((pod.get("metadata") or {}).get("labels") or {})


def groups_of(pods: Iterable[Mapping[str, Any]]) -> list[LwsGroup]:
    """The groups of the listed pods whose leader the webhook held (gated, or labelled with a job id
    by admission): the leader, then the workers of its group key, by worker index."""
    leaders: dict[tuple[str, str], Mapping[str, Any]] = {}
    workers: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not _live(pod) or LWS_NAME_LABEL not in labels or GROUP_KEY_LABEL not in labels:
            continue
        key = (str(meta.get("namespace", "")), str(labels[GROUP_KEY_LABEL]))
        if labels.get(WORKER_INDEX_LABEL) == "0":
            if gated(pod) or JOB_ID_LABEL in labels:
                leaders[key] = pod
        else:
            workers.setdefault(key, []).append(pod)
    groups = []
    for key, leader in sorted(leaders.items()):
        meta, labels = leader["metadata"], leader["metadata"]["labels"]
        members = sorted(
            workers.get(key, []), key=lambda p: int(p["metadata"]["labels"].get(WORKER_INDEX_LABEL) or 0)
        )
        groups.append(
            LwsGroup(
                key[0],
                str(labels[LWS_NAME_LABEL]),
                str(labels.get(GROUP_INDEX_LABEL, "")),
                str(meta["name"]),
                str(meta.get("uid", "")),
                str(labels.get(QUEUE_LABEL, "")),
                (
                    (str(meta["name"]), LEADER_GROUP),
                    *((str(p["metadata"]["name"]), WORKER_GROUP) for p in members),
                ),
            )
        )
    return groups


def size_of(lws: Mapping[str, Any]) -> int:
    return int(((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size", 1) or 1)


def templates(lws: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The leader's pod template and the workers'."""
    lwt = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    worker = lwt.get("workerTemplate") or {}
    return lwt.get("leaderTemplate") or worker, worker


def group_job_id(lws: Mapping[str, Any], group: LwsGroup) -> str:
    uid = (lws.get("metadata") or {}).get("uid", "")
    return str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"lws:{group.namespace}/{uid}/{group.index}/{group.leader_uid}")
    )


def complete(lws: Mapping[str, Any], group: LwsGroup) -> bool:
    """Whether all of the group's pods exist (its leader and `size - 1` workers)."""
    return group.size() >= size_of(lws)


def group_job(lws: Mapping[str, Any], group: LwsGroup, priorities: KubePriorities | None = None) -> NativeJob:
    """The Tessera job of one group: its leader and its workers, one gang."""
    size = size_of(lws)
    leader, worker = templates(lws)

    def pod_group(name: str, replicas: int, template: Mapping[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in template.items() if k in ("metadata", "spec")}
        return {"name": name, "replicas": replicas, "min_available": replicas, "template": kept}

    groups = [pod_group(LEADER_GROUP, 1, leader)]
    if size > 1:
        groups.append(pod_group(WORKER_GROUP, size - 1, worker))
    name = f"{group.lws}-{group.index}"
    raw: dict[str, Any] = {
        "name": name,
        "tenant": group.namespace,
        "queue": group.queue,
        "pod_groups": groups,
        "labels": {LWS_GROUP_LABEL: f"{group.namespace}/{group.lws}/{group.index}"},
    }
    raw.update(priority_of(leader, priorities or KubePriorities()))
    return NativeJob(group_job_id(lws, group), group.namespace, group.lws, raw)


def member_labels(job_id: str, pod_group: str) -> dict[str, str]:
    """The labels that make a group's pod a member of its job's gang."""
    return {JOB_ID_LABEL: job_id, JOB_POD_GROUP_LABEL: pod_group}


def group_event_name(group: LwsGroup, job_id: str, reason: str, *facts: str) -> str:
    """The name of the Event on the group's LeaderWorkerSet that tells ``reason`` of job ``job_id``:
    the same whenever the same change is told (``facts``: what tells one such change from the next
    of the job, e.g. the uids of the pods released), another for another change."""
    key = "\n".join((group.namespace, group.lws, job_id, reason, *facts))
    return f"{event_base(group.lws)}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
