"""The Job controller (batch/v1), after kube-controller-manager's.

- `parallelism` pods run at once, until `completions` pods have succeeded (with no `completions`,
  until one succeeds and the rest end).
- `completionMode: Indexed` gives each pod an index in [0, completions): in its name
  (`<job>-<index>-<suffix>`), its hostname, the `batch.kubernetes.io/job-completion-index` label and
  annotation and the `JOB_COMPLETION_INDEX` env var (from the annotation); a failed index is retried,
  and the Job completes when every index has succeeded (`status.completedIndexes`).
- More failed pods than `backoffLimit` fail the Job (`BackoffLimitExceeded`), and its active pods
  are deleted.
- `suspend: true` deletes the active pods (they do not count as failures) and sets the `Suspended`
  condition, and clears `startTime` once they are gone; resuming sets it False and resets
  `startTime`, as upstream does.
- Status keeps `active`, `ready`, `succeeded`, `failed`, `terminating`, `startTime`,
  `completionTime` and the conditions (`Suspended`, `Complete`, `Failed`), and Events are recorded.
- `podFailurePolicy` rules (`FailJob`, `Ignore`, `Count`) on exit codes and pod conditions.

Left out: pod backoff delays, `activeDeadlineSeconds`, `backoffLimitPerIndex` (and `FailIndex`),
`successPolicy`, the job-tracking finalizer (counts come from watching pods end), and in-place restarts
of `OnFailure` containers (the simulated kubelet does not restart containers).
"""

from __future__ import annotations

import copy
from typing import Any

from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.ownership import owner_reference
from tessera.devcluster.apiserver.resources import JOBS, PODS
from tessera.devcluster.apiserver.selectors import LabelSelector, Selector
from tessera.devcluster.controllers import pod_failure_policy
from tessera.devcluster.controllers.base import (
    Controller,
    Mapper,
    ObjectKey,
    condition_true,
    own_key,
    owner_key,
    pod_active,
    pod_ready,
    set_condition,
)

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
COMPONENT = "job-controller"
_PHASES = ("Succeeded", "Failed")


class JobController(Controller):
    name = COMPONENT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Pods seen to end, by Job uid then pod uid: (phase, index). Recorded from the watch, so a pod
        # deleted right after it ended still counts; `_counted` marks what the status already holds.
        self._ended: dict[str, dict[str, dict[str, Any]]] = {}
        self._counted: dict[str, set[str]] = {}

    def watches(self) -> list[tuple[Any, Mapper]]:
        return [(JOBS, self._job_event), (PODS, self._pod_event)]

    def _job_event(self, kind: str, job: dict[str, Any]) -> list[ObjectKey]:
        if kind == "DELETED":
            uid = job["metadata"].get("uid", "")
            self._ended.pop(uid, None)
            self._counted.pop(uid, None)
            return []
        return own_key(kind, job)

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> list[ObjectKey]:
        keys = list(owner_key("Job")(kind, pod))
        phase = (pod.get("status") or {}).get("phase")
        if keys and phase in _PHASES:
            job_uid = next(r["uid"] for r in pod["metadata"]["ownerReferences"] if r.get("controller"))
            self._ended.setdefault(job_uid, {})[pod["metadata"]["uid"]] = pod
        return keys

    async def reconcile(self, namespace: str, name: str) -> None:
        job = self.ctx.store.find(JOBS, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        if condition_true(job, "Complete") or condition_true(job, "Failed"):
            return
        uid = job["metadata"]["uid"]
        spec, status = job["spec"], job.get("status") or {}
        pods = self._pods(job)
        active = [p for p in pods if pod_active(p)]
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            if phase in _PHASES:
                self._ended.setdefault(uid, {})[pod["metadata"]["uid"]] = pod

        counted = self._counted.setdefault(uid, set())
        succeeded, failed = int(status.get("succeeded", 0)), int(status.get("failed", 0))
        indexed = spec.get("completionMode") == "Indexed"
        completions: int | None = spec.get("completions")
        done_indexes = parse_indexes(status.get("completedIndexes", ""))
        new_failure = False
        finished: tuple[str, str, str] | None = None
        for pod_uid, ended in self._ended.get(uid, {}).items():
            if pod_uid in counted:
                continue
            counted.add(pod_uid)
            index = pod_index(ended)
            if ended["status"]["phase"] == "Succeeded":
                succeeded += 1
                if indexed and index is not None and completions is not None and index < completions:
                    done_indexes.add(index)
                continue
            verdict = pod_failure_policy.evaluate(spec.get("podFailurePolicy"), ended)
            if verdict is not None and verdict.action == "Ignore":
                continue
            failed += 1
            new_failure = True
            if verdict is not None and verdict.action == "FailJob" and finished is None:
                finished = ("Failed", "PodFailurePolicy", verdict.message)

        if finished is None and new_failure and failed > int(spec.get("backoffLimit", 6)):
            finished = ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif finished is None and _complete(indexed, completions, succeeded, done_indexes, active):
            finished = ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")

        suspended = bool(spec.get("suspend"))
        if finished is not None or suspended:
            doomed = active
        else:
            doomed, wanted = self._plan(spec, indexed, completions, succeeded, done_indexes, active)
            for index in wanted:
                created = await self.ctx.create_for(
                    job, PODS, namespace, pod_from_template(job, index), COMPONENT
                )
                self.ctx.event(
                    job,
                    "Normal",
                    "SuccessfulCreate",
                    f"Created pod: {created['metadata']['name']}",
                    COMPONENT,
                )
        for pod in doomed:
            if self.ctx.delete(PODS, namespace, pod["metadata"]["name"]):
                self.ctx.event(
                    job, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}", COMPONENT
                )
        self._write_status(job, succeeded, failed, done_indexes, finished)

    def _pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The pods the Job owns that its selector still matches."""
        match_labels = (job["spec"].get("selector") or {}).get("matchLabels") or {}
        selector = Selector(LabelSelector.from_match_labels(match_labels))
        return [
            p
            for p in self.ctx.store.owned_by(job["metadata"]["uid"], PODS, copy_objects=False)
            if selector.matches(p)
        ]

    def _plan(
        self,
        spec: dict[str, Any],
        indexed: bool,
        completions: int | None,
        succeeded: int,
        done_indexes: set[int],
        active: list[dict[str, Any]],
    ) -> tuple[list[dict[str, Any]], list[int | None]]:
        """The active pods to delete and the pods to create (their indexes) to reach parallelism."""
        parallelism = int(spec.get("parallelism", 1))
        if indexed:
            assert completions is not None  # validated on create
            doomed: list[dict[str, Any]] = []
            running: dict[int, dict[str, Any]] = {}
            for pod in sorted(active, key=lambda p: p["metadata"]["creationTimestamp"]):
                index = pod_index(pod)
                if index is None or index >= completions or index in done_indexes or index in running:
                    doomed.append(pod)  # no index, out of range, done already, or a duplicate
                else:
                    running[index] = pod
            want = min(parallelism, completions - len(done_indexes))
            if len(running) > want:
                surplus = sorted(running, reverse=True)[: len(running) - want]
                doomed += [running.pop(i) for i in surplus]
            missing = [i for i in range(completions) if i not in done_indexes and i not in running]
            return doomed, list(missing[: max(0, want - len(running))])
        if completions is None:
            want = 0 if succeeded > 0 else parallelism
        else:
            want = min(parallelism, max(0, completions - succeeded))
        if len(active) > want:
            ranked = sorted(active, key=lambda p: (pod_ready(p), p["metadata"]["creationTimestamp"]))
            return ranked[: len(active) - want], []
        return [], [None] * (want - len(active))

    def _write_status(
        self,
        job: dict[str, Any],
        succeeded: int,
        failed: int,
        done_indexes: set[int],
        finished: tuple[str, str, str] | None,
    ) -> None:
        pods = self._pods(job)
        active = [p for p in pods if pod_active(p)]
        terminating = [
            p
            for p in pods
            if p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") not in _PHASES
        ]
        suspended = bool(job["spec"].get("suspend"))
        events: list[tuple[str, str, str]] = []

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            now = rfc3339_now()
            status.update(
                active=len(active),
                ready=sum(1 for p in active if pod_ready(p)),
                succeeded=succeeded,
                failed=failed,
                terminating=len(terminating),
            )
            if obj["spec"].get("completionMode") == "Indexed":
                status["completedIndexes"] = format_indexes(done_indexes)
            if suspended:
                if set_condition(status, "Suspended", "True", "JobSuspended", "Job suspended"):
                    events.append(("Normal", "Suspended", "Job suspended"))
                if not active and not terminating:
                    # as upstream: a suspended Job whose pods are gone has not started, so its pod
                    # template's scheduling directives may change again (Kueue's re-admission)
                    status.pop("startTime", None)
            else:
                if set_condition_if_present(status, "Suspended", "False", "JobResumed", "Job resumed"):
                    events.append(("Normal", "Resumed", "Job resumed"))
                    status["startTime"] = now
                status.setdefault("startTime", now)
            if finished is not None:
                kind, reason, message = finished
                set_condition(status, kind, "True", reason, message)
                if kind == "Complete":
                    status["completionTime"] = now
                    events.append(("Normal", "Completed", "Job completed"))
                else:
                    events.append(("Warning", reason, message))

        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        written = self.ctx.store.mutate(JOBS, namespace, name, change)
        for kind, reason, message in events:
            self.ctx.event(written, kind, reason, message, COMPONENT)


def set_condition_if_present(
    status: dict[str, Any], kind: str, value: str, reason: str, message: str
) -> bool:
    """Upstream's ensureJobConditionStatus: a False condition is only written over an existing one."""
    if not any(c.get("type") == kind for c in status.get("conditions") or []):
        return False
    return set_condition(status, kind, value, reason, message)


def _complete(
    indexed: bool,
    completions: int | None,
    succeeded: int,
    done_indexes: set[int],
    active: list[dict[str, Any]],
) -> bool:
    if indexed:
        return completions is not None and len(done_indexes) >= completions
    if completions is None:
        return succeeded > 0 and not active
    return succeeded >= completions


def pod_index(pod: dict[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(
        COMPLETION_INDEX
    )
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def pod_from_template(job: dict[str, Any], index: int | None) -> dict[str, Any]:
    """The pod the Job controller creates: its template, owned by the Job, with its index."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    name = job["metadata"]["name"]
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    if index is not None:
        labels[COMPLETION_INDEX] = str(index)
        annotations[COMPLETION_INDEX] = str(index)
        if not spec.get("hostname"):
            spec["hostname"] = f"{name}-{index}"
        for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            env = container.setdefault("env", [])
            if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                env.append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {
                            "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}
                        },
                    }
                )
    metadata: dict[str, Any] = {
        "generateName": f"{name}-{index}-" if index is not None else f"{name}-",
        "namespace": job["metadata"]["namespace"],
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }
    if annotations:
        metadata["annotations"] = annotations
    if meta.get("finalizers"):
        metadata["finalizers"] = list(meta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def parse_indexes(text: str) -> set[int]:
    """`status.completedIndexes` ("0-2,5") as a set."""
    found: set[int] = set()
    for part in (text or "").split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def format_indexes(indexes: set[int]) -> str:
    ranges: list[str] = []
    ordered = sorted(indexes)
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        first, last = ordered[start], ordered[end]
        ranges.append(str(first) if first == last else f"{first}-{last}")
        start = end + 1
    return ",".join(ranges)
