"""The simulated kubelet of every devcluster node.

A pod bound to a simulated node is admitted (its devices allocated), goes Running after a short
start delay, and ends after its `tessera.io/sim-duration` annotation (simulated seconds: "90", "5s",
"2m", "1h"), or after `SimSettings.default_pod_seconds` when set; without either it runs until
deleted. It ends with the exit code of `tessera.io/sim-exit-code` (default 0): 0 Succeeds, anything
else Fails, and its containers show the code as terminated. Containers are not restarted, whatever
the restartPolicy. When its node is lost the pod Fails with reason NodeLost. A pod annotated
`tessera.io/checkpointable` runs a simulated trainer while it runs (see `tessera.devcluster.sim.trainer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import zlib
from datetime import UTC, datetime
from typing import Any

from tessera.cluster.conventions import parse_pod_requirements
from tessera.cluster.domain.requirements import PodRequirements
from tessera.devcluster.apiserver.clock import parse_rfc3339, rfc3339_now
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import PODS
from tessera.devcluster.sim.context import (
    SIM_DURATION_ANNOTATION,
    SIM_EXIT_CODE_ANNOTATION,
    PodDevices,
    SimContext,
)
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


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from "90", "90s", "1.5m", "2h" or "500ms"; ValueError otherwise."""
    stripped = text.strip()
    for unit in ("ms", "s", "m", "h"):
        if stripped.endswith(unit):
            return float(stripped[: -len(unit)]) * _UNITS[unit]
    return float(stripped)


def sim_duration(pod: dict[str, Any], default: float | None = None) -> float | None:
    text = (pod["metadata"].get("annotations") or {}).get(SIM_DURATION_ANNOTATION)
    if text is None:
        return default
    try:
        value = parse_duration(str(text))
    except ValueError:
        log.warning(
            "pod %s: %s=%r is not a duration (90, 90s, 2m, 1h); it runs until deleted",
            pod_key(pod),
            SIM_DURATION_ANNOTATION,
            text,
        )
        return None
    return max(0.0, value)


def sim_exit_code(pod: dict[str, Any]) -> int:
    text = (pod["metadata"].get("annotations") or {}).get(SIM_EXIT_CODE_ANNOTATION)
    if text is None:
        return 0
    try:
        return int(text)
    except ValueError:
        log.warning(
            "pod %s: %s=%r is not an integer; it exits 0", pod_key(pod), SIM_EXIT_CODE_ANNOTATION, text
        )
        return 0


class Kubelet:
    def __init__(self, ctx: SimContext) -> None:
        self.ctx = ctx
        self._lifecycles: dict[str, asyncio.Task[None]] = {}
        self.trainers = Trainers(ctx.trainer, ctx.settings.speed, self._annotate)

    async def run(self) -> None:
        watch = self.ctx.store.watch(PODS)
        try:
            # The stored pods themselves, uncopied: the kubelet only reads them (it changes a pod
            # through ObjectStore.mutate, on a copy), and the store never changes one it holds.
            while (event := await watch.next(copy_object=False)) is not None:
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
            self._live(
                key,
                uid,
                sim_duration(pod, self.ctx.settings.default_pod_seconds),
                sim_exit_code(pod),
                trainer_spec(pod, self.ctx.trainer),
            )
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

    def resume(self) -> None:
        """Take the pods back that a restored snapshot says were admitted here: a running pod goes on
        for what is left of its duration (from its startTime, in simulated seconds) with its trainer;
        an admitted one that had not started starts. Devices of pods gone or ended are released."""
        with self.ctx.lock:
            admitted = list(self.ctx.devices.items())
        for key, devices in admitted:
            namespace, name = key.split("/", 1)
            pod = self.ctx.store.find(PODS, namespace, name)
            phase = ((pod or {}).get("status") or {}).get("phase")
            if pod is None or pod["metadata"]["uid"] != devices.uid or phase in _TERMINAL:
                self._release(key, devices.uid)
                continue
            duration = sim_duration(pod, self.ctx.settings.default_pod_seconds)
            if devices.running and duration is not None:
                duration = max(0.0, duration - _simulated_since(pod, self.ctx.settings.speed))
            self._lifecycles[key] = asyncio.get_running_loop().create_task(
                self._live(
                    key,
                    devices.uid,
                    duration,
                    sim_exit_code(pod),
                    trainer_spec(pod, self.ctx.trainer),
                    already_running=devices.running,
                )
            )

    async def _live(
        self,
        key: str,
        uid: str,
        duration: float | None,
        exit_code: int,
        trainer: TrainerSpec | None,
        *,
        already_running: bool = False,
    ) -> None:
        try:
            if not already_running:
                await self.ctx.clock.sleep(self.ctx.settings.pod_start_seconds)
                if not self._set_running(key, uid):
                    return
            if trainer is not None:
                self.trainers.start(key, uid, trainer)
            if duration is None:
                return
            await self.ctx.clock.sleep(duration)
            if exit_code == 0:
                self._finish(key, uid, "Succeeded", "Completed", "")
            else:
                self._finish(key, uid, "Failed", "Error", "", exit_code)
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
                        # what the runtime named it: the id in the container's cgroup path, which is
                        # how a node agent (telemetry) maps a GPU process to its container
                        "containerID": _container_id(uid, c.get("name", "main")),
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

    def _finish(
        self, key: str, uid: str, phase: str, reason: str, message: str, exit_code: int | None = None
    ) -> None:
        """End the pod. A container that exited on its own (`exit_code` given) leaves the pod's own
        reason unset, as the kubelet does; the node or the kubelet failing it sets reason and message."""
        namespace, name = key.split("/", 1)
        now = rfc3339_now()

        def end(pod: dict[str, Any]) -> None:
            if pod["metadata"]["uid"] != uid or pod["status"].get("phase") in _TERMINAL:
                raise _Skip
            status = pod["status"]
            status["phase"] = phase
            if reason != "Completed" and exit_code is None:
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
            if reason == "NodeLost":
                # what the pod garbage collector marks on the pods of a lost node before it deletes them
                status["conditions"].append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "DeletionByPodGC",
                        "message": message,
                        "lastTransitionTime": now,
                    }
                )
            code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 137)
            status["containerStatuses"] = [
                {
                    **cs,
                    "ready": False,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": reason,
                            "startedAt": (cs.get("state") or {}).get("running", {}).get("startedAt"),
                            "finishedAt": now,
                        }
                    },
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
            # Nothing reads the pod written: no copy of it (the status updates are most of the writes)
            self.ctx.store.mutate(PODS, namespace, name, change, copy_result=False)
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


def _simulated_since(pod: dict[str, Any], speed: float) -> float:
    """Simulated seconds since the pod's startTime (wall-clock time times the speed); 0 without one."""
    started = (pod.get("status") or {}).get("startTime")
    if not started:
        return 0.0
    elapsed = datetime.now(UTC) - parse_rfc3339(str(started))
    return max(0.0, elapsed.total_seconds() * speed)


def _pod_ip(host: str, name: str) -> str:
    """A pod address in the node's own /24 of the pod network (10.64+.x.y for node 10.0.a.b)."""
    parts = host.split(".")
    return f"10.{64 + int(parts[2])}.{parts[3]}.{zlib.crc32(name.encode()) % 250 + 2}"


def _container_id(pod_uid: str, container: str) -> str:
    """A containerd id, stable for the pod's container, in the form the kubelet reports it."""
    return f"containerd://{hashlib.sha256(f'{pod_uid}/{container}'.encode()).hexdigest()}"


def _image_id(image: str) -> str:
    """A content digest for the image, in the form containerd reports it."""
    name = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"{name}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
