"""The Deployment controller (apps/v1), after kube-controller-manager's.

Each pod template gets a ReplicaSet `<deployment>-<pod-template-hash>` (the hash in its selector,
labels and pod template's labels, the revision in `deployment.kubernetes.io/revision`). A new template
rolls out:
- `RollingUpdate`: the new ReplicaSet grows while all of them stay within replicas + maxSurge, and the
  old ones shrink while the available pods stay at or above replicas - maxUnavailable (upstream's
  formulas; percentages round up for the surge and down for unavailability);
- `Recreate`: the old ReplicaSets go to zero first, and the new one grows once their pods are gone.
Without a rollout, `spec.replicas` (the scale subresource writes it) scales the current ReplicaSet.
Status: replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas,
observedGeneration and the Available and Progressing conditions; old ReplicaSets at zero beyond
revisionHistoryLimit are deleted.

Left out: paused Deployments, proportional scaling during a rollout, minReadySeconds,
progressDeadlineSeconds and rollbacks.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from tessera.devcluster.apiserver.ownership import delete_dependents, owner_reference
from tessera.devcluster.apiserver.resources import DEPLOYMENTS, REPLICASETS
from tessera.devcluster.controllers.base import (
    Controller,
    Mapper,
    ObjectKey,
    own_key,
    owner_key,
    set_condition,
)

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
COMPONENT = "deployment-controller"
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class DeploymentController(Controller):
    name = COMPONENT

    def watches(self) -> list[tuple[Any, Mapper]]:
        return [(DEPLOYMENTS, self._deployment_event), (REPLICASETS, owner_key("Deployment"))]

    def _deployment_event(self, kind: str, deployment: dict[str, Any]) -> list[ObjectKey]:
        return [] if kind == "DELETED" else own_key(kind, deployment)

    async def reconcile(self, namespace: str, name: str) -> None:
        deployment = self.ctx.store.find(DEPLOYMENTS, namespace, name)
        if deployment is None or deployment["metadata"].get("deletionTimestamp"):
            return
        owned = self._replicasets(deployment)
        template_hash = pod_template_hash(deployment["spec"]["template"])
        new = next((rs for rs in owned if rs["metadata"]["labels"].get(HASH_LABEL) == template_hash), None)
        olds = sorted(
            (rs for rs in owned if rs is not new), key=lambda rs: rs["metadata"]["creationTimestamp"]
        )
        if new is None:
            new = await self._create_replicaset(deployment, template_hash, olds)
        wanted = int(deployment["spec"].get("replicas", 1))
        if deployment["spec"]["strategy"].get("type") == "Recreate":
            self._recreate(deployment, new, olds, wanted)
        else:
            self._roll(deployment, new, olds, wanted)
        self._clean_history(deployment, olds)
        self._write_status(deployment, template_hash)

    def _replicasets(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        owned = self.ctx.store.owned_by(deployment["metadata"]["uid"], REPLICASETS)
        uid = deployment["metadata"]["uid"]
        return [
            rs
            for rs in owned
            if any(
                r.get("uid") == uid and r.get("controller")
                for r in rs["metadata"].get("ownerReferences") or []
            )
        ]

    async def _create_replicaset(
        self, deployment: dict[str, Any], template_hash: str, olds: list[dict[str, Any]]
    ) -> dict[str, Any]:
        meta, spec = deployment["metadata"], deployment["spec"]
        template = copy.deepcopy(spec["template"])
        template.setdefault("metadata", {})["labels"] = {
            **(template["metadata"].get("labels") or {}),
            HASH_LABEL: template_hash,
        }
        revision = 1 + max(
            (int(rs["metadata"].get("annotations", {}).get(REVISION, 0)) for rs in olds), default=0
        )
        initial = int(spec.get("replicas", 1)) if not olds else 0
        body = {
            "metadata": {
                "name": f"{meta['name']}-{template_hash}",
                "labels": dict(template["metadata"]["labels"]),
                "annotations": {REVISION: str(revision)},
                "ownerReferences": [owner_reference(deployment)],
            },
            "spec": {
                "replicas": initial,
                "selector": {
                    "matchLabels": {
                        **((spec.get("selector") or {}).get("matchLabels") or {}),
                        HASH_LABEL: template_hash,
                    }
                },
                "template": template,
            },
        }
        created = await self.ctx.create_for(deployment, REPLICASETS, meta["namespace"], body, COMPONENT)
        self.ctx.event(
            deployment,
            "Normal",
            "ScalingReplicaSet",
            f"Scaled up replica set {created['metadata']['name']} from 0 to {initial}",
            COMPONENT,
        )
        return created

    def _recreate(
        self, deployment: dict[str, Any], new: dict[str, Any], olds: list[dict[str, Any]], wanted: int
    ) -> None:
        for old in olds:
            self._scale(deployment, old, 0)
        if all(int((old.get("status") or {}).get("replicas", 0)) == 0 for old in olds):
            self._scale(deployment, new, wanted)

    def _roll(
        self, deployment: dict[str, Any], new: dict[str, Any], olds: list[dict[str, Any]], wanted: int
    ) -> None:
        rolling = deployment["spec"]["strategy"].get("rollingUpdate") or {}
        surge = resolve(rolling.get("maxSurge", "25%"), wanted, round_up=True)
        unavailable = resolve(rolling.get("maxUnavailable", "25%"), wanted, round_up=False)
        if surge == 0 and unavailable == 0:
            unavailable = 1
        if not olds:
            self._scale(deployment, new, wanted)
            return
        new_replicas = _replicas(new)
        total = new_replicas + sum(_replicas(old) for old in olds)
        if new_replicas < wanted:
            room = wanted + surge - total
            if room > 0:
                new_replicas = min(wanted, new_replicas + room)
                self._scale(deployment, new, new_replicas)
        total = new_replicas + sum(_replicas(old) for old in olds)
        new_unavailable = new_replicas - int((new.get("status") or {}).get("availableReplicas", 0))
        can_remove = total - (wanted - unavailable) - new_unavailable
        for old in olds:
            if can_remove <= 0:
                break
            cut = min(_replicas(old), can_remove)
            if cut > 0:
                self._scale(deployment, old, _replicas(old) - cut)
                can_remove -= cut

    def _scale(self, deployment: dict[str, Any], replicaset: dict[str, Any], replicas: int) -> None:
        before = _replicas(replicaset)
        if before == replicas:
            return

        def change(obj: dict[str, Any]) -> None:
            obj["spec"]["replicas"] = replicas

        meta = replicaset["metadata"]
        replicaset.update(self.ctx.store.mutate(REPLICASETS, meta["namespace"], meta["name"], change))
        direction = "up" if replicas > before else "down"
        self.ctx.event(
            deployment,
            "Normal",
            "ScalingReplicaSet",
            f"Scaled {direction} replica set {meta['name']} from {before} to {replicas}",
            COMPONENT,
        )

    def _clean_history(self, deployment: dict[str, Any], olds: list[dict[str, Any]]) -> None:
        limit = int(deployment["spec"].get("revisionHistoryLimit", 10))
        idle = [
            rs for rs in olds if _replicas(rs) == 0 and int((rs.get("status") or {}).get("replicas", 0)) == 0
        ]
        for rs in idle[: max(0, len(idle) - limit)]:
            delete_dependents(self.ctx.store, rs["metadata"]["uid"])
            self.ctx.delete(REPLICASETS, rs["metadata"]["namespace"], rs["metadata"]["name"])

    def _write_status(self, deployment: dict[str, Any], template_hash: str) -> None:
        owned = self._replicasets(deployment)
        new = next((rs for rs in owned if rs["metadata"]["labels"].get(HASH_LABEL) == template_hash), None)

        def total(field: str) -> int:
            return sum(int((rs.get("status") or {}).get(field, 0)) for rs in owned)

        wanted = int(deployment["spec"].get("replicas", 1))
        rolling = deployment["spec"]["strategy"].get("rollingUpdate") or {}
        unavailable_allowed = resolve(rolling.get("maxUnavailable", "25%"), wanted, round_up=False)
        if deployment["spec"]["strategy"].get("type") == "Recreate":
            unavailable_allowed = 0
        available = total("availableReplicas")
        updated = int((new.get("status") or {}).get("replicas", 0)) if new else 0
        new_name = new["metadata"]["name"] if new else ""
        complete = updated == wanted and total("replicas") == wanted and available == wanted

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status.update(
                observedGeneration=obj["metadata"].get("generation", 1),
                replicas=total("replicas"),
                updatedReplicas=updated,
                readyReplicas=total("readyReplicas"),
                availableReplicas=available,
                unavailableReplicas=max(0, wanted - available),
            )
            if available >= wanted - unavailable_allowed:
                set_condition(
                    status,
                    "Available",
                    "True",
                    "MinimumReplicasAvailable",
                    "Deployment has minimum availability.",
                    probe=False,
                )
            else:
                set_condition(
                    status,
                    "Available",
                    "False",
                    "MinimumReplicasUnavailable",
                    "Deployment does not have minimum availability.",
                    probe=False,
                )
            if complete:
                reason, message = (
                    "NewReplicaSetAvailable",
                    f'ReplicaSet "{new_name}" has successfully progressed.',
                )
            else:
                reason, message = "ReplicaSetUpdated", f'ReplicaSet "{new_name}" is progressing.'
            set_condition(status, "Progressing", "True", reason, message, probe=False)
            if new is not None:
                obj["metadata"].setdefault("annotations", {})[REVISION] = new["metadata"]["annotations"][
                    REVISION
                ]

        meta = deployment["metadata"]
        self.ctx.store.mutate(DEPLOYMENTS, meta["namespace"], meta["name"], change)


def _replicas(replicaset: dict[str, Any]) -> int:
    return int(replicaset["spec"].get("replicas", 0))


def resolve(value: Any, total: int, *, round_up: bool) -> int:
    """An IntOrString such as 1 or "25%" against a replica count."""
    if isinstance(value, int):
        return value
    text = str(value)
    if text.endswith("%"):
        scaled = int(text[:-1]) * total / 100
        return math.ceil(scaled) if round_up else math.floor(scaled)
    return int(text)


def pod_template_hash(template: dict[str, Any]) -> str:
    """A stable short hash of the pod template (FNV-1a, written in the API server's safe alphabet)."""
    digest = 0x811C9DC5
    for byte in json.dumps(template, sort_keys=True, separators=(",", ":")).encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    text = []
    while digest:
        digest, remainder = divmod(digest, len(_SAFE_ALPHABET))
        text.append(_SAFE_ALPHABET[remainder])
    return "".join(text) or _SAFE_ALPHABET[0]
