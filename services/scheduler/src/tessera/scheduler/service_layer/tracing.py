"""The scheduler's decisions as spans, in the trace of the job they concern (docs/tracing.md).

Each attempt at a gang is one ``scheduler.place_gang`` span, opened on the cycle's thread in the
trace the job was admitted in, so that the ``scheduler.bind`` (and ``scheduler.evict``) span of
every API call the attempt makes is its child, binds made on the binding threads included. The span stays open until the outcome is recorded
and published, and carries the decision: the chosen nodes, the score, and how many nodes the
filters rejected and why. Outcomes decided outside an attempt (a Permit timeout, a lost node, a
recovery after a restart) get their span when they are recorded.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Protocol, TypeVar

from opentelemetry import propagate, trace
from opentelemetry.trace import Span

from tessera.core.observability.tracing import tracer
from tessera.scheduler.domain.framework.status import Diagnosis
from tessera.scheduler.domain.gang.scheduler import GangOutcome, OutcomeKind, PodDecision
from tessera.scheduler.domain.plugins.reserve import BindingPort
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, Allocation


class GangInfo(Protocol):
    """What a decision span needs of a gang (``outcomes.GangInfo``): its job and the job's trace."""

    @property
    def job_id(self) -> str: ...

    @property
    def trace(self) -> Mapping[str, str]: ...


T = TypeVar("T")

DECISION_SPAN = "scheduler.place_gang"
BIND_SPAN = "scheduler.bind"
EVICT_SPAN = "scheduler.evict"
NO_REJECTIONS = "none"


def _attributes(gang: str, info: GangInfo | None) -> dict[str, str]:
    return {"job_id": info.job_id, "gang": gang} if info is not None else {"gang": gang}


@contextmanager
def decision_span(gang: str, info: GangInfo | None) -> Iterator[Span]:
    """A ``scheduler.place_gang`` span in the gang's trace, current until the block ends."""
    parent = propagate.extract(dict(info.trace)) if info is not None else None
    with tracer().start_as_current_span(
        DECISION_SPAN, context=parent, attributes=_attributes(gang, info)
    ) as span:
        yield span


class DecisionSpans:
    """Opens the span of each attempt the gang scheduler makes (``GangScheduler.run(around=...)``)
    and keeps it open, keyed by the outcome, until :meth:`take` hands it to the recording. The
    steps of one attempt (deciding, binding, finishing) run in the same span."""

    def __init__(self, gangs: Mapping[str, GangInfo]) -> None:
        self._gangs = gangs
        self._open: dict[int, tuple[GangOutcome, Span]] = {}
        self._attempts: dict[str, Span] = {}  # attempts past their first step, not decided yet

    def around(self, gang: str, step: Callable[[], T]) -> T:
        span = self._attempts.pop(gang, None)
        if span is None:
            info = self._gangs.get(gang)
            parent = propagate.extract(dict(info.trace)) if info is not None else None
            span = tracer().start_span(DECISION_SPAN, context=parent, attributes=_attributes(gang, info))
        try:
            with trace.use_span(span, end_on_exit=False):
                result = step()
        except BaseException:
            span.end()
            raise
        if isinstance(result, GangOutcome):
            annotate_decision(span, result)
            self._open[id(result)] = (result, span)  # the outcome is kept too, so its id stays unique
        else:
            self._attempts[gang] = span
        return result

    def take(self, outcome: GangOutcome) -> Span | None:
        found = self._open.pop(id(outcome), None)
        return found[1] if found is not None else None

    def close(self) -> None:
        """End the spans nobody took (a cycle that failed before recording them)."""
        for _, span in self._open.values():
            span.end()
        for span in self._attempts.values():
            span.end()
        self._open.clear()
        self._attempts.clear()


def annotate_decision(span: Span, outcome: GangOutcome) -> None:
    """The decision on its span: outcome, nodes, score and the filters' rejections."""
    span.set_attribute("outcome", outcome.kind.value)
    if outcome.kind is OutcomeKind.PLACED and outcome.bound:
        span.set_attribute("nodes", ",".join(sorted(outcome.nodes)))
        span.set_attribute("pods", len(outcome.bound))
    if outcome.decisions:
        decisions = outcome.decisions
        span.set_attribute("score", sum(d.score for d in decisions))
        span.set_attribute("nodes.considered", max(d.nodes_considered for d in decisions))
        span.set_attribute("nodes.feasible", min(d.feasible_nodes for d in decisions))
        rejected = merged_rejections(decisions)
        span.set_attribute("nodes.rejected", max(sum(d.rejected.values()) for d in decisions))
        span.set_attribute("rejected", rejected.message() if rejected.rejected else NO_REJECTIONS)
        span.set_attribute("placements", [_placement(d) for d in decisions])
    elif outcome.diagnosis is not None:
        diagnosis = outcome.diagnosis
        span.set_attribute("nodes.considered", diagnosis.nodes_considered)
        span.set_attribute("nodes.feasible", 0)
        span.set_attribute("nodes.rejected", diagnosis.nodes_considered)
        span.set_attribute("rejected", diagnosis.message())
        if outcome.pod is not None:
            span.set_attribute("pod", outcome.pod)


def merged_rejections(decisions: tuple[PodDecision, ...]) -> Diagnosis:
    """The gang's rejections: for each reason, the most nodes it turned away from any one member."""
    counts: dict[str, int] = {}
    for decision in decisions:
        for reason, count in decision.rejected.items():
            counts[reason] = max(counts.get(reason, 0), count)
    return Diagnosis(counts, max((d.nodes_considered for d in decisions), default=0))


def _placement(decision: PodDecision) -> str:
    return (
        f"{decision.pod} -> {decision.node} (score {decision.score}, "
        f"{decision.feasible_nodes} of {decision.nodes_considered} nodes feasible)"
    )


def gpus_of(allocation: Allocation) -> str:
    """GPU indices, with the share where it is not a whole GPU: ``0,1`` or ``3:500m``."""
    return ",".join(
        str(index) if milli == MILLI_PER_GPU else f"{index}:{milli}m" for index, milli in allocation.gpu_milli
    )


BIND_PARALLELISM = 16
"""Gangs binding at once: as many as the Kubernetes adapter has threads for API calls."""


@functools.cache
def _binding_threads() -> ThreadPoolExecutor:
    """One pool for the process, made on first use (a rebuild makes a new binder, not new threads)."""
    return ThreadPoolExecutor(max_workers=BIND_PARALLELISM, thread_name_prefix="scheduler-bind")


class TracedBinder:
    """The binding port with a span per call, a child of the decision span current on the thread;
    a failed call ends its span in error with the exception recorded. Binds of many gangs run at
    once on threads of their own (:meth:`start` one, or :meth:`run_all` together): each waits on
    the API, not on the others nor on the decisions."""

    def __init__(self, port: BindingPort) -> None:
        self.port = port

    def start(self, call: Callable[[], T]) -> Future[T]:
        """Run ``call`` on a binding thread; returns at once (at most :data:`BIND_PARALLELISM` run)."""
        return _binding_threads().submit(call)

    def run_all(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Run ``calls`` on the binding threads, up to :data:`BIND_PARALLELISM` at once; their
        results in order (the first exception is raised once all have run)."""
        futures = [_binding_threads().submit(call) for call in calls]
        concurrent.futures.wait(futures)  # none is left running when one failed
        return [future.result() for future in futures]

    def bind(self, allocation: Allocation) -> None:
        with tracer().start_as_current_span(BIND_SPAN, attributes=_call(allocation)):
            self.port.bind(allocation)

    def evict(self, allocation: Allocation) -> None:
        with tracer().start_as_current_span(EVICT_SPAN, attributes=_call(allocation)):
            self.port.evict(allocation)


def _call(allocation: Allocation) -> dict[str, str | int]:
    return {
        "pod": allocation.pod,
        "node": allocation.node,
        "gang": allocation.gang,
        "gpus": gpus_of(allocation),
        "cpu_milli": allocation.cpu_milli,
        "memory_mib": allocation.memory_mib,
    }
