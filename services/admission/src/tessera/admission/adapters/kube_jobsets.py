"""Users' JobSets' `status.conditions` through the official client (`jobsets/status`).

A JobSet's conditions are `metav1.Condition`s, kept by the JobSet controller (`Suspended`,
`Completed`, `Failed`, ...); admission writes its own four types beside them (`domain.job_conditions`)
with a JSON merge patch of the status subresource, guarded by the resourceVersion it read, so a
controller's write in between is never overwritten: the patch is refused (409) and the next round
reads again. `KubeCluster` is the whole `WorkloadCluster` port: `KubeWorkloads` plus this.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from tessera.admission.adapters.kube import ABSENT, MERGE_PATCH, KubeWorkloads, _call
from tessera.admission.domain.job_conditions import Condition, merged
from tessera.admission.domain.native_jobsets import JOBSET_API
from tessera.admission.service_layer.ports import WorkloadGone
from tessera.core import faults


class KubeJobSetConditions:
    """Admission's conditions in JobSets' status."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._custom: Any = k8s.CustomObjectsApi(api)

    async def set_jobset_conditions(
        self, namespace: str, name: str, conditions: Sequence[Condition]
    ) -> list[Condition]:
        group, version, plural = JOBSET_API
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
        if answer is None:
            raise WorkloadGone(f"jobset {namespace}/{name} is gone from the cluster")
        current = json.loads(answer.data)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        existing = (current.get("status") or {}).get("conditions") or []
        change = merged(existing, conditions, now, probe=False)
        if change is None:
            return []
        written, changed = change
        patch = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "status": {"conditions": written},
        }
        await _call(
            self._custom.patch_namespaced_custom_object_status,
            group,
            version,
            namespace,
            plural,
            name,
            patch,
            _content_type=MERGE_PATCH,
        )
        return changed


class KubeCluster(KubeWorkloads):
    """The `WorkloadCluster` port on a Kubernetes API server: jobs' objects (`KubeWorkloads`) and
    JobSets' conditions (`KubeJobSetConditions`), on one API client."""

    def __init__(self, api: k8s.ApiClient) -> None:
        super().__init__(api)
        self._jobset_conditions = KubeJobSetConditions(api)

    async def set_jobset_conditions(
        self, namespace: str, name: str, conditions: Sequence[Condition]
    ) -> list[Condition]:
        return await self._jobset_conditions.set_jobset_conditions(namespace, name, conditions)

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
        # Crash tests: `admission.event.Preempted` kills the process as it tells of a change it has
        # just made on the cluster (a Job suspended), before the change is recorded.
        faults.hit(f"admission.event.{reason}")
        await super().event(namespace, job, kind, reason, message, involved, name)
