"""The external metrics API through the emulated API server: the forecaster serves it over HTTPS on its
own port, an `APIService` (`v1beta1.external.metrics.k8s.io`) names the forecaster's Service, and the
devcluster's aggregation layer proxies `/apis/external.metrics.k8s.io/v1beta1/...` to it, trusting the
APIService's caBundle under the Service's name. The official client reads the metric through the API
server, and the simulated HPA controller, given the API server as its metrics API, scales on it."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.core.db.migrations import migrate
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.hpa import HpaController
from tessera.devcluster.testing import api_client, start_cluster, wait_for
from tessera.forecaster import bootstrap
from tessera.forecaster.config import ForecasterSettings, MetricsTlsSettings
from tessera.forecaster.domain.series import SeriesKey, bucket
from tessera.testing.pki import Pki, make_pki
from tessera.testing.services import running, settings_for

pytestmark = pytest.mark.integration

NS = "default"
SERVICE_NS = "tessera"
GROUP, VERSION = "external.metrics.k8s.io", "v1beta1"
STEP_S = 5.0
READINGS = (1.5, 2.0, 4.2)  # too short a history to forecast: the forecaster serves the last reading


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running_cluster = start_cluster()
    yield running_cluster
    running_cluster.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def register(api: client.ApiClient, port: int, ca: Path | None, *, endpoints: bool = True) -> None:
    """The forecaster's Service (no selector: its Endpoints name the process on loopback) and the
    APIService, as the chart writes them."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": SERVICE_NS}})
    core.create_namespaced_service(
        SERVICE_NS,
        {
            "metadata": {"name": "tessera-forecaster"},
            "spec": {"ports": [{"name": "metrics-tls", "port": 443, "targetPort": port}]},
        },
    )
    if endpoints:
        core.create_namespaced_endpoints(
            SERVICE_NS,
            {
                "metadata": {"name": "tessera-forecaster"},
                "subsets": [
                    {"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "metrics-tls", "port": port}]}
                ],
            },
        )
    spec: dict[str, Any] = {
        "group": GROUP,
        "version": VERSION,
        "groupPriorityMinimum": 100,
        "versionPriority": 100,
        "service": {"namespace": SERVICE_NS, "name": "tessera-forecaster", "port": 443},
    }
    if ca is not None:
        spec["caBundle"] = base64.b64encode(ca.read_bytes()).decode()
    client.ApiregistrationV1Api(api).create_api_service(
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{VERSION}.{GROUP}"},
            "spec": spec,
        }
    )


def read_metric(api: client.ApiClient) -> dict[str, Any]:
    """`kubectl get --raw /apis/external.metrics.k8s.io/v1beta1/namespaces/default/requests_per_s?...`"""
    found: dict[str, Any] = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, NS, "requests_per_s", label_selector="app=chat"
    )
    return found


async def start_forecaster(nats_url: str, database: str, pki: Pki, port: int) -> Any:
    await asyncio.to_thread(migrate, "forecaster", database)
    settings = settings_for(
        ForecasterSettings,
        nats_url,
        database,
        step_s=STEP_S,
        min_history_steps=10,
        metrics_tls=MetricsTlsSettings(port=port, cert_file=pki.cert, key_file=pki.key),
    )
    return running(bootstrap.build(settings), settings)


async def test_the_api_server_proxies_external_metrics_to_the_forecaster_over_https(
    nats_url: str, fresh_database: str, cluster: DevCluster, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki", "forecaster-ca", dns_names=(f"tessera-forecaster.{SERVICE_NS}.svc",))
    port = free_port()
    async with await start_forecaster(nats_url, fresh_database, pki, port) as svc:
        last = bucket(datetime.now(UTC), STEP_S) - timedelta(seconds=STEP_S)
        async with svc.deps.uow() as uow:
            s = await uow.series.get_or_add(
                SeriesKey.of("requests_per_s", {"app": "chat"}), STEP_S, "mean", None
            )
            for i, value in enumerate(READINGS):
                await uow.observations.add(
                    s.id, last - timedelta(seconds=STEP_S * (len(READINGS) - 1 - i)), "", value
                )
            await uow.commit()
        with api_client(cluster) as api:
            register(api, port, pki.ca)

            def served() -> dict[str, Any] | None:
                items = read_metric(api)["items"]
                return items[0] if items and items[0]["value"] == "4200m" else None

            item = await asyncio.to_thread(wait_for, served, 60.0, "the last reading through the API server")
            assert item["metricName"] == "requests_per_s"
            assert item["metricLabels"]["app"] == "chat"
            assert item["metricLabels"]["tessera.io/source"] == "reactive"
            # the group's discovery document comes from the forecaster too
            # (the forecaster answers on this event loop: blocking calls through the proxy run in a thread)
            reply = await asyncio.to_thread(api.call_api, "GET", f"{cluster.url}/apis/{GROUP}/{VERSION}")
            discovery = json.loads(reply.read())
            assert discovery["groupVersion"] == f"{GROUP}/{VERSION}"
            # a metric the forecaster has no series of: an empty list, relayed
            missing = await asyncio.to_thread(
                client.CustomObjectsApi(api).list_namespaced_custom_object,
                GROUP,
                VERSION,
                NS,
                "unknown_metric",
            )
            assert missing["kind"] == "ExternalMetricValueList" and missing["items"] == []

            # the simulated HPA controller, given the API server as its metrics API
            client.AppsV1Api(api).create_namespaced_deployment(NS, deployment("chat"))
            client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(
                NS, hpa("chat"), _preload_content=False
            )
            controller = HpaController(cluster.url, cluster.url)
            try:
                desired = await asyncio.to_thread(controller.sync_once)
            finally:
                controller.close()
            assert desired == {f"{NS}/chat": 5}  # ceil(4.2 / 1.0)
            scale = client.AppsV1Api(api).read_namespaced_deployment_scale("chat", NS)
            assert scale.spec.replicas == 5


async def test_an_untrusted_certificate_or_a_service_without_endpoints_answers_503(
    nats_url: str, fresh_database: str, cluster: DevCluster, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki", "forecaster-ca", dns_names=(f"tessera-forecaster.{SERVICE_NS}.svc",))
    other = make_pki(tmp_path / "other", "other-ca")
    port = free_port()
    async with await start_forecaster(nats_url, fresh_database, pki, port):
        with api_client(cluster) as api:
            register(api, port, other.ca)  # the caBundle of another CA

            def refused() -> client.ApiException | None:
                try:
                    read_metric(api)
                except client.ApiException as exc:
                    return exc if exc.status == 503 and "certificate" in str(exc.body) else None
                return None

            await asyncio.to_thread(wait_for, refused, 30.0, "a 503 naming the certificate")
            registration = client.ApiregistrationV1Api(api)
            registration.delete_api_service(f"{VERSION}.{GROUP}")
            client.CoreV1Api(api).delete_namespaced_endpoints("tessera-forecaster", SERVICE_NS)
            fixed = {
                "metadata": {"name": f"{VERSION}.{GROUP}"},
                "spec": {
                    "group": GROUP,
                    "version": VERSION,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "insecureSkipTLSVerify": True,
                    "service": {"namespace": SERVICE_NS, "name": "tessera-forecaster"},
                },
            }
            registration.create_api_service(fixed)
            with pytest.raises(client.ApiException) as unavailable:
                await asyncio.to_thread(read_metric, api)
            assert unavailable.value.status == 503
            message = json.loads(unavailable.value.body)["message"]
            assert message.startswith('no endpoints available for service "tessera/tessera-forecaster"')


def deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.6.3"}]},
            },
        },
    }


def hpa(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 20,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "requests_per_s", "selector": {"matchLabels": {"app": "chat"}}},
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }
            ],
        },
    }
