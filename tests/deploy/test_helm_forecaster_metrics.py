"""The forecaster's external metrics API in the chart: off by default (a cluster has one provider);
enabled, the APIService `v1beta1.external.metrics.k8s.io` calls the forecaster's Service over TLS with a
certificate Helm generates (caBundle from it) or one from cert-manager. The generated pair is proven
with a real TLS handshake against the forecaster's own HTTPS server, under the Service's DNS name,
trusting only the rendered caBundle."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from tessera.core.embedded import free_port
from tessera.forecaster.config import MetricsTlsSettings
from tessera.forecaster.entrypoints.metrics_server import metrics_app, metrics_tls_server
from tests.deploy.chart import NAMESPACE, VALUE_SETS, Rendered, merged, render

SERVICE = "tessera-forecaster"
SERVICE_DNS = f"{SERVICE}.{NAMESPACE}.svc"
TLS_SECRET = "tessera-forecaster-metrics-tls"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
ENABLED = {"forecaster": {"externalMetrics": {"apiService": {"enabled": True}}}}


@pytest.fixture(scope="module")
def self_signed() -> Rendered:
    return render(merged(VALUE_SETS["default"], ENABLED))


def _container(chart: Rendered) -> dict[str, Any]:
    (container,) = chart.get("Deployment", SERVICE)["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_off_by_default_no_api_service_and_no_https_port() -> None:
    chart = render(VALUE_SETS["default"])
    assert not chart.of_kind("APIService")
    env = {e["name"] for e in _container(chart).get("env", [])}
    assert not any(name.startswith("TESSERA_FORECASTER_METRICS_TLS__") for name in env)


def test_the_api_service_calls_the_forecaster_service_trusting_the_generated_ca(
    self_signed: Rendered,
) -> None:
    spec = self_signed.get("APIService", API_SERVICE)["spec"]
    assert (spec["group"], spec["version"]) == ("external.metrics.k8s.io", "v1beta1")
    assert spec["service"] == {"name": SERVICE, "namespace": NAMESPACE, "port": 443}
    secret = self_signed.get("Secret", TLS_SECRET)
    assert spec["caBundle"] == secret["data"]["ca.crt"]
    service_ports = {p["name"]: p for p in self_signed.get("Service", SERVICE)["spec"]["ports"]}
    assert service_ports["metrics-tls"]["port"] == 443
    container = _container(self_signed)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TESSERA_FORECASTER_METRICS_TLS__PORT"] == "6443"
    assert env["TESSERA_FORECASTER_METRICS_TLS__CERT_FILE"].endswith("/tls.crt")
    assert {"name": "metrics-tls", "containerPort": 6443, "protocol": "TCP"} in container["ports"]
    annotations = self_signed.get("Deployment", SERVICE)["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations["checksum/metrics-tls"] == hashlib.sha256(secret["data"]["tls.crt"].encode()).hexdigest()
    )
    # the settings the chart sets are the forecaster's own
    MetricsTlsSettings(port=int(env["TESSERA_FORECASTER_METRICS_TLS__PORT"]))


async def test_the_forecaster_serves_the_generated_certificate_and_the_ca_bundle_verifies_it(
    self_signed: Rendered, tmp_path: Path
) -> None:
    data = self_signed.get("Secret", TLS_SECRET)["data"]
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(base64.b64decode(data["tls.crt"]))
    key.write_bytes(base64.b64decode(data["tls.key"]))
    tls = MetricsTlsSettings(port=free_port(), cert_file=cert, key_file=key)
    server = metrics_tls_server(metrics_app(), "127.0.0.1", tls)
    serving = asyncio.create_task(server.serve())
    ca = base64.b64decode(self_signed.get("APIService", API_SERVICE)["spec"]["caBundle"]).decode()
    trusting = ssl.create_default_context(cadata=ca)
    try:
        while not server.started:
            assert not serving.done(), "the external metrics API's HTTPS server did not start"
            await asyncio.sleep(0.05)
        for name in (SERVICE_DNS, f"{SERVICE}.{NAMESPACE}", f"{SERVICE_DNS}.cluster.local"):
            discovery = await _get(tls.port, trusting, name)
            assert discovery["groupVersion"] == "external.metrics.k8s.io/v1beta1", name
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            await _get(tls.port, trusting, "tessera-admission.tessera.svc")
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            await _get(tls.port, ssl.create_default_context(), SERVICE_DNS)
    finally:
        server.should_exit = True
        await serving


async def _get(port: int, context: ssl.SSLContext, server_name: str) -> dict[str, Any]:
    """GET the discovery document from 127.0.0.1 as the aggregation layer would from the Service."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_name
    )
    try:
        writer.write(
            f"GET /apis/external.metrics.k8s.io/v1beta1 HTTP/1.1\r\nHost: {server_name}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    status, _, payload = raw.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200"), status
    answer: dict[str, Any] = json.loads(payload)
    return answer


def test_cert_manager_issues_the_certificate_through_your_issuer_and_injects_its_ca() -> None:
    with_cm = {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}
    chart = render(
        merged(
            VALUE_SETS["default"],
            {"forecaster": {"externalMetrics": {**ENABLED["forecaster"]["externalMetrics"], **with_cm}}},
        )
    )
    api_service = chart.get("APIService", API_SERVICE)
    assert api_service["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{SERVICE}-metrics"
    }
    assert "caBundle" not in api_service["spec"]  # the cainjector fills it
    serving = chart.get("Certificate", f"{SERVICE}-metrics")["spec"]
    assert serving["secretName"] == TLS_SECRET and SERVICE_DNS in serving["dnsNames"]
    assert serving["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert not [s for s in chart.of_kind("Secret") if s["metadata"]["name"] == TLS_SECRET]
