"""The mutating admission webhook's decision: how a labelled workload is held at creation. Pure.

As Kueue does, a workload that carries `tessera.io/queue` is held until admission admits it: a
`batch/v1` Job is created with `suspend: true` and its pods get `schedulerName: tessera`. The answer
is an RFC 6902 JSONPatch. Unlabelled objects, and the pods a held Job makes, are left as they are.
A labelled Pod (alone, or made by a Deployment's ReplicaSet or a StatefulSet from a labelled
template) is created with the scheduling gate `tessera.io/admission` (PodSchedulingReadiness): no
scheduler places it until admission removes the gate. Each such pod is a Tessera job of its own,
admitted against quota as it appears, so replicas an autoscaler adds queue too.
A labelled JobSet is created with `suspend: true` (its controller keeps its child Jobs suspended)
and is one Tessera job: each replicated job's Job template and pod template get the job's id, each
pod template its replicated job's name as the pod group and `schedulerName: tessera`, so the pods of
every child Job are one gang.
A labelled LeaderWorkerSet gets the label on its leader and worker pod templates, and
`schedulerName: tessera` there: its pods come to the webhook, gated. A pod of a LeaderWorkerSet (it
carries `leaderworkerset.sigs.k8s.io/name`) is gated without a job id: each group of a leader and its
workers is one job (`domain.native_lws`), whose id admission gives the group's pods when it admits it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.cluster.conventions.names import JOB_ID_LABEL, JOB_POD_GROUP_LABEL, SCHEDULER_NAME

QUEUE_LABEL = "tessera.io/queue"
ADMISSION_GATE = "tessera.io/admission"
HELD_BY_PARENT = frozenset({"Job", "JobSet"})
"""Owners that are held themselves: their children are released with them."""
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""Set on the pods of a LeaderWorkerSet (upstream copies it from the templates its controller makes)."""
NATIVE_GROUP = "pods"
"""The one pod group of a user's Job, as its Tessera job names it."""


@dataclass(frozen=True)
class Mutation:
    """What the webhook answers: the JSONPatch (empty: untouched) and why."""

    patch: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    #: refused: the create fails with this message
    denied: str = ""


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def _owner_kinds(obj: Mapping[str, Any]) -> set[str]:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {str(o.get("kind")) for o in owners if isinstance(o, Mapping)}


def _scheduler(path: str) -> dict[str, Any]:
    return {"op": "add", "path": f"{path}/schedulerName", "value": SCHEDULER_NAME}


def _escape(key: str) -> str:
    """A map key in a JSON pointer (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _labels_patch(path: str, meta: Any, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """Add ``labels`` to the metadata at ``path`` (which may lack labels, or be missing)."""
    if not isinstance(meta, Mapping):
        return [{"op": "add", "path": path, "value": {"labels": dict(labels)}}]
    if not isinstance(meta.get("labels"), Mapping):
        return [{"op": "add", "path": f"{path}/labels", "value": dict(labels)}]
    return [{"op": "add", "path": f"{path}/labels/{_escape(k)}", "value": v} for k, v in labels.items()]


def mutate(kind: str, obj: Mapping[str, Any], job_id: str = "") -> Mutation:
    """The patch that holds ``obj`` (of ``kind``) for admission, if it asks for a queue. A Job gets
    ``job_id`` (chosen by the caller) as its `tessera.io/job-id` label, on itself and its pods: the
    Tessera job it becomes, and the gang the scheduler makes of its pods."""
    queue = _labels(obj).get(QUEUE_LABEL)
    if not queue:
        return Mutation(reason=f"no {QUEUE_LABEL} label: not Tessera's")
    if _owner_kinds(obj) & HELD_BY_PARENT:
        return Mutation(reason="held with its parent")
    if kind == "Job":
        patch = [{"op": "add", "path": "/spec/suspend", "value": True}, _scheduler("/spec/template/spec")]
        if job_id:
            labels = {JOB_ID_LABEL: job_id}
            patch += _labels_patch("/metadata", obj.get("metadata"), labels)
            template = (obj.get("spec") or {}).get("template") or {}
            pods = {**labels, JOB_POD_GROUP_LABEL: NATIVE_GROUP}
            patch += _labels_patch("/spec/template/metadata", template.get("metadata"), pods)
        return Mutation(patch, f"suspended for queue {queue}")
    if kind == "Pod" and LWS_NAME_LABEL in _labels(obj):
        return Mutation(_gate_patch(obj, ""), f"gated for queue {queue} with its LeaderWorkerSet group")
    if kind == "Pod":
        return Mutation(_gate_patch(obj, job_id), f"gated for queue {queue}")
    if kind == "LeaderWorkerSet":
        return Mutation(_lws_patch(obj, str(queue)), f"pod templates labelled for queue {queue}")
    if kind == "JobSet":
        return Mutation(_jobset_patch(obj, job_id), f"suspended for queue {queue}")
    return Mutation(reason=f"{kind} is not a kind Tessera holds")


def _gate_patch(pod: Mapping[str, Any], job_id: str) -> list[dict[str, Any]]:
    """Gate a pod for admission, for Tessera's scheduler, as the Tessera job ``job_id``."""
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates")
    gate = {"name": ADMISSION_GATE}
    patch: list[dict[str, Any]]
    if not isinstance(gates, list):
        patch = [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    elif any(isinstance(g, Mapping) and g.get("name") == ADMISSION_GATE for g in gates):
        patch = []
    else:
        patch = [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]
    patch.append(_scheduler("/spec"))
    if job_id:
        labels = {JOB_ID_LABEL: job_id, JOB_POD_GROUP_LABEL: NATIVE_GROUP}
        patch += _labels_patch("/metadata", pod.get("metadata"), labels)
    return patch


def _jobset_patch(jobset: Mapping[str, Any], job_id: str) -> list[dict[str, Any]]:
    """Suspend a JobSet; send its pods to Tessera's scheduler as one gang, the Tessera job ``job_id``."""
    patch = [{"op": "add", "path": "/spec/suspend", "value": True}]
    rjobs = (jobset.get("spec") or {}).get("replicatedJobs")
    for i, rjob in enumerate(rjobs if isinstance(rjobs, list) else []):
        if not isinstance(rjob, Mapping):
            continue
        job = rjob.get("template") or {}
        pods = (job.get("spec") or {}).get("template") or {}
        at = f"/spec/replicatedJobs/{i}/template"
        if not isinstance(job.get("spec"), Mapping) or not isinstance(pods.get("spec"), Mapping):
            continue  # no pod spec to patch: the API server's validation refuses it
        patch.append(_scheduler(f"{at}/spec/template/spec"))
        if not job_id:
            continue
        patch += _labels_patch(f"{at}/metadata", job.get("metadata"), {JOB_ID_LABEL: job_id})
        labels = {JOB_ID_LABEL: job_id, JOB_POD_GROUP_LABEL: str(rjob.get("name", ""))}
        patch += _labels_patch(f"{at}/spec/template/metadata", pods.get("metadata"), labels)
    if job_id:
        patch += _labels_patch("/metadata", jobset.get("metadata"), {JOB_ID_LABEL: job_id})
    return patch


def _lws_patch(lws: Mapping[str, Any], queue: str) -> list[dict[str, Any]]:
    """Put the queue label on a LeaderWorkerSet's pod templates (so its pods come to the webhook, and
    are gated) and send its pods to Tessera's scheduler."""
    lwt = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    patch: list[dict[str, Any]] = []
    for key in ("leaderTemplate", "workerTemplate"):
        template = lwt.get(key) if isinstance(lwt, Mapping) else None
        if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
            continue  # no leaderTemplate: the leader is made of the workerTemplate
        at = f"/spec/leaderWorkerTemplate/{key}"
        meta = template.get("metadata")
        if not (isinstance(meta, Mapping) and (meta.get("labels") or {}).get(QUEUE_LABEL) == queue):
            patch += _labels_patch(f"{at}/metadata", meta, {QUEUE_LABEL: queue})
        patch.append(_scheduler(f"{at}/spec"))
    return patch


def review_response(review: Mapping[str, Any], mutation: Mutation) -> dict[str, Any]:
    """An `admission.k8s.io/v1` AdmissionReview answering ``review`` (allowed, with the patch)."""
    request = review.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": not mutation.denied}
    if mutation.denied:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": mutation.denied}
    elif mutation.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(mutation.patch).encode()).decode()
    return {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }
