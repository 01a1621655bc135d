"""PodGroup status follows its pods, as the scheduler-plugins PodGroup controller keeps it, so
`kubectl get podgroups` shows each gang's phase and how many of its members run.

A background task of the scheduler (with a cluster): every pod or PodGroup change the scheduler's
watches see marks the group; every `INTERVAL_S` the marked groups' status is computed from their
pods in the watch cache and written with a merge patch of the `status` subresource, only when it
changed; every group is looked at again each minute. The counts and the phase follow the upstream controller (pkg/controllers/podgroup_controller.go):

- `scheduled`: members bound to a node; `running`, `succeeded`, `failed`: members in that phase;
- phase `Pending` while fewer than `minMember` members exist, `PreScheduling` once they do, until
  `minMember` are bound (`Scheduled`), `Running` once running + succeeded reach `minMember`,
  `Failed` when some failed and failed + running + succeeded reach it, `Finished` when succeeded do;
- a group that has `Finished` or `Failed` keeps that phase (upstream stops reconciling it).

`scheduleStartTime` is set when the group first leaves `Pending`. Every replica writes the same
status, so a follower's write is harmless; a failed write is logged (rate limited) and retried in
the next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from tessera.cluster.domain import Pod, PodGroup, PodPhase
from tessera.cluster.kube import api_client
from tessera.cluster.port import WatchEvent
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.core.waits import wait_any
from tessera.scheduler.service_layer.dependencies import SchedulerDeps

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
INTERVAL_S = 1.0
RESYNC_S = 60.0
FINAL = ("Finished", "Failed")


def members(pods: Iterable[Pod], group: PodGroup) -> list[Pod]:
    """Every pod of the group, ended ones included (they count as succeeded or failed)."""
    return [p for p in pods if p.namespace == group.namespace and p.pod_group == group.name]


def status_of(group: PodGroup, pods: list[Pod]) -> dict[str, Any]:
    """The status the group's pods give it (without `scheduleStartTime`)."""
    running = sum(1 for p in pods if p.phase is PodPhase.RUNNING)
    succeeded = sum(1 for p in pods if p.phase is PodPhase.SUCCEEDED)
    failed = sum(1 for p in pods if p.phase is PodPhase.FAILED)
    scheduled = sum(1 for p in pods if p.node_name)
    need = group.min_member
    if group.phase in FINAL:
        phase = group.phase
    elif succeeded >= need:
        phase = "Finished"
    elif failed and failed + running + succeeded >= need:
        phase = "Failed"
    elif running + succeeded >= need:
        phase = "Running"
    elif scheduled >= need:
        phase = "Scheduled"
    elif len(pods) >= need:
        phase = "PreScheduling"
    else:
        phase = "Pending"
    return {
        "phase": phase,
        "scheduled": scheduled,
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
    }


class PodGroupStatusWriter:
    """Marks groups from watch events; writes the changed statuses of the marked ones."""

    def __init__(self, patch: Any) -> None:
        self._patch = patch
        """patch(namespace, name, status): the merge patch of the status subresource (blocking)."""
        self.dirty: set[str] = set()
        self.written: dict[str, dict[str, Any]] = {}
        self.failures = RateLimitedLog(log)

    def on_event(self, kind: str, event: WatchEvent[Any]) -> None:
        obj = event.object
        if kind == "podgroup":
            self.dirty.add(obj.key)
        elif kind == "pod" and getattr(obj, "pod_group", None):
            self.dirty.add(f"{obj.namespace}/{obj.pod_group}")

    async def write(self, groups: Mapping[str, PodGroup], pods: Iterable[Pod]) -> int:
        """Write the status of each marked group that changed; how many were written."""
        marked, self.dirty = self.dirty, set()
        all_pods = list(pods)
        done = 0
        for key in sorted(marked):
            group = groups.get(key)
            if group is None:
                self.written.pop(key, None)
                continue
            status = status_of(group, members(all_pods, group))
            if self.written.get(key) == status and status["phase"] == group.phase:
                continue
            body = dict(status)
            if (
                status["phase"] != "Pending"
                and self.written.get(key, {}).get("phase", "Pending") == "Pending"
            ):
                body["scheduleStartTime"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            try:
                await asyncio.to_thread(self._patch, group.namespace, group.name, body)
            except Exception as exc:  # the API away or the group gone: the next round tries again
                self.dirty.add(key)
                self.failures.warning(
                    "patch", "writing a PodGroup's status failed", extra={"podgroup": key, "error": repr(exc)}
                )
                continue
            self.written[key] = status
            done += 1
        return done


def status_patcher(kubeconfig: str) -> Any:
    """A blocking merge patch of a PodGroup's status through the official client."""
    from kubernetes import client as k8s

    custom: Any = k8s.CustomObjectsApi(api_client(kubeconfig=kubeconfig))

    def patch(namespace: str, name: str, status: dict[str, Any]) -> None:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status}, _request_timeout=10
        )

    return patch


async def keep_podgroup_status(deps: SchedulerDeps) -> None:
    """The background task: nothing to do without a cluster. Every group is looked at again every
    `RESYNC_S` (and first once the watches have listed), as a controller's resync would."""
    connection, kubeconfig = deps.cluster, deps.engine.settings.kubeconfig
    if connection is None or kubeconfig is None:
        return
    writer = PodGroupStatusWriter(status_patcher(str(kubeconfig)))
    connection.side.subscribe(writer.on_event)
    cache = connection.side.cache
    loop = asyncio.get_running_loop()
    resynced_at: float | None = None
    while not await wait_any(deps.ctx.stop, timeout=INTERVAL_S):
        if cache.pod_groups.store and (resynced_at is None or loop.time() - resynced_at >= RESYNC_S):
            writer.dirty.update(cache.pod_groups.store)
            resynced_at = loop.time()
        if writer.dirty:
            await writer.write(cache.pod_groups.store, cache.pods.store.values())
