"""The scheduler's decision spans: one per attempt, in the job's trace, with its binds as children."""

from __future__ import annotations

import threading
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
from tessera.scheduler.domain.plugins.reserve import BindError, RecordingBinder
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


class MeetingBinder(RecordingBinder):
    """The first two binds wait for each other: they can only both return if they run at once."""

    def __init__(self, fail_pod: str | None = None) -> None:
        super().__init__()
        self.fail_pod = fail_pod
        self.threads: set[str] = set()
        self._lock = threading.Lock()
        self._meeting = threading.Barrier(2, timeout=30)
        self.met = 0

    def bind(self, allocation: Allocation) -> None:
        with self._lock:
            self.threads.add(threading.current_thread().name)
            meet = self.met < 2
            self.met += 1
        if meet:
            self._meeting.wait()  # BrokenBarrierError (a failed bind) if binds ran one at a time
        with self._lock:
            if allocation.pod == self.fail_pod:
                raise BindError(f"{allocation.pod} refused")
            self.bound.append(allocation)


def test_gangs_bind_at_once_each_bind_a_child_of_its_own_decision(spans: InMemorySpanExporter) -> None:
    binder = MeetingBinder(fail_pod="g3-1")
    built = assemble([make_node(f"n{i}").gpus(8).build() for i in range(4)], TracedBinder(binder))
    gangs = {f"g{i}": admitted_in_a_trace(f"g{i}") for i in range(6)}
    decisions = DecisionSpans({gang: info for gang, (info, _) in gangs.items()})
    for i, gang in enumerate(gangs):
        built.scheduler.submit(make_gang(gang, 2, gpus=2, submitted_at=float(i)))
    outcomes = built.scheduler.run(now=0.0, around=decisions.around)

    # Tried in queue order, outcomes in that order; the gang whose second bind failed is rolled back.
    assert [o.gang for o in outcomes] == list(gangs)
    kinds = {o.gang: o.kind for o in outcomes}
    assert kinds.pop("g3") is OutcomeKind.BIND_FAILED
    assert set(kinds.values()) == {OutcomeKind.PLACED}
    [failed] = [o for o in outcomes if o.gang == "g3"]
    assert [a.pod for a in failed.evicted] == ["g3-0"] == [a.pod for a in binder.evicted]
    assert all(name.startswith("scheduler-bind") for name in binder.threads)
    assert built.cache.allocation("g3-0") is None and built.cache.allocation("g3-1") is None
    for outcome in outcomes:
        span = decisions.take(outcome)
        assert span is not None
        span.end()

    by_span = {s.context.span_id: s for s in named(spans, DECISION_SPAN)}
    binds = named(spans, BIND_SPAN)
    assert len(binds) == 12
    for bind in binds:
        assert bind.parent is not None
        decision = by_span[bind.parent.span_id]
        gang = dict(decision.attributes or {})["gang"]
        assert dict(bind.attributes or {})["gang"] == gang
        assert bind.context.trace_id == gangs[str(gang)][1]
