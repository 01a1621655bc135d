"""Jobs' Kubernetes objects through the official client: create, suspend or unsuspend, delete.

The client is synchronous; each call runs on a worker thread. A Job is patched only when the API
shows it otherwise (read, then a merge patch guarded by its resourceVersion), so unsuspending
what already runs changes nothing and a conflict is tried again in the next round. The patch that
unsuspends a Job also puts its pods on their flavor's nodes (`domain.flavor_placement`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tessera.admission.domain.flavor_placement import (
    FlavorPlacement,
    jobset_placed,
    pod_release_spec,
    template_patch,
)
from tessera.admission.domain.job_conditions import Condition, merged
from tessera.admission.domain.kube_objects import JobObjects
from tessera.admission.domain.native_jobsets import JOBSET_API
from tessera.admission.domain.native_lws import LWS_API
from tessera.admission.domain.native_pods import gated, without_gate
from tessera.admission.domain.reconcile import ClusterView
from tessera.admission.domain.webhook import LWS_NAME_LABEL, QUEUE_LABEL
from tessera.admission.service_layer.ports import WorkloadError, WorkloadGone
from tessera.cluster.conventions.names import JOB_ID_LABEL

ABSENT = 404
EXISTS = 409
MERGE_PATCH = "application/merge-patch+json"


class KubeWorkloads:
    """The `WorkloadCluster` port on a Kubernetes API server."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._core: Any = k8s.CoreV1Api(api)
        self._batch: Any = k8s.BatchV1Api(api)
        self._scheduling: Any = k8s.SchedulingV1Api(api)
        self._custom: Any = k8s.CustomObjectsApi(api)

    async def create(self, objects: JobObjects) -> None:
        ns = objects.namespace
        await _call(self._core.create_namespaced_service, ns, objects.service, ok=(EXISTS,))
        for job in objects.jobs:
            await _call(self._batch.create_namespaced_job, ns, job, ok=(EXISTS,))

    async def set_suspended(
        self,
        namespace: str,
        jobs: Sequence[str],
        suspended: bool,
        placements: Mapping[str, FlavorPlacement] | None = None,
    ) -> list[str]:
        changed = []
        for name in jobs:
            answer = await _call(
                self._batch.read_namespaced_job, name, namespace, ok=(ABSENT,), _preload_content=False
            )
            if answer is None:
                raise WorkloadGone(f"job {namespace}/{name} is gone from the cluster")
            current = json.loads(answer.data)
            if bool((current.get("spec") or {}).get("suspend")) == suspended:
                continue
            patch: dict[str, Any] = {}
            placement = (placements or {}).get(name)
            if placement is not None and not suspended:
                patch = template_patch(current, placement) or {}
            patch.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            patch.setdefault("spec", {})["suspend"] = suspended
            await _call(self._batch.patch_namespaced_job, name, namespace, patch, _content_type=MERGE_PATCH)
            changed.append(name)
        return changed

    async def set_conditions(
        self, namespace: str, job: str, conditions: Sequence[Condition]
    ) -> list[Condition]:
        return await self._set_conditions(
            "job",
            self._batch.read_namespaced_job_status,
            self._batch.patch_namespaced_job_status,
            namespace,
            job,
            conditions,
        )

    async def set_pod_conditions(
        self, namespace: str, pod: str, conditions: Sequence[Condition]
    ) -> list[Condition]:
        return await self._set_conditions(
            "pod",
            self._core.read_namespaced_pod_status,
            self._core.patch_namespaced_pod_status,
            namespace,
            pod,
            conditions,
        )

    async def _set_conditions(
        self,
        what: str,
        read: Callable[..., Any],
        write: Callable[..., Any],
        namespace: str,
        name: str,
        conditions: Sequence[Condition],
    ) -> list[Condition]:
        answer = await _call(read, name, namespace, ok=(ABSENT,), _preload_content=False)
        if answer is None:
            raise WorkloadGone(f"{what} {namespace}/{name} is gone from the cluster")
        current = json.loads(answer.data)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        change = merged((current.get("status") or {}).get("conditions") or [], conditions, now)
        if change is None:
            return []
        written, changed = change
        patch = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "status": {"conditions": written},
        }
        await _call(write, name, namespace, patch, _content_type=MERGE_PATCH)
        return changed

    async def event(
        self,
        namespace: str,
        job: str,
        kind: str,
        reason: str,
        message: str,
        involved: str = "Job",
        name: str | None = None,
    ) -> None:
        uid = await self._uid(involved, namespace, job)
        if uid is None:
            return  # gone: nothing left to describe
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name or f"{job}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": _API_VERSIONS.get(involved, "batch/v1"),
                "kind": involved,
                "name": job,
                "namespace": namespace,
                "uid": uid,  # kubectl describe lists only the Events whose object has the uid it shows
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "tessera-admission"},
            "reportingComponent": "tessera-admission",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        # An Event of a given name is told once: it exists already (409), so it was told.
        await _call(self._core.create_namespaced_event, namespace, body, ok=(EXISTS,) if name else ())

    async def _read(self, involved: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object of kind ``involved`` (Job, Pod, JobSet or LeaderWorkerSet); ``None`` when gone."""
        if involved in _CUSTOM:
            group, version, plural = _CUSTOM[involved]
            answer = await _call(
                self._custom.get_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                name,
                ok=(ABSENT,),
                _preload_content=False,
            )
        else:
            read = self._core.read_namespaced_pod if involved == "Pod" else self._batch.read_namespaced_job
            answer = await _call(read, name, namespace, ok=(ABSENT,), _preload_content=False)
        return None if answer is None else dict(json.loads(answer.data))

    async def _uid(self, involved: str, namespace: str, name: str) -> str | None:
        found = await self._read(involved, namespace, name)
        return None if found is None else str(found["metadata"]["uid"])

    async def priority_classes(self) -> list[dict[str, Any]]:
        answer = await _call(self._scheduling.list_priority_class, ok=(ABSENT,), _preload_content=False)
        if answer is None:
            return []
        items: list[dict[str, Any]] = json.loads(answer.data)["items"]
        return items

    async def labelled_jobsets(self) -> list[dict[str, Any]]:
        group, version, plural = JOBSET_API
        answer = await _call(
            self._custom.list_cluster_custom_object,
            group,
            version,
            plural,
            label_selector=QUEUE_LABEL,
            ok=(ABSENT,),
            _preload_content=False,
        )
        return [] if answer is None else list(json.loads(answer.data)["items"])

    async def set_jobset_suspended(
        self, namespace: str, name: str, suspended: bool, placements: Sequence[FlavorPlacement | None]
    ) -> bool:
        group, version, plural = JOBSET_API
        current = await self._read("JobSet", namespace, name)
        if current is None:
            raise WorkloadGone(f"jobset {namespace}/{name} is gone from the cluster")
        if bool((current.get("spec") or {}).get("suspend")) == suspended:
            return False
        patch: dict[str, Any] = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}}
        rjobs = (current.get("spec") or {}).get("replicatedJobs") or []
        placed = [] if suspended else jobset_placed(rjobs, placements)
        patch["spec"] = {"suspend": suspended, **({"replicatedJobs": placed} if placed else {})}
        await _call(
            self._custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            patch,
            _content_type=MERGE_PATCH,
        )
        return True

    async def lws_pods(self) -> list[dict[str, Any]]:
        """The pods of LeaderWorkerSets whose templates carry the queue label."""
        return await self._labelled(self._core.list_pod_for_all_namespaces, f"{QUEUE_LABEL},{LWS_NAME_LABEL}")

    async def leaderworkersets(self) -> list[dict[str, Any]]:
        """Every LeaderWorkerSet; none where the API does not serve them."""
        group, version, plural = LWS_API
        answer = await _call(
            self._custom.list_cluster_custom_object,
            group,
            version,
            plural,
            ok=(ABSENT,),
            _preload_content=False,
        )
        return [] if answer is None else list(json.loads(answer.data)["items"])

    async def label_pods(
        self, namespace: str, labels: Mapping[str, Mapping[str, str]], release: bool
    ) -> list[str]:
        """Give each named pod its labels, and with ``release`` remove admission's scheduling gate, in
        one patch per pod (so no scheduler sees it ungated without them); returns the pods changed.
        A pod found gone is skipped: its group is made again."""
        changed = []
        for name, wanted in labels.items():
            answer = await _call(
                self._core.read_namespaced_pod, name, namespace, ok=(ABSENT,), _preload_content=False
            )
            if answer is None:
                continue
            current = json.loads(answer.data)
            have = current["metadata"].get("labels") or {}
            patch: dict[str, Any] = {}
            if any(have.get(k) != v for k, v in wanted.items()):
                patch["metadata"] = {"labels": dict(wanted)}
            if release and gated(current):
                patch["spec"] = {"schedulingGates": without_gate(current["spec"].get("schedulingGates"))}
            if not patch:
                continue
            patch.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            await _call(self._core.patch_namespaced_pod, name, namespace, patch, _content_type=MERGE_PATCH)
            changed.append(name)
        return changed

    async def labelled_jobs(self) -> list[dict[str, Any]]:
        answer = await _call(
            self._batch.list_job_for_all_namespaces, label_selector=QUEUE_LABEL, _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(answer.data)["items"]
        return items

    async def labelled_pods(self) -> list[dict[str, Any]]:
        selector = f"{QUEUE_LABEL},{JOB_ID_LABEL}"
        return await self._labelled(self._core.list_pod_for_all_namespaces, selector)

    async def release_pods(
        self, namespace: str, pods: Sequence[str], placement: FlavorPlacement | None = None
    ) -> list[str]:
        changed = []
        for name in pods:
            answer = await _call(
                self._core.read_namespaced_pod, name, namespace, ok=(ABSENT,), _preload_content=False
            )
            if answer is None:
                raise WorkloadGone(f"pod {namespace}/{name} is gone from the cluster")
            current = json.loads(answer.data)
            if not gated(current):
                continue
            placed = pod_release_spec(current["spec"], placement) if placement is not None else {}
            patch = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "spec": {"schedulingGates": without_gate(current["spec"].get("schedulingGates")), **placed},
            }
            await _call(self._core.patch_namespaced_pod, name, namespace, patch, _content_type=MERGE_PATCH)
            changed.append(name)
        return changed

    async def job_views(self) -> dict[str, ClusterView]:
        pods = await self._labelled(self._core.list_pod_for_all_namespaces, JOB_ID_LABEL)
        jobs = await self._labelled(self._batch.list_job_for_all_namespaces, JOB_ID_LABEL)
        phases: dict[str, list[str]] = {}
        for pod in pods:
            job_id = pod["metadata"]["labels"][JOB_ID_LABEL]
            phases.setdefault(job_id, []).append(pod.get("status", {}).get("phase") or "Pending")
        counts = Counter(job["metadata"]["labels"][JOB_ID_LABEL] for job in jobs)
        return {
            job_id: ClusterView(tuple(phases.get(job_id, ())), counts.get(job_id, 0))
            for job_id in phases.keys() | counts.keys()
        }

    @staticmethod
    async def _labelled(list_all: Callable[..., Any], label: str) -> list[dict[str, Any]]:
        """Every object ``list_all`` serves with ``label`` set, as JSON (no model conversion)."""
        answer = await _call(list_all, label_selector=label, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(answer.data)["items"]
        return items

    async def delete(self, namespace: str, objects: Sequence[tuple[str, str]]) -> None:
        body = k8s.V1DeleteOptions(propagation_policy="Background")
        for kind, name in objects:
            if kind == "Job":
                await _call(self._batch.delete_namespaced_job, name, namespace, body=body, ok=(ABSENT,))
            elif kind == "Pod":
                await _call(self._core.delete_namespaced_pod, name, namespace, ok=(ABSENT,))
            elif kind == "JobSet":
                group, version, plural = JOBSET_API
                await _call(
                    self._custom.delete_namespaced_custom_object,
                    group,
                    version,
                    namespace,
                    plural,
                    name,
                    body=body,
                    ok=(ABSENT,),
                )
            elif kind == "Service":
                await _call(self._core.delete_namespaced_service, name, namespace, ok=(ABSENT,))


_CUSTOM = {"JobSet": JOBSET_API, "LeaderWorkerSet": LWS_API}
_API_VERSIONS = {"Pod": "v1", **{kind: f"{api[0]}/{api[1]}" for kind, api in _CUSTOM.items()}}


async def _call(method: Callable[..., Any], *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> Any:
    """The call on a worker thread; None for a status in ``ok``; other failures as `WorkloadError`."""

    def run() -> Any:
        try:
            return method(*args, **kwargs)
        except ApiException as error:
            if error.status in ok:
                return None
            raise WorkloadError(f"{method.__name__}: {error.status} {error.reason}: {error.body}") from error
        except (OSError, urllib3.exceptions.HTTPError) as error:  # the API server does not answer
            raise WorkloadError(f"{method.__name__}: {error}") from error

    return await asyncio.to_thread(run)
