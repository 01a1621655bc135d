"""Checkpoint-and-move on drain: a checkpointable job holding a GPU that slicing must reconfigure is
asked to checkpoint by the real checkpoint service (slicing marks the node as going away), and its pod
is evicted once the checkpoint is saved; then the GPU is reconfigured. Real NATS, Postgres, devcluster."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tessera.checkpoint import bootstrap as checkpoint_bootstrap
from tessera.checkpoint.config import CheckpointSettings
from tessera.checkpoint_client import Checkpointer
from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions.assignment import encode_assignment
from tessera.cluster.conventions.names import (
    CHECKPOINTABLE_ANNOTATION,
    GPU_ASSIGNMENT_ANNOTATION,
    JOB_ID_LABEL,
    SIM_DURATION_ANNOTATION,
)
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.contracts import subjects
from tessera.contracts.events import DemandChanged, GangPlaced, GpuDemand, JobAdmitted, PodPlacement
from tessera.core.db.migrations import migrate
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.slicing import bootstrap
from tessera.slicing.service_layer.ports import DRAIN_LABEL
from tessera.testing.builders import a_job
from tessera.testing.services import eventually, running, settings_for

from .conftest import Kube, Stack

pytestmark = pytest.mark.integration


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[Kube, Path]]:
    nodes = [NodeSpec("a100-0", 64_000, 512_000, "A100-80GB", 1, 81920, {})]
    settings = SimSettings(speed=1.0, pod_start_seconds=0.2, mig_reconfigure_seconds=1.0)
    with DevCluster(nodes, settings=settings) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        api = Kube(kubeconfig)
        yield api, kubeconfig
        api.close()


class Trainer:
    """A training loop that takes a checkpoint at its next step when the checkpoint service asks."""

    def __init__(self, job_id: str, storage: Path, nats_url: str) -> None:
        self.ckpt = Checkpointer(job_id, storage.as_uri(), nats_url, interval_s=None)
        self.step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"trainer-{job_id}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step += 1
            self.ckpt.step(self.step, {"step": self.step})
            time.sleep(0.005)

    def start(self) -> None:
        assert self.ckpt.link is not None and self.ckpt.link.ready.wait(15), "the client did not subscribe"
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.ckpt.close()


async def test_a_checkpointable_job_on_a_busy_gpu_checkpoints_then_moves_and_the_gpu_is_reconfigured(
    stack: Stack, kube: tuple[Kube, Path], tmp_path: Path
) -> None:
    api, kubeconfig = kube
    await asyncio.to_thread(migrate, "checkpoint", stack.db)
    job = f"train-{uuid.uuid4().hex[:6]}"
    share = GpuShare(NodeSpec("a100-0", 1, 1).gpu_uuid(0))
    worker = (
        PodManifest(f"{job}-0")
        .gpus(1)
        .label(JOB_ID_LABEL, job)
        .annotate(CHECKPOINTABLE_ANNOTATION, "true")
        .annotate(GPU_ASSIGNMENT_ANNOTATION, encode_assignment(DeviceAssignment("a100-0", (share,))))
        .annotate(SIM_DURATION_ANNOTATION, "3600")  # it would hold the GPU for an hour
    )
    await api.create_pod(worker.obj())
    await api.bind(f"{job}-0", "a100-0")

    async def worker_running() -> bool:
        return await api.phase(f"{job}-0") == "Running"

    await eventually(worker_running, what="the worker holding the GPU")
    # What admission and the scheduler told the checkpoint service about the job.
    await stack.publish(
        JobAdmitted(
            job_id=job, spec=a_job("train").with_(checkpointable=True).build(), submitted_at=datetime.now(UTC)
        ),
        GangPlaced(job_id=job, placements=[PodPlacement(pod=f"{job}-0", group="workers", node="a100-0")]),
    )
    trainer = await asyncio.to_thread(Trainer, job, tmp_path / "ckpt", stack.nats_url)
    checkpointing = settings_for(
        CheckpointSettings, stack.nats_url, stack.db, deadline_poll_s=0.2, kubeconfig=kubeconfig
    )
    slicing = stack.settings(
        kubeconfig,
        planning={"window_s": 1.0, "idle_s": 0.2, "min_dwell_s": 0.0, "change_busy_gpus": True},
        operations={
            "backoff_s": 0.3,
            "max_backoff_s": 1.0,
            "verify_timeout_s": 10.0,
            "checkpoint_notice_s": 30.0,
        },
    )
    try:
        await asyncio.to_thread(trainer.start)
        async with (
            running(checkpoint_bootstrap.build(checkpointing), checkpointing),
            running(bootstrap.build(slicing), slicing),
        ):

            async def known() -> bool:
                return bool(await stack.rows(f"SELECT 1 FROM checkpoint.job_pods WHERE job_id = '{job}'"))

            await eventually(known, what="the checkpoint service knowing where the job runs")
            await stack.publish(
                DemandChanged(
                    pending_gangs=1, demand=[GpuDemand(gpus=1, milli=1000, mig_profile="3g.40gb", pods=1)]
                )
            )
            [command] = await eventually(
                lambda: stack.events(subjects.save_checkpoint(job)), timeout=60, what="the save command"
            )
            assert command.reason == "node_termination"
            assert (await api.labels("a100-0")).get(DRAIN_LABEL), "the node says it is being drained"
            [done] = await eventually(
                lambda: stack.events(subjects.RECONFIGURED), timeout=90, what="reconfigured"
            )
            [ready] = [r for r in await stack.events(subjects.READY_FOR_EVICTION) if r.job_id == job]
            assert ready.reason == "checkpoint_saved" and ready.checkpoint_uri
            pods = await asyncio.to_thread(api.core.list_namespaced_pod, "default")
            assert f"{job}-0" not in {p.metadata.name for p in pods.items}, (
                "moved off the GPU, not waited for"
            )
            steps = await stack.rows(
                "SELECT state FROM slicing.operation_steps "
                f"WHERE operation_id = '{done.operation_id}' ORDER BY seq"
            )
            assert [s for (s,) in steps] == [
                "planned",
                "cordoned",
                "draining",
                "applying",
                "verifying",
                "succeeded",
            ]
            node = await api.node("a100-0")
            assert DRAIN_LABEL not in (node.metadata.labels or {}), "the mark goes with the operation"
            assert not node.spec.unschedulable
            assert (await api.allocatable("a100-0")).get("nvidia.com/mig-3g.40gb") in ("1", "2")
    finally:
        await asyncio.to_thread(trainer.stop)
