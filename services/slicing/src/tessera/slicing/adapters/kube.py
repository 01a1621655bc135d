"""The cluster as slicing acts on it, through the official `kubernetes` client: nodes and pods read,
cordon, the MIG manager's and device plugin's ConfigMaps and node labels written, and failures shown
on the node as a condition and a Warning Event.

Reads, labels and ConfigMap writes go through the cluster library's `KubernetesCluster`
(its thread pool, its read-modify-write with retry on conflict); the node condition and the Event
use the client's CoreV1Api on the same ApiClient, as does the cordon (one merge patch with its annotation)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tessera.cluster.conventions import DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.cluster.domain.node import MigConfigState, Node
from tessera.cluster.domain.requirements import Pod, PodRef
from tessera.cluster.kube import KubernetesCluster
from tessera.cluster.kube.errors import translate
from tessera.cluster.port import NotFound, PodSelector
from tessera.slicing.service_layer.ports import CORDONED_BY_ANNOTATION, DEADLINE_ANNOTATION, DRAIN_LABEL

CONDITION_TYPE = "TesseraSlicingFailed"

EVENT_REASON = "GpuReconfigurationFailed"
COMPONENT = "tessera-slicing"
MIG_PARTED_KEY = "config.yaml"
MERGE_PATCH = "application/merge-patch+json"


class KubeClusterOps:
    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        operator_namespace: str = "gpu-operator",
        mig_configmap: str = "custom-mig-config",
        device_plugin_configmap: str = "device-plugin-config",
        events_namespace: str = "default",
    ) -> None:
        self._api = api
        self._cluster = KubernetesCluster(api)
        self._core: Any = k8s.CoreV1Api(api)
        self.operator_namespace = operator_namespace
        self.mig_configmap = mig_configmap
        self.device_plugin_configmap = device_plugin_configmap
        self.events_namespace = events_namespace

    async def close(self) -> None:
        await self._cluster.close()

    async def nodes(self) -> list[Node]:
        return list((await self._cluster.list_nodes()).items)

    async def node(self, name: str) -> Node:
        return await self._cluster.get_node(name)

    async def bound_pods(self) -> list[Pod]:
        listing = await self._cluster.list_pods(PodSelector(assigned=True, exclude_terminated=True))
        return list(listing.items)

    async def pods_on(self, node: str) -> list[Pod]:
        listing = await self._cluster.list_pods(PodSelector(node_name=node, exclude_terminated=True))
        return list(listing.items)

    async def cordon(self, node: str, unschedulable: bool, operation_id: str) -> None:
        # one merge patch: a cordon is never seen without the operation that made it
        patch = {
            "metadata": {"annotations": {CORDONED_BY_ANNOTATION: operation_id if unschedulable else None}},
            "spec": {"unschedulable": unschedulable or None},
        }
        try:
            await asyncio.to_thread(
                self._core.patch_node, node, patch, _content_type=MERGE_PATCH, _preload_content=False
            )
        except ApiException as exc:
            raise translate(exc) from None

    async def write_mig_config(self, node: str, config: str, body: str) -> None:
        entries = yaml.safe_load(body)

        def put(data: Any) -> dict[str, str]:
            document = yaml.safe_load(data.get(MIG_PARTED_KEY) or "") or {}
            if not isinstance(document, dict):
                document = {}
            document.setdefault("version", "v1")
            configs = document.get("mig-configs")
            document["mig-configs"] = {**(configs if isinstance(configs, dict) else {}), config: entries}
            return {**data, MIG_PARTED_KEY: yaml.safe_dump(document, sort_keys=False)}

        await self._cluster.update_config_map(self.operator_namespace, self.mig_configmap, put)
        if (await self._cluster.get_node(node)).mig_config == config:
            return  # this step ran before (the MIG manager acts on a change of the label, not again)
        # `pending` goes with the new name in one patch: until the MIG manager writes this attempt's
        # outcome, the node must not show the previous attempt's `failed` or `success` beside it
        await self._cluster.patch_node(
            node, labels={MIG_CONFIG_LABEL: config, MIG_CONFIG_STATE_LABEL: MigConfigState.PENDING.value}
        )

    async def write_sharing_config(self, node: str, config: str, body: str) -> None:
        await self._cluster.update_config_map(
            self.operator_namespace, self.device_plugin_configmap, lambda data: {**data, config: body}
        )
        await self._cluster.patch_node(node, labels={DEVICE_PLUGIN_CONFIG_LABEL: config})

    async def forget_configs(self, mig: bool, configs: list[str]) -> None:
        if not configs:
            return
        gone = set(configs)

        def drop_mig(data: Any) -> dict[str, str]:
            document = yaml.safe_load(data.get(MIG_PARTED_KEY) or "") or {}
            found = document.get("mig-configs") if isinstance(document, dict) else None
            if not isinstance(found, dict) or not gone & set(found):
                return dict(data)
            document["mig-configs"] = {k: v for k, v in found.items() if k not in gone}
            return {**data, MIG_PARTED_KEY: yaml.safe_dump(document, sort_keys=False)}

        if mig:
            await self._cluster.update_config_map(self.operator_namespace, self.mig_configmap, drop_mig)
        else:
            await self._cluster.update_config_map(
                self.operator_namespace,
                self.device_plugin_configmap,
                lambda data: {k: v for k, v in data.items() if k not in gone},
            )

    async def mark_draining(self, node: str, deadline: datetime | None) -> None:
        if deadline is None:
            await self._cluster.patch_node(
                node, labels={DRAIN_LABEL: None}, annotations={DEADLINE_ANNOTATION: None}
            )
            return
        seconds = str(int(deadline.timestamp()))
        await self._cluster.patch_node(
            node,
            labels={DRAIN_LABEL: seconds},
            annotations={DEADLINE_ANNOTATION: deadline.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        )

    async def evict(self, pod: Pod) -> None:
        with contextlib.suppress(NotFound):
            await self._cluster.evict(PodRef(pod.namespace, pod.name))

    async def report_failure(self, node: str, operation_id: str, reason: str) -> None:
        now = _now()
        await self._set_condition(node, "True", "ReconfigurationFailed", reason, now)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{node}.{uuid.uuid4().hex[:12]}", "namespace": self.events_namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": EVENT_REASON,
            "message": f"slicing operation {operation_id}: {reason}; the node stays cordoned",
            "type": "Warning",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await asyncio.to_thread(self._core.create_namespaced_event, self.events_namespace, event)

    async def clear_failure(self, node: str) -> None:
        raw = await asyncio.to_thread(self._read_node, node)
        conditions = (raw.get("status") or {}).get("conditions") or []
        if any(c.get("type") == CONDITION_TYPE and c.get("status") == "True" for c in conditions):
            await self._set_condition(node, "False", "Reconfigured", "the planned layout was applied", _now())

    async def _set_condition(self, node: str, status: str, reason: str, message: str, now: str) -> None:
        raw = await asyncio.to_thread(self._read_node, node)
        kept = [
            c for c in (raw.get("status") or {}).get("conditions") or [] if c.get("type") != CONDITION_TYPE
        ]
        condition = {
            "type": CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        await asyncio.to_thread(
            self._core.patch_node_status, node, {"status": {"conditions": [*kept, condition]}}
        )

    def _read_node(self, node: str) -> dict[str, Any]:
        response = self._core.read_node(node, _preload_content=False)
        return dict(yaml.safe_load(response.data) or {})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
