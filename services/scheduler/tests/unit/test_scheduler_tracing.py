"""The scheduler's decision spans: one per attempt, in the job's trace, with its binds as children."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tessera.core.observability.tracing import configure_tracing, current_trace_headers, tracer
from tessera.scheduler.domain.framework.builders import make_gang, make_node
from tessera.scheduler.domain.gang.assembly import Assembly, assemble
from tessera.scheduler.domain.gang.scheduler import OutcomeKind
from tessera.scheduler.domain.plugins.reserve import RecordingBinder
from tessera.scheduler.domain.snapshot import Allocation
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.tracing import (
    BIND_SPAN,
    DECISION_SPAN,
    EVICT_SPAN,
    DecisionSpans,
    TracedBinder,
    annotate_decision,
    gpus_of,
)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = configure_tracing("test", processor=SimpleSpanProcessor(exporter))
    yield exporter
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # let the next test install its own provider


def world(binder: RecordingBinder, nodes: int = 3) -> Assembly:
    built = assemble([make_node(f"n{i}").gpus(8).build() for i in range(nodes)], TracedBinder(binder))
    built.cache.assume(Allocation("busy", "other", "n0", tuple((i, 1000) for i in range(8))))
    return built


def admitted_in_a_trace(job: str) -> tuple[GangInfo, int]:
    """The gang's info as the engine keeps it: the headers of the job_admitted consumer's span."""
    with tracer().start_as_current_span("consume job_admitted") as span:
        headers = current_trace_headers()
    return GangInfo(job, "job", headers), span.get_span_context().trace_id


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_an_attempt_is_one_decision_span_in_the_jobs_trace_with_a_child_per_bind(
    spans: InMemorySpanExporter,
) -> None:
    binder = RecordingBinder()
    scheduler = world(binder)
    info, trace_id = admitted_in_a_trace("job")
    decisions = DecisionSpans({"job": info})
    scheduler.scheduler.submit(make_gang("job", 2, gpus=4))
    [outcome] = scheduler.scheduler.run(now=0.0, around=decisions.around)
    assert outcome.kind is OutcomeKind.PLACED
    assert named(spans, DECISION_SPAN) == []  # still open: the recording ends it
    span = decisions.take(outcome)
    assert span is not None and decisions.take(outcome) is None
    span.end()

    [decision] = named(spans, DECISION_SPAN)
    attributes = dict(decision.attributes or {})
    assert decision.context.trace_id == trace_id
    assert attributes["job_id"] == "job" and attributes["outcome"] == "placed"
    assert attributes["nodes"] == ",".join(sorted(outcome.nodes)) and attributes["pods"] == 2
    assert attributes["score"] == sum(d.score for d in outcome.decisions)
    assert attributes["nodes.considered"] == 3
    assert attributes["rejected"].startswith("insufficient GPU on 1 node")
    assert attributes["nodes.rejected"] >= 1
    assert len(attributes["placements"]) == 2 and "job-0 -> n" in attributes["placements"][0]

    binds = named(spans, BIND_SPAN)
    assert sorted(dict(b.attributes or {})["pod"] for b in binds) == ["job-0", "job-1"]
    for bind in binds:
        assert bind.parent is not None and bind.parent.span_id == decision.context.span_id
        assert bind.context.trace_id == trace_id
        assert dict(bind.attributes or {})["node"] in outcome.nodes


def test_a_failed_bind_ends_its_span_in_error_and_the_rollback_is_traced(
    spans: InMemorySpanExporter,
) -> None:
    binder = RecordingBinder(fail_on=frozenset({2}))
    scheduler = world(binder)
    info, _ = admitted_in_a_trace("job")
    decisions = DecisionSpans({"job": info})
    scheduler.scheduler.submit(make_gang("job", 2, gpus=4))
    [outcome] = scheduler.scheduler.run(now=0.0, around=decisions.around)
    assert outcome.kind is OutcomeKind.BIND_FAILED
    decisions.close()  # a span nobody took still ends

    [decision] = named(spans, DECISION_SPAN)
    assert dict(decision.attributes or {})["outcome"] == "bind_failed"
    binds = named(spans, BIND_SPAN)
    assert [b.status.status_code for b in binds] == [StatusCode.UNSET, StatusCode.ERROR]
    assert any(event.name == "exception" for event in binds[1].events)
    [evict] = named(spans, EVICT_SPAN)
    assert evict.parent is not None and evict.parent.span_id == decision.context.span_id


def test_an_unschedulable_decision_names_the_member_and_the_rejections(
    spans: InMemorySpanExporter,
) -> None:
    scheduler = world(RecordingBinder(), nodes=2)
    info, _ = admitted_in_a_trace("job")
    decisions = DecisionSpans({"job": info})
    scheduler.scheduler.submit(make_gang("job", 1, gpus=8, models=["H100"]))
    [outcome] = scheduler.scheduler.run(now=0.0, around=decisions.around)
    span = decisions.take(outcome)
    assert span is not None
    span.end()
    attributes = dict(named(spans, DECISION_SPAN)[0].attributes or {})
    assert attributes["outcome"] == "unschedulable" and attributes["pod"] == "job-0"
    assert attributes["nodes.feasible"] == 0 and attributes["nodes.considered"] == 2
    assert attributes["rejected"] == outcome.message


def test_an_outcome_without_an_attempt_is_annotated_when_recorded(spans: InMemorySpanExporter) -> None:
    scheduler = world(RecordingBinder())
    scheduler.scheduler.submit(make_gang("job", 1, gpus=4))
    [placed] = scheduler.scheduler.run(now=0.0)  # no wrapper: no decision span opened
    assert named(spans, DECISION_SPAN) == []
    with tracer().start_as_current_span(DECISION_SPAN) as span:
        annotate_decision(span, placed)
    attributes = dict(named(spans, DECISION_SPAN)[0].attributes or {})
    assert attributes["outcome"] == "placed" and attributes["pods"] == 1


def test_gpus_are_indices_with_the_share_of_a_fraction() -> None:
    assert gpus_of(Allocation("p", "g", "n", ((0, 1000), (1, 1000)))) == "0,1"
    assert gpus_of(Allocation("p", "g", "n", ((3, 500),))) == "3:500m"
