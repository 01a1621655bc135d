"""A user's labelled `batch/v1` Job as a Tessera job spec. Pure.

Its tenant is its namespace, never a label the user writes: the queue configuration's tenant
queues then say which queue the namespace may use (as Kueue's namespaced LocalQueues point at
ClusterQueues), so a Job labelled with another queue is rejected, and stays suspended. Its one pod
group is its pod template, `parallelism` pods placed all-or-nothing. Its priority is, as the pods'
own, the value of the Kubernetes PriorityClass its template names (`priorityClassName`), or of the
cluster's `globalDefault` class when it names none; a name the cluster does not know is looked up
among Tessera's priority classes, and a name neither knows rejects the job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.admission.domain.webhook import NATIVE_GROUP, QUEUE_LABEL
from tessera.cluster.conventions.names import JOB_ID_LABEL


@dataclass(frozen=True)
class NativeJob:
    """A labelled Job the webhook held: where it is, its Tessera job id, and its spec."""

    job_id: str
    namespace: str
    name: str
    spec: dict[str, Any]


@dataclass(frozen=True)
class KubePriorities:
    """The cluster's PriorityClass objects: value by name, and the `globalDefault` one's value."""

    values: Mapping[str, int] = field(default_factory=dict)
    default: int | None = None

    @classmethod
    def of(cls, items: Sequence[Mapping[str, Any]]) -> KubePriorities:
        values = {str(i["metadata"]["name"]): int(i.get("value", 0)) for i in items}
        defaults = [int(i.get("value", 0)) for i in items if i.get("globalDefault")]
        return cls(values, max(defaults) if defaults else None)


def native_job(manifest: Mapping[str, Any], priorities: KubePriorities | None = None) -> NativeJob | None:
    """The Tessera job of a labelled Job; None for one the webhook did not give an id (created
    before the webhook was registered, or not held by it)."""
    priorities = priorities or KubePriorities()
    meta = manifest.get("metadata") or {}
    labels = meta.get("labels") or {}
    job_id, queue = labels.get(JOB_ID_LABEL), labels.get(QUEUE_LABEL)
    owners = meta.get("ownerReferences") or []
    if not job_id or not queue or any(o.get("kind") == "JobSet" for o in owners):
        return None  # a JobSet's child Job is part of the JobSet's job
    spec = manifest.get("spec") or {}
    template = dict(spec.get("template") or {})
    pods = int(spec.get("parallelism", 1) or 1)
    raw: dict[str, Any] = {
        "name": meta.get("name", ""),
        "tenant": meta.get("namespace", ""),
        "queue": queue,
        "pod_groups": [
            {
                "name": NATIVE_GROUP,
                "replicas": pods,
                "min_available": pods,
                "template": {k: v for k, v in template.items() if k in ("metadata", "spec")},
            }
        ],
        "labels": {"kubernetes.io/job": f"{meta.get('namespace')}/{meta.get('name')}"},
    }
    raw.update(priority_of(template, priorities))
    return NativeJob(str(job_id), str(meta.get("namespace", "")), str(meta.get("name", "")), raw)


def priority_of(template: Mapping[str, Any], priorities: KubePriorities) -> dict[str, Any]:
    """The job spec's priority fields for pods of ``template`` (a PodTemplateSpec)."""
    priority_class = (template.get("spec") or {}).get("priorityClassName")
    if priority_class and priority_class in priorities.values:
        return {"priority": priorities.values[priority_class]}
    if priority_class:
        return {"priority_class": priority_class}  # one of Tessera's, or refused as unknown
    if priorities.default is not None:
        return {"priority": priorities.default}
    return {}
