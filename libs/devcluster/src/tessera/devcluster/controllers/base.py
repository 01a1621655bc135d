"""What the devcluster's workload controllers share: a level-triggered reconcile loop, conditions, Events.

A controller watches its resources in the API server's store; each event names the objects to
reconcile (the object itself, or the owner of a pod), and a worker reconciles each named object
once per wake-up, from what the store holds then, as kube-controller-manager's controllers do.
Objects a controller creates go through the mutating admission webhooks, as they would through
the API: a webhook that gates or suspends pods sees the pods of Deployments and Jobs too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import EVENTS, ResourceType
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.apiserver.webhooks import MutatingWebhooks

log = logging.getLogger(__name__)

ObjectKey = tuple[str, str]  # namespace, name
Mapper = Callable[[str, dict[str, Any]], Iterable[ObjectKey]]
"""An event's type and object -> the keys to reconcile; it must not change the object (the store's own)."""
RETRY_SECONDS = 1.0  # wall-clock seconds before a reconcile that failed (a refused create) runs again


@dataclass
class ControllerContext:
    store: ObjectStore
    webhooks: MutatingWebhooks | None = None

    async def create(self, resource: ResourceType, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create as a client of the API would: through the mutating webhooks, then the store."""
        if self.webhooks is not None:
            body = await self.webhooks.admit_create(resource, namespace, body)
        return self.store.create(resource, namespace, body)

    def delete(self, resource: ResourceType, namespace: str, name: str) -> bool:
        try:
            self.store.delete(resource, namespace, name)
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    async def create_for(
        self,
        owner: dict[str, Any],
        resource: ResourceType,
        namespace: str,
        body: dict[str, Any],
        component: str,
    ) -> dict[str, Any]:
        """Create on the owner's behalf; a refusal (a webhook's, say) becomes a FailedCreate Event on
        the owner, as upstream controllers record it, and is raised for the reconcile to retry."""
        try:
            return await self.create(resource, namespace, body)
        except ApiError as exc:
            self.event(owner, "Warning", "FailedCreate", f"Error creating: {exc.message}", component)
            raise

    def event(self, involved: dict[str, Any], kind: str, reason: str, message: str, component: str) -> None:
        """A core/v1 Event about the object, as `kubectl describe` lists them. The same event again
        counts up on the first one (the event correlator's aggregation) instead of adding another."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        digest = hashlib.sha256(f"{meta.get('uid')}|{kind}|{reason}|{message}".encode()).hexdigest()[:16]
        name = f"{meta['name']}.{digest}"
        now = rfc3339_now()

        def again(event: dict[str, Any]) -> None:
            event["count"] = int(event.get("count", 1)) + 1
            event["lastTimestamp"] = now

        try:
            self.store.mutate(EVENTS, namespace, name, again)
            return
        except ApiError as exc:
            if exc.code != 404:
                raise
        self.store.create(
            EVENTS,
            namespace,
            {
                "metadata": {"name": name},
                "involvedObject": {
                    "apiVersion": involved.get("apiVersion"),
                    "kind": involved.get("kind"),
                    "name": meta["name"],
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "source": {"component": component},
                "reportingComponent": component,
                "reportingInstance": component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )


class Controller:
    """Subclasses name what they watch (`watches`) and reconcile one object (`reconcile`)."""

    name = "controller"

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self._wake = asyncio.Event()
        self._pending: dict[ObjectKey, None] = {}

    def watches(self) -> list[tuple[ResourceType, Mapper]]:
        raise NotImplementedError

    async def reconcile(self, namespace: str, name: str) -> None:
        raise NotImplementedError

    def enqueue(self, key: ObjectKey) -> None:
        self._pending[key] = None
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._watch(rtype, mapper)) for rtype, mapper in self.watches()]
        try:
            await self._work()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _watch(self, rtype: ResourceType, mapper: Mapper) -> None:
        watch = self.ctx.store.watch(rtype)
        try:
            # Mappers only read: they are given the store's own object, not a copy (the store
            # replaces an object on every write and never changes one), so the devcluster does
            # not deep-copy every pod event once per controller watching pods.
            while (event := await watch.next(copy_object=False)) is not None:
                for key in mapper(event["type"], event["object"]):
                    self.enqueue(key)
        finally:
            watch.close()

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            keys, self._pending = list(self._pending), {}
            for namespace, name in keys:
                try:
                    await self.reconcile(namespace, name)
                except ApiError as exc:
                    log.warning("%s: %s/%s: %s; retrying", self.name, namespace, name, exc.message)
                    self._retry((namespace, name))
                except Exception:
                    log.exception("%s: reconciling %s/%s failed; retrying", self.name, namespace, name)
                    self._retry((namespace, name))

    def _retry(self, key: ObjectKey) -> None:
        asyncio.get_running_loop().call_later(RETRY_SECONDS, self.enqueue, key)


def own_key(kind: str, obj: dict[str, Any]) -> list[ObjectKey]:
    meta = obj.get("metadata") or {}
    return [(str(meta.get("namespace") or ""), str(meta.get("name")))]


def owner_key(owner_kind: str) -> Mapper:
    """Maps an event of an owned object to its controller of `owner_kind`."""

    def mapper(kind: str, obj: dict[str, Any]) -> list[ObjectKey]:
        meta = obj.get("metadata") or {}
        for ref in meta.get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") == owner_kind:
                return [(str(meta.get("namespace") or ""), str(ref.get("name")))]
        return []

    return mapper


def set_condition(
    status: dict[str, Any], kind: str, value: str, reason: str, message: str, *, probe: bool = True
) -> bool:
    """Set a condition; the transition time changes only when its status does. `probe` writes
    lastProbeTime too (Job conditions have it; metav1.Conditions do not). Returns whether anything
    changed."""
    now = rfc3339_now()
    conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
    for condition in conditions:
        if condition.get("type") != kind:
            continue
        if (condition.get("status"), condition.get("reason"), condition.get("message")) == (
            value,
            reason,
            message,
        ):
            return False
        if condition.get("status") != value:
            condition["lastTransitionTime"] = now
        condition.update(status=value, reason=reason, message=message)
        if probe:
            condition["lastProbeTime"] = now
        return True
    added = {"type": kind, "status": value, "reason": reason, "message": message, "lastTransitionTime": now}
    if probe:
        added["lastProbeTime"] = now
    conditions.append(added)
    return True


def condition_true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def condition_present(obj: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind for c in (obj.get("status") or {}).get("conditions") or [])


def pod_ready(pod: dict[str, Any]) -> bool:
    return condition_true(pod, "Ready")


def pod_active(pod: dict[str, Any]) -> bool:
    """Neither ended nor being deleted."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")
