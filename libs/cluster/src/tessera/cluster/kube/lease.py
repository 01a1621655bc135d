"""A ``coordination.k8s.io/v1`` Lease as the lock of leader election, through the official client.

Reads and writes go through ``CoordinationV1Api`` on a thread of their own, with the raw JSON parsed
here (as :class:`~tessera.cluster.kube.adapter.KubernetesCluster` does). An update carries the
``resourceVersion`` it read, so the API server refuses it (409) when someone wrote in between:
that is what makes two candidates never both win.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tessera.cluster.kube.errors import translate
from tessera.cluster.leader import LeaseRecord
from tessera.cluster.port import NotFound

LEASE_API_VERSION = "coordination.k8s.io/v1"
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_micro_time(value: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return value.astimezone(UTC).strftime(_MICRO_TIME)


def parse_micro_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def lease_record(raw: dict[str, Any]) -> LeaseRecord:
    spec = raw.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or None,
        lease_duration_s=float(spec.get("leaseDurationSeconds") or 0),
        acquire_time=parse_micro_time(spec.get("acquireTime")),
        renew_time=parse_micro_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=(raw.get("metadata") or {}).get("resourceVersion"),
    )


def lease_body(namespace: str, name: str, record: LeaseRecord) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version
    spec: dict[str, Any] = {
        "holderIdentity": record.holder or "",
        "leaseDurationSeconds": max(1, round(record.lease_duration_s)),
        "leaseTransitions": record.transitions,
    }
    if record.acquire_time is not None:
        spec["acquireTime"] = format_micro_time(record.acquire_time)
    if record.renew_time is not None:
        spec["renewTime"] = format_micro_time(record.renew_time)
    return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}


class KubernetesLeaseLock:
    """The Lease ``namespace/name``: read it, create it, or replace exactly the version read."""

    def __init__(
        self, api: k8s.ApiClient, namespace: str, name: str, *, request_timeout: float = 10.0
    ) -> None:
        self.namespace = namespace
        self.name = name
        self._leases: Any = k8s.CoordinationV1Api(api)
        self._request_timeout = request_timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k8s-lease")

    def __str__(self) -> str:
        return f"lease {self.namespace}/{self.name}"

    async def get(self) -> LeaseRecord | None:
        try:
            raw = await self._call(self._leases.read_namespaced_lease, self.name, self.namespace)
        except NotFound:
            return None
        return lease_record(raw)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        body = lease_body(self.namespace, self.name, record)
        body["metadata"].pop("resourceVersion", None)
        return lease_record(await self._call(self._leases.create_namespaced_lease, self.namespace, body))

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        body = lease_body(self.namespace, self.name, record)
        return lease_record(
            await self._call(self._leases.replace_namespaced_lease, self.name, self.namespace, body)
        )

    async def close(self) -> None:
        self._executor.shutdown(wait=False)

    async def _call(self, method: Callable[..., Any], *args: Any) -> dict[str, Any]:
        call = functools.partial(
            method, *args, _preload_content=False, _request_timeout=self._request_timeout
        )
        try:
            response = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except ApiException as exc:
            raise translate(exc) from None
        data = response.data if hasattr(response, "data") else response
        parsed = json.loads(data) if data else {}
        return parsed if isinstance(parsed, dict) else {}
