"""Defaulting and validation of the workload resources (Jobs, JobSets, ReplicaSets, Deployments).

The real API server defaults an object when it decodes it (before admission webhooks see it) and
fills what needs the object's uid in the create strategy (after). `apply_defaults` is the first,
`prepare_for_create` the second; `validate_update` rejects the spec changes the real server forbids.
"""

from __future__ import annotations

import copy
from typing import Any

from tessera.devcluster.apiserver.errors import invalid
from tessera.devcluster.apiserver.resources import (
    DEPLOYMENTS,
    JOBS,
    JOBSETS,
    REPLICASETS,
    STATEFULSETS,
    ResourceType,
)

CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"
JOB_BACKOFF_LIMIT_DEFAULT = 6

# Template fields a suspended Job that never started may change (Kueue sets them when it admits).
_MUTABLE_SCHEDULING_DIRECTIVES = ("nodeSelector", "tolerations", "affinity", "schedulingGates")


WORKLOADS = (JOBS, JOBSETS, DEPLOYMENTS, REPLICASETS, STATEFULSETS)


def is_workload(resource: ResourceType) -> bool:
    return resource in WORKLOADS


def apply_defaults(resource: ResourceType, obj: dict[str, Any]) -> None:
    """The scheme's defaults, in place: what webhooks and clients see on every object."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if resource == JOBS:
        _default_job_spec(obj, spec)
    elif resource == JOBSETS:
        spec.setdefault("suspend", False)
        spec.setdefault("successPolicy", {"operator": "All"})
        network = spec.setdefault("network", {})
        if isinstance(network, dict):
            network.setdefault("enableDNSHostnames", True)
            network.setdefault("publishNotReadyAddresses", True)
        spec.setdefault("failurePolicy", {"maxRestarts": 0})
        for rjob in spec.get("replicatedJobs") or []:
            if isinstance(rjob, dict):
                rjob.setdefault("replicas", 1)
                job_spec = (rjob.get("template") or {}).get("spec")
                if isinstance(job_spec, dict):
                    # the JobSet webhook's defaults; a Job's own come when its Job is created
                    job_spec.setdefault("completionMode", "Indexed")
                    pod_spec = (job_spec.get("template") or {}).get("spec")
                    if isinstance(pod_spec, dict):
                        pod_spec.setdefault("restartPolicy", "OnFailure")
    elif resource in (DEPLOYMENTS, REPLICASETS, STATEFULSETS):
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        if resource == DEPLOYMENTS:
            spec.setdefault("progressDeadlineSeconds", 600)
            strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
            if isinstance(strategy, dict) and strategy.get("type", "RollingUpdate") == "RollingUpdate":
                strategy["type"] = "RollingUpdate"
                rolling = strategy.setdefault("rollingUpdate", {})
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
        if resource == STATEFULSETS:
            spec.setdefault("podManagementPolicy", "OrderedReady")


def _default_job_spec(job: dict[str, Any], spec: dict[str, Any]) -> None:
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    if spec.get("backoffLimitPerIndex") is None:
        spec.setdefault("backoffLimit", JOB_BACKOFF_LIMIT_DEFAULT)
    if spec.get("podFailurePolicy") is None:
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
    metadata = job.setdefault("metadata", {})
    if template_labels and not metadata.get("labels"):
        metadata["labels"] = dict(template_labels)


def prepare_for_create(resource: ResourceType, obj: dict[str, Any]) -> None:
    """Defaults, validation and what needs the uid, as the create strategy does; status is cleared."""
    apply_defaults(resource, obj)
    name = obj["metadata"]["name"]
    if resource == JOBS:
        _validate_job(obj["spec"] if isinstance(obj.get("spec"), dict) else {}, name, "spec")
        _generate_job_selector(obj)
    elif resource in (DEPLOYMENTS, REPLICASETS, STATEFULSETS):
        _validate_selector(resource, obj, name)
    elif resource == JOBSETS:
        _validate_jobset(obj, name)
    # ReplicaSet and StatefulSet status.replicas is not omitempty: clients require it
    obj["status"] = {"replicas": 0} if resource in (REPLICASETS, STATEFULSETS) else {}


def _validate_job(spec: dict[str, Any], name: str, path: str, kind: str = "Job") -> None:
    template = spec.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise invalid(kind, name, f"{path}.template", "Required value: a pod template")
    restart = template["spec"].get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        raise invalid(
            kind,
            name,
            f"{path}.template.spec.restartPolicy",
            f'Unsupported value: "{restart or "Always"}": supported values: "OnFailure", "Never"',
        )
    if spec.get("podFailurePolicy") and restart != "Never":
        raise invalid(
            kind,
            name,
            f"{path}.template.spec.restartPolicy",
            'Invalid value: only "Never" is supported when podFailurePolicy is specified',
        )
    for field in ("parallelism", "completions", "backoffLimit"):
        value = spec.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise invalid(
                kind, name, f"{path}.{field}", f"Invalid value: {value!r}: must be a non-negative integer"
            )
    mode = spec.get("completionMode")
    if mode not in ("NonIndexed", "Indexed"):
        raise invalid(
            kind,
            name,
            f"{path}.completionMode",
            f'Unsupported value: "{mode}": supported values: "NonIndexed", "Indexed"',
        )
    if mode == "Indexed" and spec.get("completions") is None:
        raise invalid(kind, name, f"{path}.completions", "Required value: when completion mode is Indexed")


def _generate_job_selector(job: dict[str, Any]) -> None:
    spec = job["spec"]
    if spec.get("manualSelector"):
        if not (spec.get("selector") or {}).get("matchLabels"):
            raise invalid("Job", job["metadata"]["name"], "spec.selector", "Required value")
        return
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    if spec.get("selector"):
        raise invalid(
            "Job",
            name,
            "spec.selector",
            "Invalid value: `selector` will be auto-generated; set manualSelector to choose one",
        )
    spec["selector"] = {"matchLabels": {CONTROLLER_UID_LABEL: uid}}
    template_meta = spec["template"].setdefault("metadata", {})
    template_meta["labels"] = {
        **(template_meta.get("labels") or {}),
        CONTROLLER_UID_LABEL: uid,
        JOB_NAME_LABEL: name,
        LEGACY_CONTROLLER_UID_LABEL: uid,
        LEGACY_JOB_NAME_LABEL: name,
    }


def _validate_selector(resource: ResourceType, obj: dict[str, Any], name: str) -> None:
    spec = obj["spec"]
    match_labels = (spec.get("selector") or {}).get("matchLabels")
    if not match_labels:
        raise invalid(resource.kind, name, "spec.selector", "Required value: matchLabels")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in match_labels.items()):
        raise invalid(
            resource.kind,
            name,
            "spec.template.metadata.labels",
            f"Invalid value: {labels}: `selector` does not match template `labels`",
        )
    replicas = spec.get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise invalid(
            resource.kind,
            name,
            "spec.replicas",
            f"Invalid value: {replicas!r}: must be a non-negative integer",
        )


def _validate_jobset(obj: dict[str, Any], name: str) -> None:
    rjobs = obj["spec"].get("replicatedJobs")
    if not isinstance(rjobs, list) or not rjobs:
        raise invalid("JobSet", name, "spec.replicatedJobs", "Required value: at least one replicated job")
    for i, rjob in enumerate(rjobs):
        path = f"spec.replicatedJobs[{i}]"
        if not isinstance(rjob, dict) or not rjob.get("name"):
            raise invalid("JobSet", name, f"{path}.name", "Required value")
        job_spec = (rjob.get("template") or {}).get("spec")
        if not isinstance(job_spec, dict):
            raise invalid("JobSet", name, f"{path}.template.spec", "Required value: a Job spec")
        _validate_job(job_spec, name, f"{path}.template.spec", "JobSet")


def validate_update(resource: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> None:
    """The Job's immutable fields: selector, completion mode, completions, and its pod template
    except for the scheduling directives while it is suspended and has not started."""
    if resource != JOBS:
        return
    name = old["metadata"]["name"]
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    for field in ("selector", "completionMode", "completions", "manualSelector"):
        if old_spec.get(field) != new_spec.get(field):
            raise invalid("Job", name, f"spec.{field}", "Invalid value: field is immutable")
    old_template, new_template = old_spec.get("template") or {}, new_spec.get("template") or {}
    if old_template == new_template:
        return
    may_change = old_spec.get("suspend") and not (old.get("status") or {}).get("startTime")
    if may_change and _without_directives(old_template) == _without_directives(new_template):
        return
    raise invalid(
        "Job",
        name,
        "spec.template",
        "Invalid value: field is immutable (only labels, annotations, nodeSelector, tolerations, "
        "affinity and schedulingGates may change, while the Job is suspended and has not started)",
    )


def _without_directives(template: dict[str, Any]) -> dict[str, Any]:
    stripped = copy.deepcopy(template)
    (stripped.get("metadata") or {}).pop("labels", None)
    (stripped.get("metadata") or {}).pop("annotations", None)
    for field in _MUTABLE_SCHEDULING_DIRECTIVES:
        (stripped.get("spec") or {}).pop(field, None)
    return stripped


__all__ = [
    "CONTROLLER_UID_LABEL",
    "JOB_NAME_LABEL",
    "apply_defaults",
    "prepare_for_create",
    "validate_update",
]
