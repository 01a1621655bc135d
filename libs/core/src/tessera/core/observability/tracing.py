"""OpenTelemetry tracing with the W3C trace context carried in NATS headers."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span

TRACER_NAME = "tessera"


def configure_tracing(
    service: str, exporter: SpanExporter | None = None, processor: SpanProcessor | None = None
) -> TracerProvider:
    """Install a tracer provider for `service`. The OTLP exporter is used when
    `OTEL_EXPORTER_OTLP_ENDPOINT` is set; tests pass an in-memory processor instead."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"tessera-{service}"}))
    if processor is not None:
        provider.add_span_processor(processor)
    if exporter is None and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


#: the tracer `tracer()` last made, and the provider it came from
_tracer: tuple[trace.TracerProvider, trace.Tracer] | None = None


def tracer() -> trace.Tracer:
    """Tessera's tracer from the installed provider, asked for once while that provider stays
    installed: the SDK's `get_tracer` builds an instrumentation scope, installs a warnings filter and
    takes a lock on every call before it finds the tracer it made, a cost the consumer paid for
    every message handled. A provider installed later is asked for its own."""
    global _tracer
    provider = trace.get_tracer_provider()
    made = _tracer
    if made is None or made[0] is not provider:
        made = _tracer = (provider, provider.get_tracer(TRACER_NAME))
    return made[1]


def current_trace_headers() -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def span_from_headers(name: str, headers: Mapping[str, str], **attributes: str | int) -> Iterator[Span]:
    """A consumer span, child of the producer's context carried in the message headers."""
    parent = propagate.extract(headers)
    token = context.attach(parent)
    try:
        with tracer().start_as_current_span(
            name, kind=trace.SpanKind.CONSUMER, attributes=attributes
        ) as span:
            yield span
    finally:
        context.detach(token)


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""
