"""Replays the openb pod trace (Alibaba GPU cluster trace 2023) as pods for Tessera's scheduler.

Each trace row becomes a pod with `schedulerName: tessera`, created at its `creation_time`
(relative to the first row replayed) divided by the speed, or at a steady rate when one is given.
A pod list with only `name,cpu_milli,memory_mib,num_gpu,gpu_milli` (as some published with the FGD
paper) replays too: no `gpu_spec` means no model constraint, no `creation_time` means the file's
order with no gaps (pace it with a rate). GPU demand follows Tessera's
conventions: `nvidia.com/gpu` limits for whole GPUs, the `tessera.io/gpu-milli` annotation for a
share of one GPU, `tessera.io/gpu-models` for the allowed models. The pod's run time in the trace
(deletion minus scheduling) goes into `tessera.io/sim-duration`, which the devcluster's kubelet
honours at its own speed: run both at the same speed.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.cluster.builders import TEST_IMAGE
from tessera.cluster.conventions import (
    GPU_MILLI_ANNOTATION,
    GPU_MODELS_ANNOTATION,
    GPU_RESOURCE,
    SCHEDULER_NAME,
)
from tessera.devcluster.sim.context import SIM_DURATION_ANNOTATION

TRACE_LABEL = "tessera.io/trace"
#: the image of a replayed pod: the devcluster runs no container, but a trace pod is a GPU job, so it
#: names a real GPU image as a user's would
REPLAY_IMAGE = TEST_IMAGE
_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec, the times: optional


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the line and the field."""


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    creation_time: float
    duration: float | None = None


def load_trace(path: str | Path, *, skip: int = 0, limit: int | None = None) -> list[TracePod]:
    """Rows of an openb pod list, ordered by creation time (file order without one); `skip` and
    `limit` pick a slice."""
    source = Path(path)
    if skip < 0 or (limit is not None and limit < 1):
        raise TraceError(f"{source}: skip must be >= 0 and limit >= 1 (got skip={skip}, limit={limit})")
    try:
        handle = source.open(newline="")
    except OSError as exc:
        raise TraceError(f"{source}: cannot read: {exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = set(_COLUMNS) - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{source}: missing columns {sorted(missing)} (an openb pod list?)")
        timed = "creation_time" in (reader.fieldnames or [])
        pods = [_row(row, f"{source}: line {n}", timed) for n, row in enumerate(reader, start=2)]
    pods.sort(key=lambda p: p.creation_time)  # stable: untimed pods keep the file's order
    return pods[skip : skip + limit if limit is not None else None]


def _row(row: dict[str, str], where: str, timed: bool = True) -> TracePod:
    def number(column: str) -> float:
        try:
            return float(row[column])
        except (TypeError, ValueError):
            raise TraceError(f"{where}: {column}={row.get(column)!r} is not a number") from None

    created = number("creation_time") if timed else 0.0
    duration = None
    if row.get("deletion_time") and (timed or row.get("scheduled_time")):
        started = float(row["scheduled_time"]) if row.get("scheduled_time") else created
        duration = max(0.0, number("deletion_time") - started)
    num_gpu, gpu_milli = int(number("num_gpu")), int(number("gpu_milli"))
    if num_gpu < 0 or not 0 <= gpu_milli <= 1000:
        raise TraceError(f"{where}: num_gpu must be >= 0 and gpu_milli in 0..1000")
    return TracePod(
        name=row["name"].lower(),
        cpu_milli=int(number("cpu_milli")),
        memory_mib=int(number("memory_mib")),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_spec=(row.get("gpu_spec") or "").strip(),
        creation_time=created,
        duration=duration,
    )


def pod_manifest(
    pod: TracePod, *, namespace: str = "default", scheduler: str = SCHEDULER_NAME
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    limits: dict[str, str] = {}
    if pod.num_gpu == 1 and 0 < pod.gpu_milli < 1000:
        annotations[GPU_MILLI_ANNOTATION] = str(pod.gpu_milli)
    elif pod.num_gpu >= 1:
        limits[GPU_RESOURCE] = str(pod.num_gpu)
    if pod.gpu_spec:
        annotations[GPU_MODELS_ANNOTATION] = pod.gpu_spec
    if pod.duration is not None:
        annotations[SIM_DURATION_ANNOTATION] = f"{pod.duration:g}"
    resources: dict[str, Any] = {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}}
    if limits:
        resources["limits"] = limits
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": namespace,
            "labels": {TRACE_LABEL: "openb"},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": REPLAY_IMAGE, "resources": resources}],
        },
    }


@dataclass
class ReplayReport:
    created: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    due_s: list[float] = field(default_factory=list)  # when each pod was due, in wall seconds from the start
    lag_s: list[float] = field(default_factory=list)  # how late each creation was

    @property
    def max_lag_s(self) -> float:
        return max(self.lag_s, default=0.0)


class Replayer:
    """Creates pods at the trace's creation times divided by `speed`, or, given `rate`, one every
    1/`rate` seconds in the trace's order, whatever its times (a steady arrival rate)."""

    def __init__(
        self,
        create: Callable[[dict[str, Any]], None],
        *,
        speed: float = 1.0,
        rate: float | None = None,
        namespace: str = "default",
        scheduler: str = SCHEDULER_NAME,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed: must be positive, got {speed}")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate: must be positive, got {rate}")
        self._create = create
        self.speed = speed
        self.rate = rate
        self.namespace = namespace
        self.scheduler = scheduler
        self._clock = clock
        self._sleep = sleep

    def run(
        self, pods: Iterable[TracePod], on_created: Callable[[TracePod], None] | None = None
    ) -> ReplayReport:
        report = ReplayReport()
        ordered = sorted(pods, key=lambda p: p.creation_time)
        if not ordered:
            return report
        origin = ordered[0].creation_time
        started = self._clock()
        for i, pod in enumerate(ordered):
            due = i / self.rate if self.rate is not None else (pod.creation_time - origin) / self.speed
            wait = due - (self._clock() - started)
            if wait > 0:
                self._sleep(wait)
            try:
                self._create(pod_manifest(pod, namespace=self.namespace, scheduler=self.scheduler))
            except Exception as exc:  # a rejected pod is reported; the replay goes on
                report.failed.append((pod.name, str(exc)))
                continue
            report.created.append(pod.name)
            report.due_s.append(due)
            report.lag_s.append(max(0.0, self._clock() - started - due))
            if on_created is not None:
                on_created(pod)
        return report
