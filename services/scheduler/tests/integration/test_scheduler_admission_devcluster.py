"""A job submitted to admission runs on the devcluster: admitted, its Indexed Job unsuspended by
admission, its pods created by the Job controller with the template's image and bound by the
scheduler, and the scheduler's decision span joins the job's trace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tessera.admission import bootstrap as admission
from tessera.admission.adapters.repository import JobRepository
from tessera.admission.config import AdmissionSettings
from tessera.admission.service_layer.handlers import submit_job
from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION, JOB_POD_GROUP_LABEL
from tessera.core.db.migrations import migrate_all
from tessera.core.observability.tracing import configure_tracing
from tessera.devcluster.apiserver import PODS
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.scheduler import bootstrap as scheduler
from tessera.scheduler.config import SchedulerSettings
from tessera.telemetry import bootstrap as telemetry
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.builders import TRAINING_IMAGE
from tessera.testing.services import eventually, reset_jetstream, running, settings_for

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"

JOB = {
    "name": "ddp",
    "tenant": "research",
    "pod_groups": [
        {
            "name": "worker",
            "replicas": 2,
            "cpu": "4",
            "memory": "8Gi",
            "gpu": {"count": 4},
            "template": {"spec": {"containers": [{"name": "trainer", "image": TRAINING_IMAGE}]}},
        }
    ],
    "estimated_duration_s": 3600,
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = configure_tracing("test", processor=SimpleSpanProcessor(exporter))
    yield exporter
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # let the next test install its own provider


async def test_a_submitted_job_is_bound_on_the_cluster_within_its_trace(
    nats_url: str, fresh_database: str, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    await reset_jetstream(nats_url)
    await asyncio.to_thread(migrate_all, fresh_database)
    with DevCluster.from_file(CLUSTER_FILE, speed=20.0, duty_cycle=DutyCycleTrace.synthetic()) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        a_settings = settings_for(AdmissionSettings, nats_url, fresh_database, kubeconfig=kubeconfig)
        s_settings = settings_for(
            SchedulerSettings, nats_url, fresh_database, kubeconfig=kubeconfig, poll_s=0.2
        )
        t_settings = settings_for(TelemetrySettings, nats_url, fresh_database, cluster_file=CLUSTER_FILE)
        async with (
            running(telemetry.build(t_settings), t_settings),
            running(scheduler.build(s_settings), s_settings),
            running(admission.build(a_settings), a_settings) as adm,
        ):
            async with adm.ctx.uow() as uow:
                result = await submit_job(JOB, uow)
                await uow.commit()

            async def placed() -> bool:
                async with adm.ctx.uow() as uow:
                    job = await JobRepository(uow.session).get(result.job_id)
                return job is not None and job.state in ("placed", "running")

            await eventually(placed, what="the job placed in admission", timeout=30)
            pods, _ = cluster.store.list(PODS, "default")
            ours = [
                pod for pod in pods if pod["metadata"]["labels"].get("tessera.io/job-id") == result.job_id
            ]
            assert len(ours) == 2
            for pod in ours:
                assert pod["spec"]["schedulerName"] == "tessera"
                assert pod["spec"]["nodeName"]
                assert pod["metadata"]["labels"][JOB_POD_GROUP_LABEL] == "worker"
                assert pod["spec"]["containers"][0]["image"] == TRAINING_IMAGE
                assert GPU_ASSIGNMENT_ANNOTATION in pod["metadata"]["annotations"]
                assert pod["metadata"]["annotations"]["tessera.io/sim-duration"] == "3600"

    job_spans = [s for s in spans.get_finished_spans() if (s.attributes or {}).get("job_id") == result.job_id]
    names = {s.name for s in job_spans}
    assert {"admission.submit_job", "scheduler.place_gang"} <= names
    assert len({s.context.trace_id for s in job_spans}) == 1, sorted(
        (s.context.trace_id % 1000, s.name) for s in job_spans
    )
