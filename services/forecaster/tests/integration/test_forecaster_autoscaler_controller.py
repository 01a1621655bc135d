"""The PredictiveAutoscaler controller on real Postgres and NATS, against the devcluster's API server through
the official `kubernetes` client: it owns an autoscaling/v2 HPA on the forecast (an External metric whose
total over the target gives the replicas), writes the forecast and the recommendation in status, scales
nothing in Preview, reports an unknown target or metric as a condition and an Event, and owns a KEDA
ScaledObject on its external scaler once the cluster serves them. A `prometheus` metric is read from a
real HTTP server answering Prometheus' query API as Prometheus does, errors included: a query that never
worked gets no HPA, and one that fails after working keeps its HPA, serving the fallback."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.core.db.migrations import migrate
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.apiserver.resources import DEFAULT_RESOURCES, ResourceRegistry
from tessera.devcluster.sim.hpa import HORIZONTAL_POD_AUTOSCALERS
from tessera.forecaster import bootstrap
from tessera.forecaster.adapters.prometheus import PrometheusSource, PromQLError
from tessera.forecaster.config import ForecasterSettings
from tessera.forecaster.domain.series import SeriesKey, bucket
from tessera.forecaster.service_layer.forecasting import forecast_round
from tessera.testing.services import eventually, running, settings_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
CRD = ROOT / "deploy" / "crds" / "tessera.io_predictiveautoscalers.yaml"
KEDA_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {
        "group": "keda.sh",
        "scope": "Namespaced",
        "names": {"kind": "ScaledObject", "plural": "scaledobjects", "singular": "scaledobject"},
        "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}}}],
    },
}
NS = "default"


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer(registry=ResourceRegistry((*DEFAULT_RESOURCES, HORIZONTAL_POD_AUTOSCALERS)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class FakePrometheus(BaseHTTPRequestHandler):
    """`GET /api/v1/query`: `sum(chat_requests)` is a one-element vector of the current reading; any other
    query is rejected with a 400 and a `bad_data` body, as Prometheus rejects a query it cannot parse.
    While `unavailable`, every query gets Prometheus' 503 (`errorType: timeout`)."""

    reading = 42.0
    queries: list[str] = []
    unavailable = False

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        params = urllib.parse.parse_qs(url.query)
        query = params.get("query", [""])[0]
        FakePrometheus.queries.append(query)
        if url.path != "/api/v1/query":
            self._send(404, {"status": "error", "errorType": "not_found", "error": url.path})
        elif FakePrometheus.unavailable:
            error = "query timed out in expression evaluation"
            self._send(503, {"status": "error", "errorType": "timeout", "error": error})
        elif query == "sum(chat_requests)":
            at = float(params["time"][0])
            result = [{"metric": {}, "value": [at, str(FakePrometheus.reading)]}]
            self._send(200, {"status": "success", "data": {"resultType": "vector", "result": result}})
        else:
            error = f'1:{len(query) + 1}: parse error: unexpected end of input in "{query}"'
            self._send(400, {"status": "error", "errorType": "bad_data", "error": error})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_prometheus_source_reads_a_vector_and_reports_prometheus_own_error(prometheus: str) -> None:
    source = PrometheusSource(prometheus)
    assert source.query("sum(chat_requests)", datetime.now(UTC)) == FakePrometheus.reading
    with pytest.raises(PromQLError, match=r'bad_data: 1:5: parse error: unexpected end of input in "sum\("'):
        source.query("sum(", datetime.now(UTC))
    with pytest.raises(PromQLError, match="unreachable"):
        PrometheusSource("http://127.0.0.1:9").query("up", datetime.now(UTC))


class Kube:
    """The test's own view of the cluster, through the official client."""

    def __init__(self, url: str) -> None:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = url
        self.api = client.ApiClient(configuration)
        self.custom = client.CustomObjectsApi(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.core = client.CoreV1Api(self.api)
        self.crds = client.ApiextensionsV1Api(self.api)

    def pa(self, name: str, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": "tessera.io/v1alpha1",
            "kind": "PredictiveAutoscaler",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
                "minReplicas": 1,
                "maxReplicas": 20,
                "metric": {
                    "type": "events",
                    "events": {"name": "requests_per_s"},
                    "selector": {"app": "chat"},
                },
                "target": 10,
                "predictionWindowSeconds": 300,
                "mode": "Auto",
                "via": "hpa",
                **spec,
            },
        }
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            "tessera.io", "v1alpha1", NS, "predictiveautoscalers", body
        )
        return created

    def get(self, group: str, version: str, plural: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(group, version, NS, plural, name)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise
        return found

    def status(self, name: str) -> dict[str, Any]:
        obj = self.get("tessera.io", "v1alpha1", "predictiveautoscalers", name) or {}
        return dict(obj.get("status") or {})

    def conditions(self, name: str) -> dict[str, tuple[str, str]]:
        return {c["type"]: (c["status"], c["reason"]) for c in self.status(name).get("conditions") or []}

    def hpa(self, name: str) -> dict[str, Any] | None:
        return self.get("autoscaling", "v2", "horizontalpodautoscalers", name)

    def event_reasons(self, name: str) -> list[str]:
        events = self.core.list_namespaced_event(NS).items
        return [e.reason for e in events if e.involved_object.name == name]


async def seed(deps: Any, now: datetime) -> float:
    """Three hours of requests_per_s{app=chat}, one reading a minute, up to the last complete minute;
    returns the newest reading."""
    last = bucket(now, 60.0) - timedelta(minutes=1)
    value = 0.0
    async with deps.uow() as uow:
        s = await uow.series.get_or_add(SeriesKey.of("requests_per_s", {"app": "chat"}), 60.0, "mean", None)
        for i in range(180):
            value = 50.0 + 30.0 * math.sin(i / 20) + (i % 7)
            await uow.observations.add(s.id, last - timedelta(minutes=179 - i), "", value)
        await uow.commit()
    return value


async def test_the_controller_owns_an_hpa_on_the_forecast_and_reports_what_it_cannot_do(
    nats_url: str, fresh_database: str, apiserver: ApiServer, prometheus: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(migrate, "forecaster", fresh_database)
    kube = Kube(apiserver.url)
    kube.crds.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
    kube.apps.create_namespaced_deployment(
        NS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "chat"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "chat"}},
                "template": {
                    "metadata": {"labels": {"app": "chat"}},
                    "spec": {"containers": [{"name": "chat", "image": "registry.example/chat:1"}]},
                },
            },
        },
    )
    settings = settings_for(
        ForecasterSettings,
        nats_url,
        fresh_database,
        grpc_host="127.0.0.1",
        grpc_port=0,
        kubeconfig=apiserver.write_kubeconfig(tmp_path / "kubeconfig"),
        controller_interval_s=0.2,
        prometheus_url=prometheus,
    )
    async with running(bootstrap.build(settings), settings) as svc:
        await seed(svc.deps, datetime.now(UTC))
        assert await forecast_round(svc.deps) == 1
        await asyncio.to_thread(kube.pa, "chat")
        await asyncio.to_thread(kube.pa, "preview", mode="Preview")
        lost_ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gone"}
        await asyncio.to_thread(kube.pa, "lost", scaleTargetRef=lost_ref)
        ghost_metric = {"type": "events", "events": {"name": "nobody_records_this"}}
        await asyncio.to_thread(kube.pa, "ghost", metric=ghost_metric)
        await asyncio.to_thread(kube.pa, "keda", via="keda")
        promql = {"type": "prometheus", "prometheus": {"query": "sum(chat_requests)"}}
        await asyncio.to_thread(kube.pa, "prom", metric=promql)
        bad_promql = {"type": "prometheus", "prometheus": {"query": "sum("}}
        await asyncio.to_thread(kube.pa, "badprom", metric=bad_promql)

        async def settled() -> bool:
            names = ("chat", "preview", "lost", "ghost", "keda", "prom", "badprom")
            return all(await asyncio.to_thread(lambda: [kube.status(n).get("conditions") for n in names]))

        await eventually(settled, timeout=30, what="every autoscaler's status")

        # Auto via hpa: an HPA it owns, on the forecast as an External metric
        hpa = await asyncio.to_thread(kube.hpa, "chat")
        assert hpa is not None
        (owner,) = hpa["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("PredictiveAutoscaler", "chat", True)
        (metric,) = hpa["spec"]["metrics"]
        assert metric["external"]["metric"] == {
            "name": "requests_per_s",
            "selector": {"matchLabels": {"app": "chat", "window": "300"}},
        }
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "10"}
        assert hpa["spec"]["scaleTargetRef"]["name"] == "chat"
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 20)
        status = await asyncio.to_thread(kube.status, "chat")
        assert status["source"] == "forecast" and status["model"]
        assert status["forecast"] > 0 and status["recentError"] >= 0
        assert status["recommendedReplicas"] == min(20, math.ceil(status["forecast"] / 10 - 1e-9))
        assert "-> " + str(status["recommendedReplicas"]) in status["reason"]
        conditions = await asyncio.to_thread(kube.conditions, "chat")
        assert conditions == {
            "Ready": ("True", "Ready"),
            "Forecasting": ("True", "Forecast"),
            "Scaling": ("True", "Owned"),
        }

        # Preview: the same recommendation, nothing that scales
        assert await asyncio.to_thread(kube.hpa, "preview") is None
        preview = await asyncio.to_thread(kube.status, "preview")
        assert preview["recommendedReplicas"] == status["recommendedReplicas"]
        assert (await asyncio.to_thread(kube.conditions, "preview"))["Scaling"] == ("False", "Preview")

        # an unknown target and an unknown metric: a condition and an Event, no HPA
        assert (await asyncio.to_thread(kube.conditions, "lost"))["Ready"] == ("False", "TargetNotFound")
        assert (await asyncio.to_thread(kube.conditions, "ghost"))["Ready"] == ("False", "MetricNotFound")
        assert await asyncio.to_thread(kube.hpa, "lost") is None
        assert await asyncio.to_thread(kube.hpa, "ghost") is None
        assert "TargetNotFound" in await asyncio.to_thread(kube.event_reasons, "lost")
        assert "MetricNotFound" in await asyncio.to_thread(kube.event_reasons, "ghost")

        # prometheus: each pass records the query's value in the autoscaler's own series; until it has
        # history it is served reactively (the last reading) and says why; a bad query shows Prometheus' error
        async with svc.deps.uow() as uow:
            series = await uow.series.find(SeriesKey.of("prometheus", {"autoscaler": "default.prom"}))
            assert series is not None
            points = await uow.observations.points(series, datetime.now(UTC) - timedelta(minutes=5))
            assert list(points.values())[-1] == FakePrometheus.reading
        # a reading is in the step it was taken in; a minute on, that step is complete and forecast from
        svc.deps.clock = lambda: datetime.now(UTC) + timedelta(minutes=1)
        await forecast_round(svc.deps)

        async def prom_served() -> dict[str, Any]:
            found = await asyncio.to_thread(kube.status, "prom")
            return found if found.get("forecast") == FakePrometheus.reading else {}

        prom = await eventually(prom_served, timeout=30, what="the prometheus autoscaler's recommendation")
        assert prom["source"] == "reactive"
        assert prom["recommendedReplicas"] == math.ceil(FakePrometheus.reading / 10)
        assert (await asyncio.to_thread(kube.conditions, "prom"))["Forecasting"] == ("False", "Reactive")
        bad = await asyncio.to_thread(kube.status, "badprom")
        ready = next(c for c in bad["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "PrometheusError")
        assert 'bad_data: 1:5: parse error: unexpected end of input in "sum("' in ready["message"]
        assert await asyncio.to_thread(kube.hpa, "badprom") is None  # its metric never worked: no HPA

        # a query that fails after working (Prometheus timing out) keeps the HPA, its uid (and so the
        # HPA controller's history of it) unchanged; it acts on what is still served, the last reading
        prom_hpa = await asyncio.to_thread(kube.hpa, "prom")
        assert prom_hpa is not None
        FakePrometheus.unavailable = True
        try:

            async def prom_failing() -> dict[str, tuple[str, str]]:
                found = await asyncio.to_thread(kube.conditions, "prom")
                return found if found.get("Ready") == ("False", "PrometheusError") else {}

            failing = await eventually(prom_failing, timeout=30, what="the failed query in prom's status")
            assert failing["Scaling"] == ("True", "Kept")
            passes = svc.deps.autoscaler_passes

            async def two_more_passes() -> bool:
                return bool(svc.deps.autoscaler_passes >= passes + 2)

            await eventually(two_more_passes, timeout=30, what="two more passes")
            kept = await asyncio.to_thread(kube.hpa, "prom")
            assert kept is not None and kept["metadata"]["uid"] == prom_hpa["metadata"]["uid"]
            down = await asyncio.to_thread(kube.status, "prom")
            assert down["forecast"] == FakePrometheus.reading and down["source"] == "reactive"
            assert "timeout: query timed out" in next(
                c["message"] for c in down["conditions"] if c["type"] == "Ready"
            )
            assert "PrometheusError" in await asyncio.to_thread(kube.event_reasons, "prom")
        finally:
            FakePrometheus.unavailable = False

        async def prom_ready() -> bool:
            found = await asyncio.to_thread(kube.conditions, "prom")
            return found.get("Ready") == ("True", "Ready")

        await eventually(prom_ready, timeout=30, what="prom Ready again once Prometheus answers")
        back = await asyncio.to_thread(kube.hpa, "prom")
        assert back is not None and back["metadata"]["uid"] == prom_hpa["metadata"]["uid"]

        # via keda with no KEDA in the cluster: said so; once KEDA's CRD is there, a ScaledObject
        assert (await asyncio.to_thread(kube.conditions, "keda"))["Ready"] == ("False", "KedaNotInstalled")
        await asyncio.to_thread(kube.crds.create_custom_resource_definition, KEDA_CRD)

        async def scaled_object() -> dict[str, Any] | None:
            return await asyncio.to_thread(kube.get, "keda.sh", "v1alpha1", "scaledobjects", "keda")

        so = await eventually(scaled_object, timeout=30, what="the ScaledObject")
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "external"
        assert trigger["metadata"]["scalerAddress"] == f"127.0.0.1:{svc.deps.scaler_port}"
        assert trigger["metadata"]["predictiveAutoscaler"] == "default/keda"
        assert (trigger["metadata"]["metric"], trigger["metadata"]["selector"]) == (
            "requests_per_s",
            "app=chat",
        )
        assert await asyncio.to_thread(kube.hpa, "keda") is None

        # switching chat to Preview gives its HPA back
        await asyncio.to_thread(
            kube.custom.patch_namespaced_custom_object,
            "tessera.io",
            "v1alpha1",
            NS,
            "predictiveautoscalers",
            "chat",
            {"spec": {"mode": "Preview"}},
        )

        async def hpa_gone() -> bool:
            return await asyncio.to_thread(kube.hpa, "chat") is None

        await eventually(hpa_gone, timeout=30, what="the HPA of an autoscaler switched to Preview to go")
    kube.api.close()


def test_a_cluster_without_the_crd_has_no_autoscalers_rather_than_an_error(apiserver: ApiServer) -> None:
    from tessera.forecaster.adapters.kube_autoscalers import KubeAutoscalers

    cluster = KubeAutoscalers(url=apiserver.url)
    try:
        assert cluster.list() == []
        Kube(apiserver.url).crds.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
        Kube(apiserver.url).pa("chat")
        assert [pa["metadata"]["name"] for pa in cluster.list()] == ["chat"]
    finally:
        cluster.close()
