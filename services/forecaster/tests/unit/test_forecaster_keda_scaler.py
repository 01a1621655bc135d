"""The KEDA external scaler over real gRPC, called by a client built from KEDA's externalscaler.proto as
KEDA calls it, and the external metrics API (over plain HTTP and over TLS), on in-memory repositories."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tessera.core import https
from tessera.core.embedded import free_port
from tessera.core.https import CertificateError
from tessera.core.tenant_tokens import TenantTokens
from tessera.forecaster.adapters.externalscaler import externalscaler_pb2 as pb
from tessera.forecaster.adapters.externalscaler import externalscaler_pb2_grpc as pb_grpc
from tessera.forecaster.config import MetricsTlsSettings
from tessera.forecaster.domain.forecast import Forecast
from tessera.forecaster.domain.model import LatestForecast, Series
from tessera.forecaster.domain.series import SeriesKey
from tessera.forecaster.entrypoints.api import router
from tessera.forecaster.entrypoints.metrics_server import check_certificate, metrics_app, metrics_tls_server
from tessera.forecaster.entrypoints.scaler import start_scaler
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.engine import EngineConfig
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork
from tessera.testing.fake_admission import FakeAdmission
from tessera.testing.fakes import FakeUnitOfWork
from tessera.testing.pki import make_pki
from tessera.testing.services import eventually

NOW = datetime(2026, 11, 25, 5, 0, 30, tzinfo=UTC)
ORIGIN = NOW.replace(second=0) - timedelta(minutes=1)


class Store:
    def __init__(self) -> None:
        self.series: list[Series] = []
        self.latest: dict[int, LatestForecast] = {}


class Repos:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def matching(self, metric: str, selector: dict[str, str]) -> list[Series]:
        return [s for s in self.store.series if s.key.matches(metric, selector)]

    async def all(self) -> list[Series]:
        return list(self.store.series)

    async def get(self, series_id: int) -> Any:
        return self.store.latest.get(series_id)


class FakeForecasterUnitOfWork(FakeUnitOfWork, ForecasterUnitOfWork):
    store = Store()

    def open_repositories(self, session: object) -> None:
        repos = Repos(self.store)
        self.series = repos  # type: ignore[assignment]
        self.forecasts = repos  # type: ignore[assignment]
        self.models = repos  # type: ignore[assignment]


def forecast(series_id: int, values: tuple[float, ...], margin: float = 0.0) -> LatestForecast:
    return LatestForecast(
        series_id, Forecast(ORIGIN, 60.0, values, "ets", margin), None, values[0], ORIGIN, NOW
    )


@pytest.fixture
def deps() -> ForecasterDeps:
    store = Store()
    store.series = [
        Series(1, SeriesKey.of("requests_per_s", {"app": "chat"}), 60.0),
        Series(2, SeriesKey.of("requests_per_s", {"app": "search"}), 60.0),
    ]
    store.latest = {1: forecast(1, (2.0, 8.0, 3.0, 1.0), margin=0.5), 2: forecast(2, (0.0, 0.0, 0.0, 0.0))}
    FakeForecasterUnitOfWork.store = store
    return ForecasterDeps(
        uow=FakeForecasterUnitOfWork,
        stop=asyncio.Event(),
        step_s=60.0,
        engine=EngineConfig(),
        candidates=list,
        history_s=3600.0,
        default_window_s=120.0,
        clock=lambda: NOW,
    )


@pytest.fixture
async def keda(deps: ForecasterDeps) -> AsyncIterator[pb_grpc.ExternalScalerStub]:
    server, port = await start_scaler(deps, "127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]
    deps.stop.set()
    await server.stop(grace=0)


def ref(**metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace="serving", scalerMetadata=metadata)


CHAT = {"predictiveAutoscaler": "chat", "metric": "requests_per_s", "selector": "app=chat", "target": "2.5"}


async def test_keda_gets_the_metric_spec_and_the_served_value_as_floats(keda: Any) -> None:
    spec = await keda.GetMetricSpec(ref(**CHAT, windowSeconds="120"))
    (metric,) = spec.metricSpecs
    assert (metric.metricName, metric.targetSizeFloat, metric.targetSize) == ("tessera-chat", 2.5, 3)
    metrics = await keda.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=ref(**CHAT), metricName=metric.metricName)
    )
    (value,) = metrics.metricValues
    # the largest forecast over the next two minutes (8.0) plus the margin (0.5)
    assert (value.metricName, value.metricValueFloat, value.metricValue) == ("tessera-chat", 8.5, 9)
    assert (await keda.IsActive(ref(**CHAT))).result is True


async def test_a_series_forecast_at_zero_is_not_active(keda: Any) -> None:
    idle = {**CHAT, "selector": "app=search"}
    assert (await keda.IsActive(ref(**idle))).result is False
    stream = keda.StreamIsActive(ref(**idle))
    first = await asyncio.wait_for(stream.read(), 5)
    assert first.result is False  # the state is sent at once
    stream.cancel()


async def test_an_unknown_metric_is_not_found_and_missing_metadata_is_invalid(keda: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await keda.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(**{**CHAT, "metric": "nothing"})))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await keda.IsActive(ref(metric="requests_per_s"))
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_external_metrics_api_serves_an_external_metric_value_list(deps: ForecasterDeps) -> None:
    app = FastAPI()
    app.include_router(router)
    app.state.deps = deps
    client = TestClient(app)
    response = client.get(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/serving/requests_per_s",
        params={"labelSelector": "app=chat,window=120"},
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["kind"], body["apiVersion"]) == (
        "ExternalMetricValueList",
        "external.metrics.k8s.io/v1beta1",
    )
    (item,) = body["items"]
    assert item["value"] == "8500m" and item["windowSeconds"] == 120
    assert item["metricLabels"]["tessera.io/source"] == "forecast"
    missing = client.get("/apis/external.metrics.k8s.io/v1beta1/namespaces/serving/nothing")
    assert missing.status_code == 200 and missing.json()["items"] == []  # as a selector matching nothing


async def test_the_external_metrics_api_is_served_over_tls_to_a_client_that_trusts_its_ca(
    deps: ForecasterDeps, tmp_path: Path
) -> None:
    """A real TLS handshake, as the aggregation layer makes it with the APIService's caBundle: the
    metrics routes answer on the HTTPS port, a client trusting another CA is refused, the forecaster's
    own routes are not served there, and a renewed certificate is served without a restart."""
    pki, other = make_pki(tmp_path / "pki", "forecaster-ca"), make_pki(tmp_path / "other", "other-ca")
    tls = MetricsTlsSettings(port=free_port(), cert_file=pki.cert, key_file=pki.key)
    check_certificate(tls)
    server = metrics_tls_server(metrics_app(deps), "127.0.0.1", tls)
    reloader = https.reloader_of(server, tls.cert_file, tls.key_file)
    task = asyncio.create_task(server.serve())
    base = f"https://127.0.0.1:{tls.port}"
    url = f"{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/serving/requests_per_s"

    async def get(ca: Path, target: str = url) -> httpx.Response | None:
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
            try:
                return await client.get(target, params={"labelSelector": "app=chat,window=120"})
            except httpx.ConnectError as error:
                assert "CERTIFICATE_VERIFY_FAILED" in str(error)
                return None

    async def started() -> bool:
        return server.started

    try:
        await eventually(started, what="the external metrics API serving HTTPS")
        reply = await get(pki.ca)
        assert reply is not None and reply.status_code == 200
        (item,) = reply.json()["items"]
        assert item["value"] == "8500m" and item["metricLabels"]["tessera.io/source"] == "forecast"
        assert await get(other.ca) is None
        own = await get(pki.ca, f"{base}/v1/series")
        assert own is not None and own.status_code == 404
        tls.cert_file.write_bytes(other.cert.read_bytes())  # type: ignore[union-attr]
        tls.key_file.write_bytes(other.key.read_bytes())  # type: ignore[union-attr]
        assert reloader.reload_if_changed() is True
        renewed = await get(other.ca)
        assert renewed is not None and renewed.status_code == 200
        assert await get(pki.ca) is None
    finally:
        server.should_exit = True
        await task


def test_a_certificate_that_does_not_load_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate\n")
    (tmp_path / "tls.key").write_text("not a key\n")
    bad = MetricsTlsSettings(cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key")
    with pytest.raises(CertificateError, match=r"metrics_tls.cert_file .*tls.crt / metrics_tls.key_file"):
        check_certificate(bad)
    with pytest.raises(ValueError, match=r"metrics_tls\.key_file is required"):
        MetricsTlsSettings(cert_file=tmp_path / "tls.crt")


@pytest.fixture
def two_teams(deps: ForecasterDeps) -> ForecasterDeps:
    """Two PredictiveAutoscalers' own series (a `prometheus` metric's, labelled `<namespace>.<name>`) in
    two namespaces, beside a series no namespace owns."""
    store = FakeForecasterUnitOfWork.store
    store.series += [
        Series(3, SeriesKey.of("prometheus", {"autoscaler": "team-b.web"}), 60.0),
        Series(4, SeriesKey.of("prometheus", {"autoscaler": "team-a.api"}), 60.0),
        Series(5, SeriesKey.of("prometheus", {"autoscaler": "team-a.jobs.v2"}), 60.0),
    ]
    store.latest |= {
        3: forecast(3, (42.0, 42.0, 42.0, 42.0)),
        4: forecast(4, (5.0, 5.0, 5.0, 5.0)),
        5: forecast(5, (1.0, 1.0, 1.0, 1.0)),
    }
    return deps


def test_the_external_metrics_api_serves_only_the_requests_namespace(two_teams: ForecasterDeps) -> None:
    app = FastAPI()
    app.include_router(router)
    app.state.deps = two_teams
    client = TestClient(app)

    def get(namespace: str, metric: str, selector: str = "") -> list[dict[str, Any]]:
        response = client.get(
            f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
            params={"labelSelector": selector} if selector else {},
        )
        assert response.status_code == 200, response.text
        assert response.json()["kind"] == "ExternalMetricValueList"
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    (own,) = get("team-b", "prometheus", "autoscaler=team-b.web")
    assert own["value"] == "42000m"
    # another namespace's autoscaler is not there, as a selector matching nothing is not
    assert get("team-a", "prometheus", "autoscaler=team-b.web") == []
    assert get("team", "prometheus", "autoscaler=team-b.web") == []
    assert get("team-a", "prometheus", "autoscaler=team-a.nothing") == []
    assert get("team-a", "unknown_metric") == []
    # an empty selector sums the namespace's own series only
    (mine,) = get("team-a", "prometheus")
    assert mine["value"] == "6000m"
    assert get("elsewhere", "prometheus") == []
    # series no namespace owns are the cluster's
    (chat,) = get("team-a", "requests_per_s", "app=chat,window=120")
    assert chat["value"] == "8500m"


class NoModels:
    async def get(self, series_id: int) -> None:
        return None


class UnitOfWorkWithoutModels(FakeForecasterUnitOfWork):
    def open_repositories(self, session: object) -> None:
        super().open_repositories(session)
        self.models = NoModels()  # type: ignore[assignment]


async def test_the_series_list_needs_a_token_and_shows_a_tenant_its_namespace_alone(
    two_teams: ForecasterDeps,
) -> None:
    """`GET /v1/series` as the external metrics API reads: a tenant (its namespace) sees its own
    autoscalers' series and the cluster's, never another namespace's; the admin sees every one."""
    admission = FakeAdmission(
        tokens={"tok-a": "team-a", "tok-b": "team-b", "tok-new": "team-new", "issued-admin": None},
        jobs={"j-a": "team-a", "j-b": "team-b"},
    )
    two_teams.uow = UnitOfWorkWithoutModels
    two_teams.tokens = TenantTokens(
        "http://admission", "required", "root-token", transport=admission.transport()
    )
    app = FastAPI()
    app.include_router(router)
    app.state.deps = two_teams
    client = TestClient(app)
    cluster = {"requests_per_s{app=chat}", "requests_per_s{app=search}"}
    keys = {s.id: str(s.key) for s in FakeForecasterUnitOfWork.store.series}
    assert cluster == {keys[1], keys[2]}, "the cluster's series, as the service names them"
    team_a, team_b = {keys[4], keys[5]}, {keys[3]}

    def listed(token: str | None, **params: str) -> set[str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = client.get("/v1/series", headers=headers, params=params)
        assert response.status_code == 200, response.text
        return {row["series"] for row in response.json()}

    for headers in ({}, {"Authorization": "Bearer made-up"}):
        refused = client.get("/v1/series", headers=headers)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    assert listed("tok-a") == cluster | team_a
    assert listed("tok-b") == cluster | team_b
    assert listed("tok-new") == cluster, "a tenant without jobs yet: no namespace's"
    assert (
        client.get(
            "/v1/series", headers={"Authorization": "Bearer tok-a"}, params={"namespace": "team-b"}
        ).status_code
        == 403
    )
    assert listed("tok-a", namespace="team-a") == cluster | team_a
    # the admin sees every namespace's, or narrows to one
    everything = cluster | team_a | team_b
    assert listed("root-token") == everything and listed("issued-admin") == everything
    assert listed("root-token", namespace="team-b") == cluster | team_b
    two_teams.tokens = TenantTokens(None, "disabled")
    assert listed(None) == everything
    responses = app.openapi()["paths"]["/v1/series"]["get"]["responses"]
    assert {"200", "401"} <= set(responses)


async def test_the_keda_scaler_serves_only_the_scaled_objects_namespace(
    two_teams: ForecasterDeps, keda: Any
) -> None:
    def in_ns(namespace: str, **metadata: str) -> pb.ScaledObjectRef:
        return pb.ScaledObjectRef(name="web", namespace=namespace, scalerMetadata=metadata)

    web = {"predictiveAutoscaler": "team-b/web", "metric": "prometheus", "selector": "autoscaler=team-b.web"}
    own = await keda.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=in_ns("team-b", **web)))
    assert own.metricValues[0].metricValueFloat == 42.0
    stolen = [
        in_ns("team-a", **{**web, "predictiveAutoscaler": "team-a/web"}),  # a selector naming team-b's
        in_ns("team-a", **web),  # and an autoscaler of team-b's too
        in_ns("", **web),  # no namespace at all
    ]
    for ref_ in stolen:
        for call in (
            keda.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref_)),
            keda.GetMetricSpec(ref_),
            keda.IsActive(ref_),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    stream = keda.StreamIsActive(stolen[0])
    assert (await asyncio.wait_for(stream.read(), 5)).result is False
    stream.cancel()
    # an empty selector sums the namespace's own series only
    everything = {"predictiveAutoscaler": "team-a/all", "metric": "prometheus"}
    mine = await keda.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=in_ns("team-a", **everything)))
    assert mine.metricValues[0].metricValueFloat == 6.0
    with pytest.raises(grpc.aio.AioRpcError) as none:
        await keda.IsActive(in_ns("elsewhere", **{**everything, "predictiveAutoscaler": "elsewhere/all"}))
    assert none.value.code() == grpc.StatusCode.NOT_FOUND
    # a series no namespace owns is the cluster's
    chat = await keda.IsActive(in_ns("team-a", **{**CHAT, "predictiveAutoscaler": "team-a/chat"}))
    assert chat.result is True
