"""The simulated NVIDIA GPU Operator: GPU Feature Discovery, the device plugin and the MIG manager.

It keeps each simulated node's labels, annotations and allocatable in step with the hardware, the
device-plugin ConfigMap and the `nvidia.com/mig.config` label. The MIG manager, like the real one,
reconfigures only GPUs that no pod holds: it sets `nvidia.com/mig.config.state` to `pending`,
pauses the node's GPU operands (`nvidia.com/gpu.deploy.*=paused-for-mig-change`) and withdraws the
GPU resources while it works (a few simulated seconds), then lays the GPUs out, restarts the
operands and reports `success`; if pods still hold affected GPUs, or the config does not apply to
the GPUs' model, it reports `failed`. A config name is looked up in the MIG manager's ConfigMap
first (per-device entries), then among the operator's built-in names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from tessera.cluster.conventions import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from tessera.cluster.domain.gpu import MigInstance
from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import CONFIGMAPS, NAMESPACES, NODES
from tessera.devcluster.sim import gpu_operator, mig_parted
from tessera.devcluster.sim.context import SimContext
from tessera.devcluster.sim.state import SimNode

log = logging.getLogger(__name__)


class GpuOperator:
    def __init__(self, ctx: SimContext, on_node_lost: Any = None) -> None:
        self.ctx = ctx
        self._on_node_lost = on_node_lost
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- start-up ----------------------------------------------------------------------------

    def install(self) -> None:
        """Create the operator's ConfigMap and the nodes, with any MIG config in their labels applied."""
        store = self.ctx.store
        if store.find(NAMESPACES, None, gpu_operator.DEVICE_PLUGIN_NAMESPACE) is None:
            store.create(NAMESPACES, None, {"metadata": {"name": gpu_operator.DEVICE_PLUGIN_NAMESPACE}})
        for manifest in (gpu_operator.device_plugin_configmap(), gpu_operator.mig_parted_configmap()):
            if (
                store.find(CONFIGMAPS, gpu_operator.DEVICE_PLUGIN_NAMESPACE, manifest["metadata"]["name"])
                is None
            ):
                store.create(CONFIGMAPS, gpu_operator.DEVICE_PLUGIN_NAMESPACE, manifest)
        for node in self.ctx.nodes.values():
            if store.find(NODES, None, node.name) is not None:  # restored from a snapshot, as it was
                self.reconcile(node.name)
                continue
            config = node.spec.labels.get(MIG_CONFIG_LABEL)
            state = None
            if config:
                node.attempted_mig_config = config
                state = (
                    "failed"
                    if gpu_operator.validate_mig_config(node, config, self._mig_configs())
                    else "success"
                )
                if state == "success":
                    self._lay_out(node, config)
            if store.find(NODES, None, node.name) is None:
                store.create(NODES, None, self._initial_manifest(node, state))
            self.reconcile(node.name)

    def _initial_manifest(self, node: SimNode, mig_state: str | None) -> dict[str, Any]:
        labels = {
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "tessera.io/devcluster": "true",
            **node.spec.labels,
        }
        if mig_state:
            labels[MIG_CONFIG_STATE_LABEL] = mig_state
        now = rfc3339_now()
        return {
            "metadata": {"name": node.name, "labels": labels, "annotations": {}},
            "spec": {},
            "status": {
                "conditions": [_ready_condition(True, now)],
                "addresses": [
                    {"type": "InternalIP", "address": node.address},
                    {"type": "Hostname", "address": node.name},
                ],
                "nodeInfo": {
                    # the official client requires the ids and kube-proxy's version
                    "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, node.name).hex,
                    "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"devcluster:{node.name}")),
                    "bootID": str(uuid.uuid4()),
                    "kubeletVersion": "v1.31.0-devcluster",
                    "kubeProxyVersion": "v1.31.0-devcluster",
                    "osImage": "Ubuntu 22.04.4 LTS",
                    "kernelVersion": "5.15.0-devcluster",
                    "containerRuntimeVersion": "containerd://1.7.20",
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                },
            },
        }

    # ---- watching ----------------------------------------------------------------------------

    async def run(self) -> None:
        await asyncio.gather(self._watch_nodes(), self._watch_configmap())

    async def _watch_nodes(self) -> None:
        watch = self.ctx.store.watch(NODES)
        try:
            async for event in watch:
                name = event["object"]["metadata"]["name"]
                if name not in self.ctx.nodes:
                    continue
                if event["type"] == "DELETED":
                    self.lose_node(name)
                else:
                    self.reconcile(name)
        finally:
            watch.close()

    async def _watch_configmap(self) -> None:
        watch = self.ctx.store.watch(CONFIGMAPS, gpu_operator.DEVICE_PLUGIN_NAMESPACE)
        try:
            async for event in watch:
                if event["object"]["metadata"]["name"] == gpu_operator.DEVICE_PLUGIN_CONFIGMAP:
                    for name in list(self.ctx.nodes):
                        self.reconcile(name)
        finally:
            watch.close()

    # ---- reconciling -------------------------------------------------------------------------

    def reconcile(self, name: str) -> None:
        node = self.ctx.nodes[name]
        current = self.ctx.store.find(NODES, None, name)
        if current is None or node.lost:
            return
        labels = dict(current["metadata"].get("labels") or {})
        wanted = labels.get(MIG_CONFIG_LABEL)
        mig_state: str | None = None
        if wanted != node.attempted_mig_config and not node.mig_reconfiguring and wanted:
            node.attempted_mig_config = wanted
            mig_state = self._start_mig(node, wanted)
        elif not wanted:
            node.attempted_mig_config = None
        self._publish(node, mig_state)

    def _mig_configs(self) -> dict[str, str] | None:
        found = self.ctx.store.find(
            CONFIGMAPS, gpu_operator.DEVICE_PLUGIN_NAMESPACE, mig_parted.MIG_PARTED_CONFIGMAP
        )
        return None if found is None else dict(found.get("data") or {})

    def _start_mig(self, node: SimNode, config: str) -> str:
        mig_configs = self._mig_configs()
        reason = gpu_operator.validate_mig_config(node, config, mig_configs)
        if reason is not None:
            log.warning("node %s: mig config %s does not apply: %s", node.name, config, reason)
            return "failed"
        layout = gpu_operator.mig_layout(node, config, mig_configs)
        affected = {
            gpu.uuid
            for gpu, (enabled, instances) in zip(node.gpus, layout, strict=True)
            if (enabled, instances) != (gpu.mig_enabled, gpu.mig_instances)
        }
        busy = {h.gpu_uuid for h in self.ctx.holdings_on(node.name)} & affected
        if busy:
            log.warning("node %s: mig config %s failed: GPUs %s are in use", node.name, config, sorted(busy))
            return "failed"
        if not affected:
            node.applied_mig_config = config
            return "success"
        node.mig_reconfiguring = True
        task = asyncio.get_running_loop().create_task(self._reconfigure(node, config, layout))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return "pending"

    async def _reconfigure(
        self, node: SimNode, config: str, layout: list[tuple[bool, tuple[MigInstance, ...]]]
    ) -> None:
        await self.ctx.clock.sleep(self.ctx.settings.mig_reconfigure_seconds)
        with self.ctx.lock:
            self._lay_out(node, config, layout)
            node.mig_reconfiguring = False
        self._publish(node, "success")
        self.reconcile(node.name)  # the label may have changed again while the GPUs were busy

    def _lay_out(
        self, node: SimNode, config: str, layout: list[tuple[bool, tuple[MigInstance, ...]]] | None = None
    ) -> None:
        if layout is None:
            layout = gpu_operator.mig_layout(node, config, self._mig_configs())
        for gpu, (enabled, instances) in zip(node.gpus, layout, strict=True):
            gpu.mig_enabled, gpu.mig_instances = enabled, instances
        node.applied_mig_config = config

    def _publish(self, node: SimNode, mig_state: str | None) -> None:
        """Write the node's GFD labels, Tessera annotations and allocatable when they changed."""
        store = self.ctx.store
        configmap = store.find(
            CONFIGMAPS, gpu_operator.DEVICE_PLUGIN_NAMESPACE, gpu_operator.DEVICE_PLUGIN_CONFIGMAP
        )

        def update(obj: dict[str, Any]) -> None:
            meta = obj["metadata"]
            labels = meta.setdefault("labels", {})
            strategy, replicas = gpu_operator.sharing_for(labels, (configmap or {}).get("data"))
            node.replicas = replicas
            for key, value in gpu_operator.operator_labels(node, replicas, strategy).items():
                if value is None:
                    labels.pop(key, None)
                else:
                    labels[key] = value
            if mig_state is not None:
                labels[MIG_CONFIG_STATE_LABEL] = mig_state
            if node.gpus:
                operands = gpu_operator.PAUSED_FOR_MIG_CHANGE if node.mig_reconfiguring else "true"
                labels.update(dict.fromkeys(gpu_operator.OPERAND_LABELS, operands))
            meta.setdefault("annotations", {}).update(gpu_operator.operator_annotations(node))
            advertised = (
                {} if node.mig_reconfiguring else gpu_operator.advertised_resources(node.gpus, replicas)
            )
            resources = {
                "cpu": f"{node.spec.cpu_milli}m",
                "memory": f"{node.spec.memory_mib}Mi",
                "pods": "110",
                **{key: str(value) for key, value in sorted(advertised.items())},
            }
            status = obj.setdefault("status", {})
            status["capacity"] = dict(resources)
            status["allocatable"] = dict(resources)

        with contextlib.suppress(ApiError):
            store.mutate(NODES, None, node.name, update)

    # ---- faults ------------------------------------------------------------------------------

    def lose_node(self, name: str) -> None:
        node = self.ctx.nodes[name]
        node.lost = True
        now = rfc3339_now()

        def not_ready(obj: dict[str, Any]) -> None:
            conditions = [c for c in obj["status"].get("conditions", []) if c.get("type") != "Ready"]
            obj["status"]["conditions"] = [*conditions, _ready_condition(False, now)]

        with contextlib.suppress(ApiError):
            self.ctx.store.mutate(NODES, None, name, not_ready)
        if self._on_node_lost is not None:
            self._on_node_lost(name)

    def restore_node(self, name: str) -> None:
        node = self.ctx.nodes[name]
        node.lost = False
        now = rfc3339_now()

        def ready(obj: dict[str, Any]) -> None:
            conditions = [c for c in obj["status"].get("conditions", []) if c.get("type") != "Ready"]
            obj["status"]["conditions"] = [*conditions, _ready_condition(True, now)]

        with contextlib.suppress(ApiError):
            self.ctx.store.mutate(NODES, None, name, ready)
        self.reconcile(name)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _ready_condition(ready: bool, now: str) -> dict[str, Any]:
    if ready:
        return {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastTransitionTime": now,
        }
    return {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastTransitionTime": now,
    }
