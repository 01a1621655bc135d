"""The test OTLP collector receives what the real OTLP/HTTP exporter sends, and OTLP/JSON too."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tessera.testing.otlp import OtlpCollector


def _provider(url: str, service: str, compression: Compression = Compression.NoCompression) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url, compression=compression)))
    return provider


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_from_the_otlp_http_exporter_are_kept_with_their_parent_and_attributes(
    otlp_collector: OtlpCollector, compression: Compression
) -> None:
    provider = _provider(otlp_collector.traces_url, "tessera-example", compression)
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("outer", attributes={"job_id": f"job-{compression.value}"}) as outer,
        tracer.start_as_current_span(
            "inner", kind=trace.SpanKind.CONSUMER, attributes={"count": 3, "nodes": ["a", "b"], "ok": True}
        ),
    ):
        pass
    provider.shutdown()
    trace_id = format(outer.get_span_context().trace_id, "032x")

    (inner,) = otlp_collector.wait_for(lambda c: c.spans("inner", trace_id=trace_id), timeout=5)
    (root,) = otlp_collector.spans("outer", trace_id=trace_id)
    assert root.parent_span_id is None and root.has(job_id=f"job-{compression.value}")
    assert inner.parent_span_id == root.span_id and inner.kind == "consumer"
    assert inner.attributes == {"count": 3, "nodes": ("a", "b"), "ok": True}
    assert inner.service == "tessera-example"
    assert otlp_collector.trace(trace_id) == [root, inner]
    assert otlp_collector.children(root) == [inner] and otlp_collector.ancestors(inner) == [root]
    assert otlp_collector.spans(service="example", trace_id=trace_id) == [inner, root]  # ended first
    assert otlp_collector.trace_ids(job_id=f"job-{compression.value}") == {trace_id}


def test_otlp_json_is_accepted_with_hex_ids() -> None:
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5B8EFFF798038103D269B633813FC60C",
                                "spanId": "EEE19B7EC3C1B174",
                                "parentSpanId": "EEE19B7EC3C1B173",
                                "name": "decide",
                                "kind": 2,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {"key": "score", "value": {"intValue": "42"}},
                                    {"key": "ratio", "value": {"doubleValue": 0.5}},
                                    {
                                        "key": "tags",
                                        "value": {"arrayValue": {"values": [{"stringValue": "x"}]}},
                                    },
                                ],
                                "status": {"code": 2, "message": "bind failed"},
                            }
                        ]
                    }
                ],
            }
        ]
    }
    with OtlpCollector() as collector:
        response = httpx.post(collector.traces_url, json=body)
        assert response.status_code == 200 and response.json() == {}
        gzipped = httpx.post(
            collector.traces_url,
            content=gzip.compress(json.dumps(body).encode()),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        assert gzipped.status_code == 200
        spans = collector.wait_for_span("decide", count=2, timeout=2)
    span = spans[0]
    assert (span.trace_id, span.span_id, span.parent_span_id) == (
        "5b8efff798038103d269b633813fc60c",
        "eee19b7ec3c1b174",
        "eee19b7ec3c1b173",
    )
    assert span.attributes == {"score": 42, "ratio": 0.5, "tags": ("x",)}
    assert (span.kind, span.status, span.status_message, span.service) == (
        "server",
        "error",
        "bind failed",
        "svc",
    )
    assert span.end_ns - span.start_ns == 10**9


def test_garbage_is_refused_and_other_paths_are_not_served() -> None:
    with OtlpCollector() as collector:
        bad = httpx.post(
            collector.traces_url,
            content=b"\xff\x00garbage",
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert bad.status_code == 400 and collector.rejected
        assert httpx.post(collector.endpoint + "/v1/metrics", content=b"").status_code == 404
        assert collector.spans() == []


def test_waiting_names_what_was_awaited_and_what_arrived() -> None:
    with (
        OtlpCollector() as collector,
        pytest.raises(AssertionError, match=r"1 x missing\(job_id='j'\).*received: \[\]"),
    ):
        collector.wait_for_span("missing", timeout=0.2, job_id="j")


async def test_until_polls_without_blocking_the_event_loop() -> None:
    with OtlpCollector() as collector:
        provider = _provider(collector.traces_url, "svc")
        with provider.get_tracer("t").start_as_current_span("async-span"):
            pass
        provider.shutdown()
        found = await collector.until(lambda c: c.spans("async-span"), timeout=5)
    assert [s.name for s in found] == ["async-span"]
