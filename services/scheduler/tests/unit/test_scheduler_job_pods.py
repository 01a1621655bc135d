"""The pods the scheduler makes for an admitted job: a checkpointable job's pods say so (and size the
devcluster's simulated trainer), and a job that resumes hands its checkpoint to every container."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.cluster.builders import gpu_node
from tessera.cluster.conventions import (
    CHECKPOINT_URI_ENV,
    CHECKPOINTABLE_ANNOTATION,
    JOB_ID_LABEL,
    SIM_CHECKPOINT_INTERVAL_ANNOTATION,
    SIM_DURATION_ANNOTATION,
    SIM_STATE_BYTES_ANNOTATION,
)
from tessera.cluster.fake import FakeCluster
from tessera.contracts.jobs import JobSpec
from tessera.devcluster.sim.trainer import TrainerSettings, trainer_spec
from tessera.scheduler.adapters.cluster_side import ClusterSide
from tessera.scheduler.adapters.kube import DEFAULT_SIM_STATE_BYTES, pod_manifest
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.gangs import job_group_name
from tessera.testing.builders import a_job

FakeUnit = Any  # conftest's FakeSchedulerUnitOfWork
URI = "file:///ckpt/train-1/step-120-9f2c"


def spec_of(**fields: Any) -> JobSpec:
    return a_job("train").group("workers", replicas=2).with_(**fields).build()


def manifests(spec: JobSpec, resume_from: str | None = None) -> list[dict[str, Any]]:
    group = spec.pod_groups[0]
    return [
        pod_manifest(
            f"train-{i}", "default", job_group_name("train-1", spec), "train-1", spec, group, resume_from
        )
        for i in range(group.replicas)
    ]


def env_of(pod: dict[str, Any]) -> list[dict[str, str]]:
    return [var for container in pod["spec"]["containers"] for var in container.get("env", [])]


def test_a_plain_job_s_pods_carry_its_id_and_nothing_about_checkpoints() -> None:
    for pod in manifests(spec_of(estimated_duration_s=40)):
        meta = pod["metadata"]
        assert meta["labels"][JOB_ID_LABEL] == "train-1"
        assert meta["annotations"] == {SIM_DURATION_ANNOTATION: "40"}
        assert env_of(pod) == []


def test_a_checkpointable_job_s_pods_are_annotated_with_a_small_simulated_state() -> None:
    for pod in manifests(spec_of(checkpointable=True)):
        annotations = pod["metadata"]["annotations"]
        assert annotations[CHECKPOINTABLE_ANNOTATION] == "true"
        assert annotations[SIM_STATE_BYTES_ANNOTATION] == str(DEFAULT_SIM_STATE_BYTES) == str(2**20)
        assert env_of(pod) == []


def test_the_job_s_sim_labels_size_its_trainer_and_other_labels_stay_off_the_pods() -> None:
    labels = {SIM_STATE_BYTES_ANNOTATION: "65536", SIM_CHECKPOINT_INTERVAL_ANNOTATION: "20", "team": "x"}
    pod = manifests(spec_of(checkpointable=True, labels=labels))[0]

    annotations = pod["metadata"]["annotations"]
    assert annotations[SIM_STATE_BYTES_ANNOTATION] == "65536"
    assert annotations[SIM_CHECKPOINT_INTERVAL_ANNOTATION] == "20"
    assert "team" not in annotations and "team" not in pod["metadata"]["labels"]
    # A job that cannot checkpoint runs no trainer, whatever its labels say.
    plain = manifests(spec_of(labels=labels))[0]["metadata"]["annotations"]
    assert CHECKPOINTABLE_ANNOTATION not in plain and SIM_STATE_BYTES_ANNOTATION not in plain


def test_a_resumed_job_hands_its_checkpoint_to_every_container_and_the_trainer_reads_it() -> None:
    pods = manifests(spec_of(checkpointable=True, labels={SIM_CHECKPOINT_INTERVAL_ANNOTATION: "20"}), URI)

    assert len(pods) == 2
    for pod in pods:
        assert env_of(pod) == [{"name": CHECKPOINT_URI_ENV, "value": URI}]
        # What the devcluster's trainer makes of it: the same job id, state, interval and checkpoint.
        trainer = trainer_spec(pod, TrainerSettings())
        assert trainer is not None
        assert (trainer.job_id, trainer.state_bytes, trainer.checkpoint_interval_s, trainer.restore_uri) == (
            "train-1",
            DEFAULT_SIM_STATE_BYTES,
            20.0,
            URI,
        )


# -- through the scheduling engine ----------------------------------------------------------------


@dataclass
class Made:
    job_id: str
    quorum: int
    resume_from: str | None


class RecordingMaker:
    def __init__(self) -> None:
        self.made: list[Made] = []

    async def ensure(
        self, job_id: str, spec: JobSpec, namespace: str, *, quorum: int, resume_from: str | None = None
    ) -> None:
        self.made.append(Made(job_id, quorum, resume_from))


@pytest.fixture
async def side() -> AsyncIterator[tuple[ClusterSide, RecordingMaker]]:
    fake = FakeCluster()
    fake.add_node(gpu_node("gpu-0", "A100-80GB", 8))
    maker = RecordingMaker()
    cluster = ClusterSide(fake, maker)
    await cluster.start(timeout=5)
    yield cluster, maker
    await cluster.stop()


async def test_the_engine_makes_a_resumed_job_s_pods_with_its_checkpoint(
    uow: FakeUnit, side: tuple[ClusterSide, RecordingMaker]
) -> None:
    cluster, maker = side
    at = datetime(2026, 11, 25, tzinfo=UTC)
    async with uow:  # known before the engine starts: read by its rebuild
        await uow.repo.add_pending("resumed", a_job("resumed").build(), at, resume_from=URI)
        await uow.commit()
    engine = SchedulingEngine(lambda: uow, SchedulerSettings(), cluster, clock=lambda: at.timestamp())
    await engine.cycle()
    async with uow:  # admitted while it runs: read by a cycle
        await uow.repo.add_pending("fresh", a_job("fresh").build(), at)
        await uow.repo.add_pending("later", a_job("later").build(), at, resume_from=URI + "-2")
        await uow.commit()
    await engine.cycle()

    assert {m.job_id: m.resume_from for m in maker.made} == {
        "resumed": URI,
        "fresh": None,
        "later": URI + "-2",
    }
