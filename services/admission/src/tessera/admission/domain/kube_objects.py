"""A Tessera job as the Kubernetes objects that run it. Pure: manifests only, no client.

Every pod group becomes one Indexed `batch/v1` Job (`completionMode: Indexed`, `parallelism` =
`completions` = replicas) created with `suspend: true`; admitting the job unsuspends them, a
preemption suspends them again. One headless Service per job gives the pods stable names, so
`MASTER_ADDR` is the first group's index-0 pod (`<job>-<group>-0.<service>`), as torchrun and
`torch.distributed` expect. The Job controller creates the pods (`schedulerName: tessera`, labelled
with the job's id and pod group); the scheduler places and binds them all-or-nothing.

A gang restarts as a whole: `backoffLimit: 0`, and a pod disrupted by the scheduler (an eviction
for a preemption or a rolled-back bind, condition `DisruptionTarget`) does not count as a failure
(`podFailurePolicy` `Ignore`), as upstream recommends for Indexed training jobs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tessera.cluster.conventions.names import (
    CHECKPOINTABLE_ANNOTATION,
    JOB_ID_LABEL,
    JOB_POD_GROUP_LABEL,
    SCHEDULER_NAME,
    SIM_CHECKPOINT_INTERVAL_ANNOTATION,
    SIM_DURATION_ANNOTATION,
    SIM_STATE_BYTES_ANNOTATION,
    SIM_STEPS_PER_SECOND_ANNOTATION,
)
from tessera.contracts.jobs import JobSpec, PodGroupSpec

POD_GROUP_NAME_LABEL = JOB_POD_GROUP_LABEL
"""The pod group (of the job spec) a pod belongs to: the scheduler reads it into its placements."""
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
MASTER_PORT = 29500
"""torch.distributed's default rendezvous port."""
SIM_LABELS = (SIM_STATE_BYTES_ANNOTATION, SIM_STEPS_PER_SECOND_ANNOTATION, SIM_CHECKPOINT_INTERVAL_ANNOTATION)
"""Job labels that become pod annotations of the same name: the devcluster's simulated trainer reads
them (a real cluster ignores them)."""
DEFAULT_SIM_STATE_BYTES = 2**20
"""The simulated state of a checkpointable job that names none: 1 MiB, so a devcluster trainer saves
in milliseconds."""
_NOT_DNS = re.compile(r"[^a-z0-9]")
_MAX_BASE = 40
"""Room left in a 63-character name for `-<group>` would be too little for long groups: the base is
cut so that `<base>-<group>-<index>` (a pod's hostname) stays a DNS label."""


@dataclass(frozen=True)
class ObjectRef:
    """One object of a job on the cluster."""

    kind: str
    name: str


@dataclass(frozen=True)
class JobObjects:
    """What runs one Tessera job: the headless Service and a batch/v1 Job per pod group."""

    namespace: str
    service: dict[str, Any]
    jobs: tuple[dict[str, Any], ...]

    @property
    def refs(self) -> list[ObjectRef]:
        return [ObjectRef("Service", self.service["metadata"]["name"])] + [
            ObjectRef("Job", job["metadata"]["name"]) for job in self.jobs
        ]


def base_name(job_id: str, spec: JobSpec) -> str:
    """`<job name>-<first 8 of its id>`: two jobs of one name never share objects."""
    short = _NOT_DNS.sub("", job_id.lower())[:8] or "job"
    room = _MAX_BASE - len(short) - 1 - max(len(g.name) for g in spec.pod_groups)
    return f"{spec.name[: max(room, 1)].rstrip('-')}-{short}"


def job_name(job_id: str, spec: JobSpec, group: PodGroupSpec) -> str:
    return f"{base_name(job_id, spec)}-{group.name}"


def distributed_env(job_id: str, spec: JobSpec, group: PodGroupSpec, namespace: str) -> list[dict[str, Any]]:
    """The variables distributed training reads. `RANK` is the pod's completion index within its
    group plus `TESSERA_RANK_OFFSET` (the pods of the groups before it); with one group, as in DDP,
    the offset is 0 and `RANK` is the global rank. Kubernetes cannot add in an env var, so a
    multi-group job's later groups add the offset themselves."""
    first = spec.pod_groups[0]
    service = base_name(job_id, spec)
    offset = 0
    for other in spec.pod_groups:
        if other.name == group.name:
            break
        offset += other.replicas
    index_ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}
    return [
        {"name": "MASTER_ADDR", "value": f"{job_name(job_id, spec, first)}-0.{service}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        {"name": "WORLD_SIZE", "value": str(sum(g.replicas for g in spec.pod_groups))},
        {"name": "RANK", "valueFrom": index_ref},
        {"name": "TESSERA_RANK_OFFSET", "value": str(offset)},
        {"name": "TESSERA_JOB_ID", "value": job_id},
    ]


def _annotations(spec: JobSpec) -> dict[str, str]:
    annotations: dict[str, str] = {}
    if spec.estimated_duration_s is not None:
        annotations[SIM_DURATION_ANNOTATION] = str(spec.estimated_duration_s)
    if spec.checkpointable:
        annotations[CHECKPOINTABLE_ANNOTATION] = "true"
        annotations[SIM_STATE_BYTES_ANNOTATION] = str(DEFAULT_SIM_STATE_BYTES)
        annotations.update({key: spec.labels[key] for key in SIM_LABELS if key in spec.labels})
    return annotations


def pod_template(job_id: str, spec: JobSpec, group: PodGroupSpec, namespace: str) -> dict[str, Any]:
    """The group's own template, with the shorthand written in, the job's labels, the env of
    distributed training on every container, and Tessera's scheduler."""
    rendered = group.pod_template()
    if rendered is None:
        raise ValueError(f"pod group {group.name!r} has no template: there is no image to run")
    metadata = rendered.setdefault("metadata", {})
    metadata.setdefault("labels", {}).update({JOB_ID_LABEL: job_id, POD_GROUP_NAME_LABEL: group.name})
    annotations = metadata.setdefault("annotations", {})
    for key, value in _annotations(spec).items():
        annotations.setdefault(key, value)
    pod = rendered["spec"]
    pod["schedulerName"] = SCHEDULER_NAME
    pod["restartPolicy"] = "Never"
    pod["subdomain"] = base_name(job_id, spec)
    env = distributed_env(job_id, spec, group, namespace)
    names = {item["name"] for item in env}
    for container in pod["containers"]:
        own = [item for item in container.get("env", []) if item.get("name") not in names]
        container["env"] = own + env
    return rendered


def job_objects(job_id: str, spec: JobSpec, namespace: str) -> JobObjects:
    """The Service and the suspended Indexed Jobs of a job; raises ValueError without templates."""
    labels = {JOB_ID_LABEL: job_id}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": base_name(job_id, spec), "namespace": namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_ID_LABEL: job_id},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "dist", "port": MASTER_PORT, "targetPort": MASTER_PORT}],
        },
    }
    jobs = []
    for group in spec.pod_groups:
        jobs.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": job_name(job_id, spec, group),
                    "namespace": namespace,
                    "labels": {**labels, POD_GROUP_NAME_LABEL: group.name},
                },
                "spec": {
                    "suspend": True,
                    "completionMode": "Indexed",
                    "completions": group.replicas,
                    "parallelism": group.replicas,
                    "backoffLimit": 0,
                    "podFailurePolicy": {
                        "rules": [
                            {
                                "action": "Ignore",
                                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                            }
                        ]
                    },
                    "template": pod_template(job_id, spec, group, namespace),
                },
            }
        )
    return JobObjects(namespace, service, tuple(jobs))
