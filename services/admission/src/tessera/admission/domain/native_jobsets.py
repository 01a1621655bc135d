"""A user's labelled JobSet (`jobset.x-k8s.io/v1alpha2`) as one Tessera job. Pure.

As for a labelled Job (`domain.native`), its tenant is its namespace and its queue its label. Its
pod groups are its replicated jobs, in order: replicated job `r` with `replicas: n` of Jobs of
`parallelism: p` is the pod group `r` of `n x p` pods, all of them needed (`min_available`), so the
whole JobSet is admitted, and placed, as one gang. Its priority is that of its first replicated
job's pod template (a JobSet has one priority, as Kueue reads it).

The webhook (`domain.webhook`) labels every replicated job's Job template and pod template with the
Tessera job id, and each pod template with its replicated job's name as the pod group: the child
Jobs the JobSet controller makes, and their pods, carry them, so the scheduler gathers the pods of
every child Job into the job's one gang.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.admission.domain.native import KubePriorities, NativeJob, priority_of
from tessera.admission.domain.webhook import QUEUE_LABEL
from tessera.cluster.conventions.names import JOB_ID_LABEL

JOBSET_API = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
"""group, version and plural of the JobSet resource."""
JOBSET_NAME_LABEL = "tessera.io/jobset"
"""The job spec label naming the JobSet (`namespace/name`) a Tessera job stands for."""


def replicated_jobs(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The JobSet's replicated jobs (those that are maps)."""
    listed = (manifest.get("spec") or {}).get("replicatedJobs") or []
    return [r for r in listed if isinstance(r, Mapping)] if isinstance(listed, list) else []


def pod_template(rjob: Mapping[str, Any]) -> Mapping[str, Any]:
    """A replicated job's pod template (`template.spec.template`)."""
    job = (rjob.get("template") or {}).get("spec") or {}
    template = job.get("template") or {}
    return template if isinstance(template, Mapping) else {}


def _pods(rjob: Mapping[str, Any]) -> int:
    job = (rjob.get("template") or {}).get("spec") or {}
    return int(rjob.get("replicas", 1) or 1) * int(job.get("parallelism", 1) or 1)


def native_jobset(manifest: Mapping[str, Any], priorities: KubePriorities | None = None) -> NativeJob | None:
    """The Tessera job of a labelled JobSet; None for one the webhook did not give an id."""
    meta = manifest.get("metadata") or {}
    labels = meta.get("labels") or {}
    job_id, queue = labels.get(JOB_ID_LABEL), labels.get(QUEUE_LABEL)
    if not job_id or not queue:
        return None
    rjobs = replicated_jobs(manifest)
    groups = [
        {
            "name": str(rjob.get("name", "")),
            "replicas": _pods(rjob),
            "min_available": _pods(rjob),
            "template": {k: v for k, v in pod_template(rjob).items() if k in ("metadata", "spec")},
        }
        for rjob in rjobs
    ]
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    raw: dict[str, Any] = {
        "name": name,
        "tenant": namespace,
        "queue": queue,
        "pod_groups": groups,
        "labels": {JOBSET_NAME_LABEL: f"{namespace}/{name}"},
    }
    if rjobs:
        raw.update(priority_of(pod_template(rjobs[0]), priorities or KubePriorities()))
    return NativeJob(str(job_id), namespace, name, raw)
