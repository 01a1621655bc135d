"""HTTP requests and their latency are counted by route template (never by raw path), the limits'
answers and a failing handler's 500 included; every service's registry has the process metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import Body, FastAPI
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.core.observability.http_limits import RequestLimitsMiddleware
from tessera.core.observability.http_metrics import UNMATCHED, HttpMetricsMiddleware
from tessera.core.observability.metrics import Metrics

LIMIT = 1024


def make_app(metrics: Metrics | None) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/jobs/{job_id}")
    async def job(job_id: str) -> dict[str, str]:
        return {"id": job_id}

    @app.post("/v1/jobs")
    async def submit(body: dict[str, Any] = Body()) -> dict[str, int]:
        return {"keys": len(body)}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=LIMIT)
    app.add_middleware(HttpMetricsMiddleware)
    if metrics is not None:  # as the runner's lifespan sets it once the service has started
        app.state.ctx = SimpleNamespace(metrics=metrics)
    return app


@pytest.fixture
async def served() -> AsyncIterator[tuple[Metrics, httpx.AsyncClient]]:
    metrics = Metrics()
    transport = httpx.ASGITransport(app=make_app(metrics), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        yield metrics, client


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def requests(method: str, route: str, status: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("tessera_http_requests_total", (("method", method), ("route", route), ("status", status)))


async def test_requests_are_counted_by_route_template_and_status(
    served: tuple[Metrics, httpx.AsyncClient],
) -> None:
    metrics, client = served
    assert (await client.get("/v1/jobs/a")).status_code == 200
    assert (await client.get("/v1/jobs/b")).status_code == 200
    assert (await client.post("/v1/jobs", json={"name": "x"})).status_code == 200
    assert (await client.post("/v1/jobs", content=b"x" * (LIMIT + 1))).status_code == 413
    assert (await client.get("/nowhere")).status_code == 404
    assert (await client.get("/boom")).status_code == 500

    got = samples(metrics)
    assert got[requests("GET", "/v1/jobs/{job_id}", "200")] == 2
    assert got[requests("POST", "/v1/jobs", "200")] == 1
    assert got[requests("POST", UNMATCHED, "413")] == 1  # answered by the limits, before routing
    assert got[requests("GET", UNMATCHED, "404")] == 1
    assert got[requests("GET", "/boom", "500")] == 1
    routes = {dict(labels).get("route") for name, labels in got if name.startswith("tessera_http_")}
    assert routes == {"/v1/jobs/{job_id}", "/v1/jobs", "/boom", UNMATCHED}  # no raw path, no id
    duration = (
        "tessera_http_request_duration_seconds_count",
        (("method", "GET"), ("route", "/v1/jobs/{job_id}")),
    )
    assert got[duration] == 2


async def test_before_the_service_has_started_requests_pass_uncounted() -> None:
    transport = httpx.ASGITransport(app=make_app(None))
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        assert (await client.get("/v1/jobs/a")).json() == {"id": "a"}


def test_every_service_registry_has_the_process_and_interpreter_metrics() -> None:
    families = {f.name for f in text_string_to_metric_families(generate_latest(Metrics().registry).decode())}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"} <= families
    assert {"python_info", "python_gc_collections"} <= families
    assert {"tessera_http_requests", "tessera_http_request_duration_seconds"} <= families
