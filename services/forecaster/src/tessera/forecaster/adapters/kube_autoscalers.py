"""PredictiveAutoscalers and what they own, through the official `kubernetes` client (synchronous: the
controller calls it from a worker thread). Objects are plain dicts: HPAs through `AutoscalingV2Api`,
scale targets through `AppsV1Api`, PredictiveAutoscalers and KEDA ScaledObjects through
`CustomObjectsApi`. Every call here is in the forecaster's RBAC table (libs/cluster rbac.py)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from tessera.cluster.kube import api_client
from tessera.forecaster.domain.autoscaler import GROUP, PLURAL, VERSION, AutoscalerSpec, TargetRef

HPA = ("autoscaling", "v2", "horizontalpodautoscalers")
#: the scale targets it can check: the apps/v1 kinds with a /scale subresource
TARGET_KINDS = ("Deployment", "StatefulSet", "ReplicaSet")


class NotOwned(RuntimeError):
    """An object of the name exists and another controller owns it: it is left alone."""


class UnsupportedTarget(ValueError):
    """A scale target of a kind the controller cannot read (its RBAC covers the apps/v1 kinds)."""


class KubeAutoscalers:
    def __init__(self, kubeconfig: Path | None = None, *, url: str | None = None) -> None:
        from kubernetes import client

        self._api = api_client(url=url) if url else api_client(kubeconfig=str(kubeconfig))
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)
        self._apps = client.AppsV1Api(self._api)
        self._autoscaling = client.AutoscalingV2Api(self._api)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def list(self) -> list[dict[str, Any]]:
        """Every PredictiveAutoscaler; none where the cluster does not serve them (the CRD not installed)."""
        try:
            listing: Any = self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        except Exception as exc:
            _missing(exc)
            return []
        return list(listing.get("items") or [])

    def target_exists(self, namespace: str, ref: TargetRef) -> bool:
        if ref.api_version != "apps/v1" or ref.kind not in TARGET_KINDS:
            kinds = ", ".join(TARGET_KINDS)
            raise UnsupportedTarget(
                f"scaleTargetRef must be an apps/v1 {kinds}, not {ref.api_version} {ref.kind}"
            )
        read = {
            "Deployment": self._apps.read_namespaced_deployment,
            "StatefulSet": self._apps.read_namespaced_stateful_set,
            "ReplicaSet": self._apps.read_namespaced_replica_set,
        }[ref.kind]
        try:
            read(ref.name, namespace, _preload_content=False)
        except Exception as exc:
            return _missing(exc)
        return True

    def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the cluster serves a resource (KEDA's ScaledObjects need KEDA installed)."""
        try:
            listing: Any = self._custom.get_api_resources(group, version)
        except Exception as exc:
            return _missing(exc)
        return any(r.name == plural for r in (listing.resources or []))

    def _get(self, gvp: tuple[str, str, str], namespace: str, name: str) -> dict[str, Any] | None:
        try:
            if gvp == HPA:
                response: Any = self._autoscaling.read_namespaced_horizontal_pod_autoscaler(
                    name, namespace, _preload_content=False
                )
                return cast(dict[str, Any], json.loads(response.data))
            found: Any = self._custom.get_namespaced_custom_object(*gvp[:2], namespace, gvp[2], name)
        except Exception as exc:
            _missing(exc)
            return None
        return cast(dict[str, Any], found)

    def _create(self, gvp: tuple[str, str, str], namespace: str, body: dict[str, Any]) -> None:
        if gvp == HPA:
            self._autoscaling.create_namespaced_horizontal_pod_autoscaler(
                namespace, cast(Any, body), _preload_content=False
            )
        else:
            self._custom.create_namespaced_custom_object(*gvp[:2], namespace, gvp[2], body)

    def _replace(self, gvp: tuple[str, str, str], namespace: str, name: str, body: dict[str, Any]) -> None:
        if gvp == HPA:
            self._autoscaling.replace_namespaced_horizontal_pod_autoscaler(
                name, namespace, cast(Any, body), _preload_content=False
            )
        else:
            self._custom.replace_namespaced_custom_object(*gvp[:2], namespace, gvp[2], name, body)

    def _delete(self, gvp: tuple[str, str, str], namespace: str, name: str) -> None:
        if gvp == HPA:
            self._autoscaling.delete_namespaced_horizontal_pod_autoscaler(
                name, namespace, _preload_content=False
            )
        else:
            self._custom.delete_namespaced_custom_object(*gvp[:2], namespace, gvp[2], name)

    def apply(
        self, gvp: tuple[str, str, str], desired: dict[str, Any], owner_uid: str, *, create: bool = True
    ) -> str:
        """Create the owned object (unless `create` is false: then `absent`), or bring its spec back to
        `desired`; returns what it did."""
        meta = desired["metadata"]
        existing = self._get(gvp, meta["namespace"], meta["name"])
        if existing is None:
            if not create:
                return "absent"
            self._create(gvp, meta["namespace"], desired)
            return "created"
        if not _owned_by(existing, owner_uid):
            raise NotOwned(f"{desired['kind']} {meta['namespace']}/{meta['name']} is not owned by it")
        if covers(existing.get("spec") or {}, desired["spec"]):
            return "unchanged"  # fields the server defaults (a real HPA's behavior policies) are left be
        self._replace(gvp, meta["namespace"], meta["name"], {**existing, "spec": desired["spec"]})
        return "updated"

    def remove(self, gvp: tuple[str, str, str], namespace: str, name: str, owner_uid: str) -> bool:
        """Delete the object it owns under this name, if any; another's object is left alone."""
        existing = self._get(gvp, namespace, name)
        if existing is None or not _owned_by(existing, owner_uid):
            return False
        self._delete(gvp, namespace, name)
        return True

    def write_status(self, pa: AutoscalerSpec, status: dict[str, Any]) -> None:
        self._custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, pa.namespace, PLURAL, pa.name, {"status": status}
        )

    def event(self, pa: AutoscalerSpec, kind: str, reason: str, message: str, now: datetime) -> None:
        """A core/v1 Event on the PredictiveAutoscaler, as `kubectl describe` shows them."""
        stamp = now.isoformat().replace("+00:00", "Z")
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pa.name}.{uuid.uuid4().hex[:12]}", "namespace": pa.namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "PredictiveAutoscaler",
                "name": pa.name,
                "namespace": pa.namespace,
                "uid": pa.uid,
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "tessera-forecaster"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._core.create_namespaced_event(pa.namespace, body)


def covers(stored: Any, desired: Any) -> bool:
    """Whether `stored` holds everything `desired` sets: a mapping's keys recursively, so what the API
    server adds by default (an HPA's scaleUp policies, selectPolicy) is no drift, while anything else
    (a list, a number, a string) must be equal as a whole."""
    if isinstance(desired, dict):
        return isinstance(stored, dict) and all(
            key in stored and covers(stored[key], value) for key, value in desired.items()
        )
    return bool(stored == desired)


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def _missing(exc: Exception) -> bool:
    """False for a 404 (it does not exist); anything else is raised again."""
    if getattr(exc, "status", None) == 404:
        return False
    raise exc
