"""The admission cycle's decisions as spans in each job's own trace (docs/tracing.md): a wait that is
news, an admission, a preemption, each with its queue, flavor, decision and reason, and each linked
to the span of the cycle that decided it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import cancel_job, submit_job
from tessera.contracts.events import PreemptionRequested
from tessera.core.observability.tracing import configure_tracing
from tessera.testing.builders import a_job

FOUR_GPUS = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}],
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = configure_tracing("test", processor=SimpleSpanProcessor(exporter))
    yield exporter
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # let the next test install its own provider


async def submit(uow: Any, job_id: str, gpus: int, priority: int = 0) -> None:
    spec = a_job(job_id).tenant("team").priority(priority).group(gpus=gpus).as_dict()
    async with uow:
        await submit_job(spec, uow, job_id)
        await uow.commit()


async def cycle(uow: Any, **kwargs: Any) -> Any:
    async with uow:
        return await run_cycle(uow, **kwargs)


def of_job(exporter: InMemorySpanExporter, job_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("job_id") == job_id]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_a_job_that_waits_for_quota_then_is_admitted_tells_it_in_its_own_trace(
    uow: Any, spans: InMemorySpanExporter
) -> None:
    uow.configure(FOUR_GPUS)
    await submit(uow, "first", gpus=4)
    await submit(uow, "second", gpus=2)
    await cycle(uow)  # first admitted, second waits
    await cycle(uow)  # the same wait again is no news: no span
    async with uow:
        await cancel_job("first", uow, "cancelled by request")
        await uow.commit()
    await cycle(uow)  # second admitted

    story = of_job(spans, "second")
    assert [s.name for s in story] == ["admission.submit_job", "admission.wait", "admission.admit"]
    submitted, waited, admitted = story
    assert len({s.context.trace_id for s in story}) == 1
    assert waited.parent is not None and waited.parent.span_id == submitted.context.span_id
    assert attributes(waited) == {
        "job_id": "second",
        "queue": "team-q",
        "decision": "waiting",
        "reason": "QuotaExhausted",
        "message": "queue team-q: needs 2 a100 GPUs, 0 free in quota, no cohort to borrow from; "
        "no preemptible victims",
    }
    assert attributes(admitted) == {
        "job_id": "second",
        "queue": "team-q",
        "flavor": "a100",
        "decision": "admitted",
        "reason": "admitted to queue team-q in flavor a100",
        "borrowing": False,
    }
    cycles = [s for s in spans.get_finished_spans() if s.name == "admission.cycle"]
    assert len(cycles) == 3
    linked = [link.context.span_id for s in (waited, admitted) for link in s.links]
    assert linked == [cycles[0].context.span_id, cycles[2].context.span_id]
    assert attributes(cycles[0])["waiting"] == 1 and attributes(cycles[2])["admitted"] == 1


async def test_a_preemption_is_a_span_in_the_victims_trace_naming_the_preemptor(
    uow: Any, spans: InMemorySpanExporter
) -> None:
    uow.configure(FOUR_GPUS)
    await submit(uow, "low", gpus=4)
    await cycle(uow)
    await submit(uow, "urgent", gpus=4, priority=100)
    await cycle(uow)
    (asked,) = uow.events_of(PreemptionRequested)
    await cycle(uow, now=asked.deadline + timedelta(seconds=1))

    preempts = [s for s in of_job(spans, "low") if s.name == "admission.preempt"]
    assert [attributes(s)["decision"] for s in preempts] == ["preemption_requested", "preempted"]
    for span in preempts:
        assert attributes(span) | {"decision": ""} == {
            "job_id": "low",
            "queue": "team-q",
            "flavor": "a100",
            "decision": "",
            "reason": "InQueuePriority",
            "preemptor": "urgent",
        }
    assert len({s.context.trace_id for s in of_job(spans, "low")}) == 1
    waited = [attributes(s) for s in of_job(spans, "urgent") if s.name == "admission.wait"]
    assert waited == [
        {
            "job_id": "urgent",
            "queue": "team-q",
            "decision": "waiting",
            "reason": "WaitingForVictims",
            "message": "preempting low",
        }
    ]
