"""An OTLP/HTTP trace receiver for tests: what the services export, kept and queryable.

:class:`OtlpCollector` listens on a free loopback port and accepts ``POST /v1/traces`` as the
OpenTelemetry exporters send it: a protobuf ``ExportTraceServiceRequest``
(``application/x-protobuf``, what ``OTLPSpanExporter`` sends) or its OTLP/JSON form
(``application/json``, trace and span ids in hex), optionally gzip-compressed. Each span is kept as a
:class:`CollectedSpan` (name, ids, parent, kind, attributes, the resource's ``service.name``), and
tests query them by trace, by name or by attribute, or wait until what they expect has arrived.

Point a process at it with ``OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint`` (the exporter adds
``/v1/traces``); ``OTEL_BSP_SCHEDULE_DELAY`` (ms) shortens the batch processor's export interval.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"

_KINDS = {
    0: "unspecified",
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
}
_STATUS = {0: "unset", 1: "ok", 2: "error"}


@dataclass(frozen=True)
class CollectedSpan:
    """One received span. Ids are lower-case hex (32 digits for a trace, 16 for a span)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    service: str
    attributes: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "internal"
    start_ns: int = 0
    end_ns: int = 0
    status: str = "unset"
    status_message: str = ""
    links: tuple[tuple[str, str], ...] = ()
    """(trace id, span id) of each linked span."""
    events: tuple[str, ...] = ()
    """The names of the span's events (``exception`` for a recorded exception)."""

    def has(self, **attributes: Any) -> bool:
        """Whether every given attribute is present with this value (``job_id="..."``)."""
        return all(self.attributes.get(key) == value for key, value in attributes.items())

    def __str__(self) -> str:
        return f"{self.service}:{self.name}({self.span_id} <- {self.parent_span_id or 'root'})"


class OtlpCollector:
    """An OTLP/HTTP receiver on ``127.0.0.1`` (a thread of its own); use it as a context manager,
    or ``start()`` and ``close()``. Safe to query from any thread or event loop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._spans: list[CollectedSpan] = []
        self._changed = threading.Condition()
        self.requests = 0
        self.rejected: list[str] = []
        """Why each request that could not be decoded was refused (a test may assert it is empty)."""
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The base URL, for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/traces``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def traces_url(self) -> str:
        """The full URL, for ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or an exporter's ``endpoint``."""
        return self.endpoint + TRACES_PATH

    def start(self) -> OtlpCollector:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, name="otlp-collector", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OtlpCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what was received -----------------------------------------------------------------------

    def add(self, spans: Iterable[CollectedSpan]) -> None:
        with self._changed:
            self._spans.extend(spans)
            self._changed.notify_all()

    def clear(self) -> None:
        with self._changed:
            self._spans.clear()

    def spans(
        self,
        name: str | None = None,
        *,
        trace_id: str | None = None,
        service: str | None = None,
        **attributes: Any,
    ) -> list[CollectedSpan]:
        """Received spans, in arrival order, filtered by name, trace, service and attribute values."""
        with self._changed:
            found = list(self._spans)
        return [
            s
            for s in found
            if (name is None or s.name == name)
            and (trace_id is None or s.trace_id == trace_id)
            and (service is None or s.service == service or s.service == f"tessera-{service}")
            and s.has(**attributes)
        ]

    def trace(self, trace_id: str) -> list[CollectedSpan]:
        """Every span of one trace, ordered by start time."""
        return sorted(self.spans(trace_id=trace_id), key=lambda s: (s.start_ns, s.name))

    def trace_ids(self, name: str | None = None, **attributes: Any) -> set[str]:
        """The traces holding a span that matches (``trace_ids(job_id=...)``)."""
        return {s.trace_id for s in self.spans(name, **attributes)}

    def children(self, parent: CollectedSpan) -> list[CollectedSpan]:
        return [s for s in self.trace(parent.trace_id) if s.parent_span_id == parent.span_id]

    def ancestors(self, span: CollectedSpan) -> list[CollectedSpan]:
        """The span's parent, its parent's parent, ... as far as they were received."""
        by_id = {s.span_id: s for s in self.trace(span.trace_id)}
        chain: list[CollectedSpan] = []
        current = span
        while current.parent_span_id and current.parent_span_id in by_id:
            current = by_id[current.parent_span_id]
            if current in chain:
                break
            chain.append(current)
        return chain

    # -- waiting ---------------------------------------------------------------------------------

    def wait_for(
        self,
        probe: Callable[[OtlpCollector], Any],
        *,
        timeout: float = 30.0,
        what: str = "spans",
    ) -> Any:
        """Block until ``probe(self)`` returns something truthy (re-checked on every arrival) and
        return it; fail naming ``what`` and the span names received so far."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = probe(self)
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(timeout=min(left, 0.5))
        names = sorted({s.name for s in self.spans()})
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; span names received: {names}")

    def wait_for_span(
        self, name: str, *, timeout: float = 30.0, count: int = 1, **attributes: Any
    ) -> list[CollectedSpan]:
        """Block until at least ``count`` spans named ``name`` with these attributes arrived."""

        def probe(collector: OtlpCollector) -> list[CollectedSpan]:
            found = collector.spans(name, **attributes)
            return found if len(found) >= count else []

        shown = ", ".join(f"{k}={v!r}" for k, v in attributes.items())
        result: list[CollectedSpan] = self.wait_for(probe, timeout=timeout, what=f"{count} x {name}({shown})")
        return result

    async def until(
        self,
        probe: Callable[[OtlpCollector], Any],
        *,
        timeout: float = 30.0,
        interval: float = 0.1,
        what: str = "spans",
    ) -> Any:
        """:meth:`wait_for` for async tests: polls without blocking the event loop."""
        deadline = time.monotonic() + timeout
        while True:
            found = probe(self)
            if found:
                return found
            if time.monotonic() > deadline:
                names = sorted({s.name for s in self.spans()})
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}; span names received: {names}"
                )
            await asyncio.sleep(interval)


# -- decoding ----------------------------------------------------------------------------------------


def decode_request(body: bytes, content_type: str) -> list[CollectedSpan]:
    """The spans of one export request, protobuf or OTLP/JSON. Raises ``ValueError`` if undecodable."""
    if content_type.split(";")[0].strip().lower() == JSON:
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise ValueError(f"invalid JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise ValueError("an OTLP/JSON request is an object")
        return _from_json(payload)
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"invalid protobuf: {exc}") from exc
    return _from_protobuf(request)


def _from_protobuf(request: ExportTraceServiceRequest) -> list[CollectedSpan]:
    out: list[CollectedSpan] = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(_span(span, service))
    return out


def _span(span: Span, service: str) -> CollectedSpan:
    return CollectedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex() or None,
        service=service,
        attributes=_attributes(span.attributes),
        kind=_KINDS.get(span.kind, "unspecified"),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        status=_STATUS.get(span.status.code, "unset"),
        status_message=span.status.message,
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
        events=tuple(event.name for event in span.events),
    )


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which)


def _from_json(payload: Mapping[str, Any]) -> list[CollectedSpan]:
    out: list[CollectedSpan] = []
    for resource_spans in payload.get("resourceSpans") or []:
        resource = _json_attributes((resource_spans.get("resource") or {}).get("attributes"))
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for span in scope_spans.get("spans") or []:
                status = span.get("status") or {}
                out.append(
                    CollectedSpan(
                        name=str(span.get("name", "")),
                        trace_id=str(span.get("traceId", "")).lower(),
                        span_id=str(span.get("spanId", "")).lower(),
                        parent_span_id=str(span.get("parentSpanId") or "").lower() or None,
                        service=service,
                        attributes=_json_attributes(span.get("attributes")),
                        kind=_KINDS.get(int(span.get("kind", 0)), "unspecified"),
                        start_ns=int(span.get("startTimeUnixNano", 0)),
                        end_ns=int(span.get("endTimeUnixNano", 0)),
                        status=_STATUS.get(int(status.get("code", 0)), "unset"),
                        status_message=str(status.get("message", "")),
                        links=tuple(
                            (str(link.get("traceId", "")).lower(), str(link.get("spanId", "")).lower())
                            for link in span.get("links") or []
                        ),
                        events=tuple(str(e.get("name", "")) for e in span.get("events") or []),
                    )
                )
    return out


def _json_attributes(pairs: Any) -> dict[str, Any]:
    return {str(kv.get("key")): _json_value(kv.get("value") or {}) for kv in pairs or []}


def _json_value(value: Mapping[str, Any]) -> Any:
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])  # int64 is a string in OTLP/JSON
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return tuple(_json_value(v) for v in (value["arrayValue"] or {}).get("values") or [])
    if "kvlistValue" in value:
        return _json_attributes((value["kvlistValue"] or {}).get("values"))
    if "bytesValue" in value:
        return str(value["bytesValue"])
    return None


# -- the HTTP side -----------------------------------------------------------------------------------


def _handler(collector: OtlpCollector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if self.path.split("?")[0] != TRACES_PATH:
                self._answer(404, "text/plain", b"only POST /v1/traces is served")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            content_type = self.headers.get("Content-Type") or PROTOBUF
            try:
                body = _inflate(body, self.headers.get("Content-Encoding") or "")
                spans = decode_request(body, content_type)
            except (ValueError, OSError, zlib.error) as exc:
                collector.rejected.append(str(exc))
                self._answer(400, "text/plain", str(exc).encode())
                return
            collector.requests += 1
            collector.add(spans)
            if content_type.split(";")[0].strip().lower() == JSON:
                self._answer(200, JSON, b"{}")
            else:
                self._answer(200, PROTOBUF, ExportTraceServiceResponse().SerializeToString())

        def _answer(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: pytest output stays readable

    return Handler


def _inflate(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")
