"""A user's gated Pod as a Tessera job spec. Pure.

A Pod labelled `tessera.io/queue` (alone, or made by a Deployment's ReplicaSet or a StatefulSet from a
labelled template) was created with the scheduling gate `tessera.io/admission` and a Tessera job id
by admission's webhook (`domain.webhook`). Each such pod is one job of one pod: it is admitted
against quota as it appears, so replicas an autoscaler adds queue too. As for a labelled Job
(`domain.native`), its tenant is its namespace and never a label, and its priority is the value of
the Kubernetes PriorityClass it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.admission.domain.native import KubePriorities, NativeJob, native_job
from tessera.admission.domain.webhook import ADMISSION_GATE, LWS_NAME_LABEL

POD_LABEL = "kubernetes.io/pod"
"""The job label that names the pod a job stands for (`<namespace>/<name>`)."""
_TEMPLATE_METADATA = ("labels", "annotations")


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` still carries admission's scheduling gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, Mapping) and g.get("name") == ADMISSION_GATE for g in gates)


def without_gate(gates: Any) -> list[Any]:
    """A pod's `spec.schedulingGates` without admission's gate (others' gates are kept)."""
    return [g for g in gates or [] if not (isinstance(g, Mapping) and g.get("name") == ADMISSION_GATE)]


def native_pod(pod: Mapping[str, Any], priorities: KubePriorities | None = None) -> NativeJob | None:
    """The Tessera job of a gated pod; None for one the webhook did not give an id (created before
    the webhook was registered), one a held Job owns (that pod is its Job's), or one of a
    LeaderWorkerSet (its group is the job: `domain.native_lws`)."""
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    if any(isinstance(o, Mapping) and o.get("kind") == "Job" for o in owners):
        return None
    if LWS_NAME_LABEL in (meta.get("labels") or {}):
        return None
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in ("nodeName", "schedulingGates")}
    template_meta = {k: meta[k] for k in _TEMPLATE_METADATA if meta.get(k)}
    # A pod is the one-pod Job it would be: the same mapping, parallelism 1.
    as_job = {
        "metadata": meta,
        "spec": {"parallelism": 1, "template": {"metadata": template_meta, "spec": spec}},
    }
    found = native_job(as_job, priorities)
    if found is None:
        return None
    raw = dict(found.spec)
    raw["labels"] = {POD_LABEL: f"{found.namespace}/{found.name}"}
    return NativeJob(found.job_id, found.namespace, found.name, raw)
