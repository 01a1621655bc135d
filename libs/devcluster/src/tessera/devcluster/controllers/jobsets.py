"""The JobSet controller (jobset.x-k8s.io/v1alpha2), after kubernetes-sigs/jobset's.

- Each replicated job `r` with `replicas: n` becomes the Jobs `<jobset>-<r>-0` .. `<jobset>-<r>-<n-1>`,
  labelled and annotated (Jobs and their pod templates) with `jobset.sigs.k8s.io/jobset-name`,
  `replicatedjob-name`, `replicatedjob-replicas`, `job-index`, `job-global-index`, `job-key` and
  `restart-attempt`, and owned by the JobSet.
- With `network.enableDNSHostnames` (the default) a headless Service named `network.subdomain` (or
  the JobSet's name) selects the JobSet's pods, and pod templates get it as their subdomain.
- `spec.suspend` propagates to every child Job; resuming also carries the replicated job's pod
  template labels, annotations, nodeSelector and tolerations to the Job (how Kueue injects a flavor).
- Status: per replicated job `ready`, `succeeded`, `failed`, `active` and `suspended` Jobs; the
  `Completed` condition when every Job succeeded (successPolicy `All`, or `Any` of the target
  replicated jobs), `Failed` when a Job failed and `failurePolicy.maxRestarts` is used up (before
  that, all child Jobs are recreated and `status.restarts` counts); a finished JobSet deletes its
  active Jobs; `Suspended` True/False.

Left out: startupPolicy ordering, exclusive placement, failure policy rules, coordinator, TTL.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from tessera.devcluster.apiserver.ownership import delete_dependents, owner_reference
from tessera.devcluster.apiserver.resources import JOBS, JOBSETS, SERVICES
from tessera.devcluster.controllers.base import (
    Controller,
    Mapper,
    ObjectKey,
    condition_present,
    condition_true,
    own_key,
    owner_key,
    set_condition,
)

PREFIX = "jobset.sigs.k8s.io/"
JOBSET_NAME = f"{PREFIX}jobset-name"
REPLICATED_JOB_NAME = f"{PREFIX}replicatedjob-name"
REPLICATED_JOB_REPLICAS = f"{PREFIX}replicatedjob-replicas"
JOB_INDEX = f"{PREFIX}job-index"
JOB_GLOBAL_INDEX = f"{PREFIX}job-global-index"
JOB_KEY = f"{PREFIX}job-key"
RESTART_ATTEMPT = f"{PREFIX}restart-attempt"
COMPONENT = "jobset-controller"


class JobSetController(Controller):
    name = COMPONENT

    def watches(self) -> list[tuple[Any, Mapper]]:
        return [(JOBSETS, self._jobset_event), (JOBS, owner_key("JobSet"))]

    def _jobset_event(self, kind: str, jobset: dict[str, Any]) -> list[ObjectKey]:
        return [] if kind == "DELETED" else own_key(kind, jobset)

    async def reconcile(self, namespace: str, name: str) -> None:
        jobset = self.ctx.store.find(JOBSETS, namespace, name)
        if jobset is None or jobset["metadata"].get("deletionTimestamp"):
            return
        spec, status = jobset["spec"], jobset.get("status") or {}
        restarts = int(status.get("restarts", 0))
        jobs = self._children(jobset)
        finished = condition_true(jobset, "Completed") or condition_true(jobset, "Failed")
        if finished:
            for job in jobs:
                if not _job_finished(job):
                    self._delete_job(job)
            return

        stale = [j for j in jobs if j["metadata"]["labels"].get(RESTART_ATTEMPT) != str(restarts)]
        for job in stale:
            self._delete_job(job)
        jobs = [j for j in jobs if j not in stale]
        failed = [j for j in jobs if condition_true(j, "Failed")]
        max_restarts = int((spec.get("failurePolicy") or {}).get("maxRestarts", 0))
        if failed and restarts < max_restarts:
            self._restart(jobset, restarts + 1)
            return

        self._ensure_service(jobset)
        suspended = bool(spec.get("suspend"))
        existing = {j["metadata"]["name"]: j for j in jobs}
        for wanted in desired_jobs(jobset, restarts):
            current = existing.get(wanted["metadata"]["name"])
            if current is None:
                await self.ctx.create_for(jobset, JOBS, namespace, wanted, COMPONENT)
            elif bool(current["spec"].get("suspend")) != suspended and not _job_finished(current):
                self._set_suspend(current, wanted, suspended)
        self._write_status(jobset, failed_exhausted=bool(failed), max_restarts=max_restarts)

    def _children(self, jobset: dict[str, Any]) -> list[dict[str, Any]]:
        return self.ctx.store.owned_by(jobset["metadata"]["uid"], JOBS, copy_objects=False)

    def _delete_job(self, job: dict[str, Any]) -> None:
        delete_dependents(self.ctx.store, job["metadata"]["uid"])  # background, as the controller asks
        self.ctx.delete(JOBS, job["metadata"]["namespace"], job["metadata"]["name"])

    def _restart(self, jobset: dict[str, Any], attempt: int) -> None:
        for job in self._children(jobset):
            self._delete_job(job)

        def count(obj: dict[str, Any]) -> None:
            obj.setdefault("status", {})["restarts"] = attempt

        written = self.ctx.store.mutate(
            JOBSETS, jobset["metadata"]["namespace"], jobset["metadata"]["name"], count
        )
        self.ctx.event(written, "Warning", "Restarting", f"restarting jobset, attempt {attempt}", COMPONENT)

    def _ensure_service(self, jobset: dict[str, Any]) -> None:
        network = jobset["spec"].get("network") or {}
        if not network.get("enableDNSHostnames", True):
            return
        namespace, name = jobset["metadata"]["namespace"], subdomain(jobset)
        if self.ctx.store.find(SERVICES, namespace, name) is not None:
            return
        self.ctx.store.create(
            SERVICES,
            namespace,
            {
                "metadata": {
                    "name": name,
                    "labels": {JOBSET_NAME: jobset["metadata"]["name"]},
                    "ownerReferences": [owner_reference(jobset)],
                },
                "spec": {
                    "clusterIP": "None",
                    "selector": {JOBSET_NAME: jobset["metadata"]["name"]},
                    "publishNotReadyAddresses": bool(network.get("publishNotReadyAddresses", True)),
                },
            },
        )

    def _set_suspend(self, job: dict[str, Any], wanted: dict[str, Any], suspended: bool) -> None:
        def change(obj: dict[str, Any]) -> None:
            obj["spec"]["suspend"] = suspended
            if suspended:
                return
            # Resuming carries the scheduling directives set on the JobSet while it was suspended.
            source, target = wanted["spec"]["template"], obj["spec"]["template"]
            target_meta = target.setdefault("metadata", {})
            for field in ("labels", "annotations"):
                merged = {
                    **(target_meta.get(field) or {}),
                    **((source.get("metadata") or {}).get(field) or {}),
                }
                if merged:
                    target_meta[field] = merged
            for field in ("nodeSelector", "tolerations"):
                if field in source["spec"]:
                    target["spec"][field] = copy.deepcopy(source["spec"][field])

        self.ctx.store.mutate(JOBS, job["metadata"]["namespace"], job["metadata"]["name"], change)

    def _write_status(self, jobset: dict[str, Any], *, failed_exhausted: bool, max_restarts: int) -> None:
        jobs = self._children(jobset)
        spec = jobset["spec"]
        counts = {
            rjob["name"]: {
                "name": rjob["name"],
                "ready": 0,
                "succeeded": 0,
                "failed": 0,
                "active": 0,
                "suspended": 0,
            }
            for rjob in spec["replicatedJobs"]
        }
        for job in jobs:
            entry = counts.get(job["metadata"]["labels"].get(REPLICATED_JOB_NAME, ""))
            if entry is None:
                continue
            job_status = job.get("status") or {}
            if condition_true(job, "Complete"):
                entry["succeeded"] += 1
            elif condition_true(job, "Failed"):
                entry["failed"] += 1
            elif job["spec"].get("suspend"):
                entry["suspended"] += 1
            else:
                entry["active"] += 1
                ready = int(job_status.get("ready", 0)) + int(job_status.get("succeeded", 0))
                if ready >= int(job["spec"].get("parallelism", 1)):
                    entry["ready"] += 1
        completed = _success(spec, counts)
        suspended = bool(spec.get("suspend"))
        events: list[tuple[str, str, str]] = []

        wanted: list[tuple[str, str, str, str, str]] = []  # type, status, reason, message, event type
        if failed_exhausted:
            reason, message = (
                ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
                if max_restarts > 0
                else ("FailedJobs", "jobset failed due to one or more job failures")
            )
            wanted.append(("Failed", "True", reason, message, "Warning"))
        elif completed:
            wanted.append(
                ("Completed", "True", "AllJobsCompleted", "jobset completed successfully", "Normal")
            )
        if suspended:
            wanted.append(("Suspended", "True", "SuspendedJobs", "jobset is suspended", "Normal"))
        elif condition_present(jobset, "Suspended"):
            wanted.append(("Suspended", "False", "ResumeJobs", "jobset is resumed", "Normal"))

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status["replicatedJobsStatus"] = list(counts.values())
            status.setdefault("restarts", 0)
            for kind, value, reason, message, event_type in wanted:
                if set_condition(status, kind, value, reason, message, probe=False):
                    events.append((event_type, reason, message))
                    if kind in ("Failed", "Completed"):
                        status["terminalState"] = kind

        written = self.ctx.store.mutate(
            JOBSETS, jobset["metadata"]["namespace"], jobset["metadata"]["name"], change
        )
        for kind, reason, message in events:
            self.ctx.event(written, kind, reason, message, COMPONENT)


def _success(spec: dict[str, Any], counts: dict[str, dict[str, Any]]) -> bool:
    policy = spec.get("successPolicy") or {}
    targets = policy.get("targetReplicatedJobs") or list(counts)
    replicas = {r["name"]: int(r.get("replicas", 1)) for r in spec["replicatedJobs"]}
    if policy.get("operator", "All") == "Any":
        return any(counts[t]["succeeded"] > 0 for t in targets if t in counts)
    return all(counts[t]["succeeded"] >= replicas[t] for t in targets if t in counts)


def _job_finished(job: dict[str, Any]) -> bool:
    return condition_true(job, "Complete") or condition_true(job, "Failed")


def subdomain(jobset: dict[str, Any]) -> str:
    return str((jobset["spec"].get("network") or {}).get("subdomain") or jobset["metadata"]["name"])


def desired_jobs(jobset: dict[str, Any], restarts: int) -> list[dict[str, Any]]:
    """The child Jobs the JobSet asks for, in replicated-job order."""
    meta, spec = jobset["metadata"], jobset["spec"]
    dns = (spec.get("network") or {}).get("enableDNSHostnames", True)
    jobs: list[dict[str, Any]] = []
    global_index = 0
    for rjob in spec["replicatedJobs"]:
        replicas = int(rjob.get("replicas", 1))
        for index in range(replicas):
            template = copy.deepcopy(rjob["template"])
            job_name = f"{meta['name']}-{rjob['name']}-{index}"
            marks = {
                JOBSET_NAME: meta["name"],
                REPLICATED_JOB_NAME: rjob["name"],
                REPLICATED_JOB_REPLICAS: str(replicas),
                JOB_INDEX: str(index),
                JOB_GLOBAL_INDEX: str(global_index),
                JOB_KEY: hashlib.sha1(f"{meta['namespace']}/{job_name}".encode()).hexdigest(),
                RESTART_ATTEMPT: str(restarts),
            }
            job_spec = template["spec"]
            pod_template = job_spec.setdefault("template", {})
            for target in (template, pod_template):
                target_meta = target.setdefault("metadata", {})
                target_meta["labels"] = {**(target_meta.get("labels") or {}), **marks}
                target_meta["annotations"] = {**(target_meta.get("annotations") or {}), **marks}
            if dns:
                pod_template.setdefault("spec", {})["subdomain"] = subdomain(jobset)
            job_spec["suspend"] = bool(spec.get("suspend"))
            jobs.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": job_name,
                        "namespace": meta["namespace"],
                        "labels": template["metadata"]["labels"],
                        "annotations": template["metadata"]["annotations"],
                        "ownerReferences": [owner_reference(jobset)],
                    },
                    "spec": job_spec,
                }
            )
            global_index += 1
    return jobs
