"""The simulated kubelet of every devcluster node.

A pod bound to a simulated node is admitted (its devices allocated), goes Running after a short
start delay, and Succeeds after its `tessera.io/sim-duration` annotation (simulated seconds); a pod
without one runs until deleted. When its node is lost the pod Fails with reason NodeLost. A pod annotated
`tessera.io/checkpointable` runs a simulated trainer while it runs (see `tessera.devcluster.sim.trainer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import zlib
from typing import Any

from tessera.cluster.conventions import parse_pod_requirements
from tessera.cluster.domain.requirements import PodRequirements
from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import PODS
from tessera.devcluster.sim.context import SIM_DURATION_ANNOTATION, PodDevices, SimContext
from tessera.devcluster.sim.devices import AdmissionError, allocate, uses_gpus
from tessera.devcluster.sim.nvml import SIM_PROFILE_ANNOTATION
from tessera.devcluster.sim.state import SimNode
from tessera.devcluster.sim.trainer import Trainers, TrainerSpec, trainer_spec

log = logging.getLogger(__name__)
_TERMINAL = ("Succeeded", "Failed")


def pod_key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"


def pod_requirements(pod: dict[str, Any]) -> PodRequirements:
    return parse_pod_requirements(pod.get("spec") or {}, pod["metadata"].get("annotations") or {})


def sim_profile(pod: dict[str, Any]) -> str:
    annotations = pod["metadata"].get("annotations") or {}
    declared = annotations.get(SIM_PROFILE_ANNOTATION)
    if declared in ("training", "inference", "idle"):
        return str(declared)
    return "inference" if "tessera.io/gpu-milli" in annotations else "training"


def sim_duration(pod: dict[str, Any]) -> float | None:
    text = (pod["metadata"].get("annotations") or {}).get(SIM_DURATION_ANNOTATION)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        log.warning(
            "pod %s: %s=%r is not a number of seconds; it runs until deleted",
            pod_key(pod),
            SIM_DURATION_ANNOTATION,
            text,
        )
        return None
    return max(0.0, value)


class Kubelet:
    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self._lifecycles: dict[str, asyncio.Task[None]] = {}
        self.trainers = Trainers(ctx.trainer, ctx.settings.speed, self._annotate)

    async def run(self) -> None:
        watch = self.ctx.store.watch(PODS)
        try:
            async for event in watch:
                self.on_event(event["type"], event["object"])
        finally:
            watch.close()

    def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        key = pod_key(pod)
        if kind == "DELETED":
            self._forget(key, pod["metadata"].get("uid", ""))
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or node_name not in self.ctx.nodes:
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        with self.ctx.lock:
            known = key in self.ctx.devices and self.ctx.devices[key].uid == pod["metadata"]["uid"]
        if phase == "Pending" and not known and key not in self._lifecycles:
            self._admit(key, node_name, pod)

    def _admit(self, key: str, node_name: str, pod: dict[str, Any]) -> None:
        node = self.ctx.nodes[node_name]
        uid = pod["metadata"]["uid"]
        if node.lost:
            self._finish(key, uid, "Failed", "NodeLost", f"node {node_name} is lost")
            return
        with self.ctx.lock:
            rejection = self._rejection(node, pod)
            if rejection is None:
                try:
                    holdings = allocate(pod, node.gpus, self.ctx.holdings_on(node_name), node.replicas)
                except AdmissionError as exc:
                    rejection = ("UnexpectedAdmissionError", str(exc))
                else:
                    requirements = pod_requirements(pod)
                    self.ctx.devices[key] = PodDevices(
                        node_name,
                        uid,
                        holdings,
                        sim_profile(pod),
                        False,
                        requirements.cpu_milli,
                        requirements.memory_mib,
                    )
        if rejection is not None:
            self._finish(key, uid, "Failed", *rejection)
            return
        self._lifecycles[key] = asyncio.get_running_loop().create_task(
            self._live(key, uid, sim_duration(pod), trainer_spec(pod, self.ctx.trainer))
        )

    def _rejection(self, node: SimNode, pod: dict[str, Any]) -> tuple[str, str] | None:
        """Why the kubelet's admission turns the pod away (reason, message), or None to admit it."""
        try:
            requirements = pod_requirements(pod)
        except ValueError as exc:
            return "UnexpectedAdmissionError", str(exc)
        admitted = [d for d in self.ctx.devices.values() if d.node == node.name]
        for resource, wanted, used, capacity in (
            ("cpu", requirements.cpu_milli, sum(d.cpu_milli for d in admitted), node.spec.cpu_milli),
            ("memory", requirements.memory_mib, sum(d.memory_mib for d in admitted), node.spec.memory_mib),
        ):
            if used + wanted > capacity:
                return (
                    f"OutOf{resource}",
                    f"Node didn't have enough resource: {resource}, requested: {wanted}, "
                    f"used: {used}, capacity: {capacity}",
                )
        if node.mig_reconfiguring and uses_gpus(pod):
            return (
                "UnexpectedAdmissionError",
                "Allocate failed: the device plugin restarts for a MIG reconfiguration",
            )
        return None

    async def _live(self, key: str, uid: str, duration: float | None, trainer: TrainerSpec | None) -> None:
        try:
            await self.ctx.clock.sleep(self.ctx.settings.pod_start_seconds)
            if not self._set_running(key, uid):
                return
            if trainer is not None:
                self.trainers.start(key, uid, trainer)
            if duration is None:
                return
            await self.ctx.clock.sleep(duration)
            self._finish(key, uid, "Succeeded", "Completed", "")
        finally:
            self._lifecycles.pop(key, None)

    def _set_running(self, key: str, uid: str) -> bool:
        namespace, name = key.split("/", 1)
        devices = self.ctx.devices.get(key)
        if devices is None or devices.uid != uid:
            return False
        now = rfc3339_now()
        host = self.ctx.nodes[devices.node]

        def run(pod: dict[str, Any]) -> None:
            if pod["metadata"]["uid"] != uid or pod["status"].get("phase") != "Pending":
                raise _Skip
            containers = pod["spec"].get("containers") or []
            pod["status"].update(
                phase="Running",
                startTime=now,
                hostIP=host.address,
                podIP=_pod_ip(host.address, name),
                conditions=[
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                containerStatuses=[
                    {
                        "name": c.get("name", "main"),
                        "image": c.get("image", ""),
                        # required by the API (the official client rejects a status without it)
                        "imageID": _image_id(c.get("image", "")),
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in containers
                ],
            )

        if not self._update(namespace, name, run):
            return False
        with self.ctx.lock:
            devices.running = True
        return True

    def _finish(self, key: str, uid: str, phase: str, reason: str, message: str) -> None:
        namespace, name = key.split("/", 1)
        now = rfc3339_now()

        def end(pod: dict[str, Any]) -> None:
            if pod["metadata"]["uid"] != uid or pod["status"].get("phase") in _TERMINAL:
                raise _Skip
            status = pod["status"]
            status["phase"] = phase
            if reason != "Completed":
                status["reason"], status["message"] = reason, message
            status["conditions"] = [
                *[
                    c
                    for c in status.get("conditions", [])
                    if c.get("type") not in ("Ready", "ContainersReady")
                ],
                {"type": "Ready", "status": "False", "lastTransitionTime": now, "reason": "PodCompleted"},
                {"type": "ContainersReady", "status": "False", "lastTransitionTime": now},
            ]
            exit_code = 0 if phase == "Succeeded" else 137
            status["containerStatuses"] = [
                {
                    **cs,
                    "ready": False,
                    "started": False,
                    "state": {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now}},
                }
                for cs in status.get("containerStatuses", [])
            ]

        self._update(namespace, name, end)
        self._release(key, uid)

    def node_lost(self, node_name: str) -> None:
        """Fail every live pod on the node, as the node controller does once the node stops reporting."""
        with self.ctx.lock:
            on_node = [(k, d.uid) for k, d in self.ctx.devices.items() if d.node == node_name]
        pods, _ = self.ctx.store.list(PODS)
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName") == node_name:
                on_node.append((pod_key(pod), pod["metadata"]["uid"]))
        for key, uid in dict(on_node).items():
            task = self._lifecycles.pop(key, None)
            if task is not None:
                task.cancel()
            self._finish(
                key, uid, "Failed", "NodeLost", f"node {node_name} which was running the pod is lost"
            )

    def _forget(self, key: str, uid: str) -> None:
        task = self._lifecycles.pop(key, None)
        if task is not None:
            task.cancel()
        self._release(key, uid)

    def _release(self, key: str, uid: str) -> None:
        self.trainers.stop(key, uid)
        with self.ctx.lock:
            devices = self.ctx.devices.get(key)
            if devices is not None and devices.uid == uid:
                del self.ctx.devices[key]

    def _annotate(self, key: str, uid: str, annotations: dict[str, str]) -> None:
        """What a trainer shows on its pod (still the same pod, even once it ended)."""
        namespace, name = key.split("/", 1)

        def change(pod: dict[str, Any]) -> None:
            if pod["metadata"]["uid"] != uid:
                raise _Skip
            pod["metadata"].setdefault("annotations", {}).update(annotations)

        self._update(namespace, name, change)

    def _update(self, namespace: str, name: str, change: Any) -> bool:
        try:
            self.ctx.store.mutate(PODS, namespace, name, change)
        except _Skip:
            return False
        except ApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    async def stop(self) -> None:
        tasks = list(self._lifecycles.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.trainers.stop_all()


class _Skip(Exception):
    """The pod moved on (deleted, recreated or already ended): leave it alone."""


def _pod_ip(host: str, name: str) -> str:
    """A pod address in the node's own /24 of the pod network (10.64+.x.y for node 10.0.a.b)."""
    parts = host.split(".")
    return f"10.{64 + int(parts[2])}.{parts[3]}.{zlib.crc32(name.encode()) % 250 + 2}"


def _image_id(image: str) -> str:
    """A content digest for the image, in the form containerd reports it."""
    name = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"{name}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
