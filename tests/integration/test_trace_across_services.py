"""One submitted job yields spans from admission and the scheduler that share one trace id."""

from __future__ import annotations

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
from tessera.core.observability.tracing import configure_tracing
from tessera.scheduler import bootstrap as scheduler
from tessera.scheduler.config import SchedulerSettings
from tessera.telemetry import bootstrap as telemetry
from tessera.telemetry.config import TelemetrySettings
from tessera.testing.services import eventually, running, settings_for

pytestmark = pytest.mark.integration


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = configure_tracing("test", processor=SimpleSpanProcessor(exporter))
    yield exporter
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # let the next test install its own provider


CLUSTER = """
nodes:
  - name_prefix: gpu-node-
    count: 2
    cpu: "64"
    memory: 512Gi
    gpus: {count: 8, model: A100-80GB}
"""


JOB = {
    "name": "train",
    "tenant": "research",
    "pod_groups": [{"name": "worker", "replicas": 2, "cpu": "4", "memory": "8Gi", "gpu": {"count": 2}}],
}


async def test_admission_and_scheduler_spans_share_the_job_trace(
    system: tuple[str, str], spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    nats_url, db = system
    a_settings = settings_for(AdmissionSettings, nats_url, db)
    s_settings = settings_for(SchedulerSettings, nats_url, db)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    t_settings = settings_for(TelemetrySettings, nats_url, db, cluster_file=tmp_path / "cluster.yaml")
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
            return job is not None and job.state == "placed"

        await eventually(placed, what="the job to be placed", timeout=30)

    job_spans = [s for s in spans.get_finished_spans() if (s.attributes or {}).get("job_id") == result.job_id]
    names = {s.name for s in job_spans}
    assert "admission.submit_job" in names
    assert "admission.admit" in names
    assert "scheduler.place_gang" in names
    trace_ids = {s.context.trace_id for s in job_spans}
    assert len(trace_ids) == 1, f"spans of one job span {len(trace_ids)} traces: {sorted(names)}"
