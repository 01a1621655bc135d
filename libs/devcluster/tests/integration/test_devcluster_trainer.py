"""Simulated trainers on checkpointable pods, driven through the official Kubernetes client: periodic
checkpoints to storage, a recreated pod resuming from them, and the checkpoint service's save request
over a real NATS answered with a report."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import numpy as np
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from nats.js import api

from tessera.checkpoint_client import ENV_URI, latest_uri, load
from tessera.cluster.cluster_file import NodeSpec
from tessera.contracts import subjects
from tessera.contracts.events import ReportCheckpoint, SaveCheckpoint
from tessera.core.messaging.envelope import decode, encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.devcluster.sim.trainer import (
    CHECKPOINT_INTERVAL_ANNOTATION,
    CHECKPOINT_URI_ENV,
    CHECKPOINTABLE_ANNOTATION,
    JOB_ID_LABEL,
    LAST_CHECKPOINT_ANNOTATION,
    LAST_CHECKPOINT_STEP_ANNOTATION,
    RESTORED_STEP_ANNOTATION,
    STATE_BYTES_ANNOTATION,
    STEP_ANNOTATION,
    STEPS_PER_SECOND_ANNOTATION,
    TrainerSettings,
)

pytestmark = pytest.mark.integration

SETTINGS = SimSettings(speed=1.0, pod_start_seconds=0.1)
STATE_BYTES = 1 << 20


def start_cluster(storage: Path, nats_url: str | None = None) -> DevCluster:
    nodes = [NodeSpec(f"gpu-{i}", 96_000, 1_048_576, "A100-80GB", 8, 81920, {}) for i in range(2)]
    trainer = TrainerSettings(nats_url=nats_url, storage_url=storage.as_uri(), report_interval_s=0.05)
    cluster = DevCluster(nodes, settings=SETTINGS, trainer=trainer, duty_cycle=DutyCycleTrace.synthetic())
    cluster.start()
    return cluster


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


@pytest.fixture
def cluster(storage: Path) -> Iterator[DevCluster]:
    running = start_cluster(storage)
    yield running
    running.stop()


def core_api(cluster: DevCluster) -> client.CoreV1Api:
    configuration = client.Configuration()
    configuration.host = cluster.url
    return client.CoreV1Api(client.ApiClient(configuration))


@pytest.fixture
def core(cluster: DevCluster) -> Iterator[client.CoreV1Api]:
    api = core_api(cluster)
    yield api
    api.api_client.close()


def wait_for(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll until `check` returns something truthy; fail with the last value when it never does."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition never held; last value: {value!r}")
        time.sleep(0.02)


def run_trainer(
    core: client.CoreV1Api,
    name: str,
    job: str,
    *,
    interval: str = "0.3",
    env: dict[str, str] | None = None,
    node: str = "gpu-0",
) -> None:
    """A checkpointable pod of the job, bound to the node: its trainer takes 50 steps a second."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {JOB_ID_LABEL: job},
            "annotations": {
                CHECKPOINTABLE_ANNOTATION: "true",
                STATE_BYTES_ANNOTATION: str(STATE_BYTES),
                STEPS_PER_SECOND_ANNOTATION: "50",
                CHECKPOINT_INTERVAL_ANNOTATION: interval,
            },
        },
        "spec": {
            "schedulerName": "tessera",
            "containers": [
                {
                    "name": "train",
                    "image": "trainer:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                }
            ],
        },
    }
    core.create_namespaced_pod("default", pod)
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name), target=client.V1ObjectReference(kind="Node", name=node)
    )
    core.create_namespaced_pod_binding(name, "default", binding, _preload_content=False)


def annotations(core: client.CoreV1Api, name: str) -> dict[str, str]:
    return dict(core.read_namespaced_pod(name, "default").metadata.annotations or {})


def annotated(core: client.CoreV1Api, name: str, key: str, at_least: int = 0) -> int | None:
    """The pod's integer annotation once it is there and at least `at_least`, else None."""
    value = annotations(core, name).get(key)
    return int(value) if value is not None and int(value) >= at_least else None


def checkpoints(storage: Path, job: str) -> dict[int, str]:
    """The job's complete checkpoints in storage, by step: their URIs."""
    found: dict[int, str] = {}
    for manifest in (storage / job).glob("*/manifest.json"):
        step, _ = load(manifest.parent.as_uri(), job_id=job)
        found[step] = manifest.parent.as_uri()
    return found


def saved_step(uri: str, job: str) -> int:
    """The step of a checkpoint, checked against what the trainer wrote into its state at that step."""
    step, state = load(uri, job_id=job)
    weights = state["weights"]
    assert weights.nbytes == STATE_BYTES
    assert int(weights[:8].view(np.int64)[0]) == step
    return step


def delete_and_wait(core: client.CoreV1Api, name: str) -> None:
    core.delete_namespaced_pod(name, "default")

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, "default")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone)


def test_a_trainer_checkpoints_periodically_and_a_recreated_pod_resumes_from_its_last_step(
    cluster: DevCluster, core: client.CoreV1Api, storage: Path
) -> None:
    run_trainer(core, "train-a", "job-resume")

    wait_for(lambda: len(checkpoints(storage, "job-resume")) >= 2)
    last = wait_for(lambda: annotated(core, "train-a", LAST_CHECKPOINT_STEP_ANNOTATION, at_least=1))
    first = annotations(core, "train-a")
    assert first[RESTORED_STEP_ANNOTATION] == "0"  # a fresh job starts at step 0
    assert int(first[STEP_ANNOTATION]) >= last
    assert saved_step(first[LAST_CHECKPOINT_ANNOTATION], "job-resume") == int(
        first[LAST_CHECKPOINT_STEP_ANNOTATION]
    )
    delete_and_wait(core, "train-a")
    wait_for(lambda: cluster.kubelet.trainers.running() == 0)  # its last flush is over

    # the job's next pod: it restores the newest checkpoint and saves nothing of its own
    run_trainer(core, "train-b", "job-resume", interval="none")
    restored = wait_for(lambda: annotated(core, "train-b", RESTORED_STEP_ANNOTATION, at_least=1))

    assert restored >= last
    assert restored in checkpoints(storage, "job-resume")
    assert restored == max(checkpoints(storage, "job-resume"))
    wait_for(lambda: annotated(core, "train-b", STEP_ANNOTATION, at_least=restored + 10))
    assert LAST_CHECKPOINT_ANNOTATION not in annotations(core, "train-b")


def test_a_pod_given_a_checkpoint_uri_restores_that_checkpoint(
    cluster: DevCluster, core: client.CoreV1Api, storage: Path
) -> None:
    run_trainer(core, "train-a", "job-uri")
    wait_for(lambda: len(checkpoints(storage, "job-uri")) >= 3)
    delete_and_wait(core, "train-a")
    wait_for(lambda: cluster.kubelet.trainers.running() == 0)
    saved = checkpoints(storage, "job-uri")  # the three it keeps
    oldest = min(saved)

    assert ENV_URI == CHECKPOINT_URI_ENV
    run_trainer(core, "train-b", "job-uri", interval="none", env={ENV_URI: saved[oldest]})
    restored = wait_for(lambda: annotated(core, "train-b", RESTORED_STEP_ANNOTATION, at_least=0))

    assert restored == saved_step(saved[oldest], "job-uri") == oldest
    assert restored < max(checkpoints(storage, "job-uri"))


def test_a_trainer_stops_when_its_node_is_reclaimed(
    cluster: DevCluster, core: client.CoreV1Api, storage: Path
) -> None:
    run_trainer(core, "train-spot", "job-spot", node="gpu-1")
    wait_for(lambda: annotated(core, "train-spot", LAST_CHECKPOINT_STEP_ANNOTATION, at_least=1))

    cluster.interrupt_spot("gpu-1", notice_s=0.2)

    wait_for(lambda: core.read_namespaced_pod("train-spot", "default").status.phase == "Failed")
    trainer = cluster.kubelet.trainers
    assert trainer.get("default/train-spot") is None  # released with the pod
    final = wait_for(lambda: (a := annotations(core, "train-spot")).get(STEP_ANNOTATION) and a)
    assert latest_uri(storage.as_uri(), "job-spot") is not None
    assert int(final[STEP_ANNOTATION]) >= int(final[LAST_CHECKPOINT_STEP_ANNOTATION])


# -- with the checkpoint service's NATS ------------------------------------------------------------------
@pytest.fixture
async def js(nats_url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(nats_url)
    jetstream = nc.jetstream()
    await ensure_stream(jetstream, "checkpoint", StreamLimits())  # as the checkpoint service does
    yield jetstream
    await nc.drain()


async def reports_for(js: Any, job: str, timeout: float = 30.0) -> list[ReportCheckpoint]:
    sub = await js.pull_subscribe(
        subjects.REPORT_CHECKPOINT,
        stream=subjects.stream_name("checkpoint"),
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
    )
    found: list[ReportCheckpoint] = []
    deadline = time.monotonic() + timeout
    try:
        while not found and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(10, timeout=0.5)
            except TimeoutError:
                continue
            for msg in msgs:
                await msg.ack()
                report = decode(msg.subject, msg.headers, msg.data).parse()
                if isinstance(report, ReportCheckpoint) and report.job_id == job:
                    found.append(report)
    finally:
        await sub.unsubscribe()
    return found


async def test_a_save_request_over_nats_is_saved_and_reported(nats_url: str, js: Any, storage: Path) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    cluster = await asyncio.to_thread(start_cluster, storage, nats_url)
    core = core_api(cluster)
    try:
        await asyncio.to_thread(run_trainer, core, "train-nats", job, interval="none")
        await asyncio.to_thread(wait_for, lambda: annotated(core, "train-nats", STEP_ANNOTATION, at_least=5))
        assert not checkpoints(storage, job)  # nothing periodic: only the request saves

        command = SaveCheckpoint(
            job_id=job,
            request_id="req-spot-1",
            reason="spot_interruption",
            deadline=datetime.now(UTC) + timedelta(seconds=30),
        )
        subject, headers, body = encode(command, "tessera-checkpoint")
        assert subject == subjects.save_checkpoint(job)
        await js.publish(subject, body, headers=headers)
        [report] = await reports_for(js, job)

        assert (report.request_id, report.outcome, report.reason) == ("req-spot-1", "saved", "requested")
        assert report.step >= 5 and report.size_bytes == STATE_BYTES
        assert report.uri.startswith("file://") and saved_step(report.uri, job) == report.step
        shown = await asyncio.to_thread(
            wait_for, lambda: (a := annotations(core, "train-nats")).get(LAST_CHECKPOINT_ANNOTATION) and a
        )
        assert shown[LAST_CHECKPOINT_ANNOTATION] == report.uri
        assert shown[LAST_CHECKPOINT_STEP_ANNOTATION] == str(report.step)
    finally:
        core.api_client.close()
        await asyncio.to_thread(cluster.stop)
