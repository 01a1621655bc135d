"""The consumer's span per message: a child of the trace its headers carry, from a tracer the
installed provider is asked for once (the SDK's `get_tracer` costs a warnings filter, a scope and a
lock on every call), and a provider installed later is asked for its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import Attributes

from tessera.core.observability.tracing import span_from_headers

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


class CountingProvider(TracerProvider):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self.exporter = InMemorySpanExporter()
        self.add_span_processor(SimpleSpanProcessor(self.exporter))

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        self.asked += 1
        return super().get_tracer(
            instrumenting_module_name, instrumenting_library_version, schema_url, attributes
        )


@pytest.fixture
def install() -> Iterator[list[CountingProvider]]:
    installed: list[CountingProvider] = []
    yield installed
    for provider in installed:
        provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # let the next test install its own provider


def installed(providers: list[CountingProvider]) -> CountingProvider:
    trace._TRACER_PROVIDER_SET_ONCE._done = False
    provider = CountingProvider()
    trace.set_tracer_provider(provider)
    providers.append(provider)
    return provider


def handle(n: int) -> None:
    for i in range(n):
        with span_from_headers("handle x", {"traceparent": PARENT}, consumer="c", event_id=i):
            pass


def test_the_installed_provider_is_asked_for_the_tracer_once(install: list[CountingProvider]) -> None:
    first = installed(install)
    handle(3)
    assert first.asked == 1  # before: once per message handled
    assert len(first.exporter.get_finished_spans()) == 3
    second = installed(install)
    handle(2)
    assert (first.asked, second.asked) == (1, 1)
    spans = second.exporter.get_finished_spans()
    assert len(spans) == 2 and len(first.exporter.get_finished_spans()) == 3
    for span in spans:  # children of the trace the headers carry
        assert span.name == "handle x" and span.kind is trace.SpanKind.CONSUMER
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
