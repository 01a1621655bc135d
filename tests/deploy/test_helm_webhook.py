"""Admission's webhook in the chart: the MutatingWebhookConfiguration `tessera up` registers, here
calling the Service over TLS, with a certificate Helm generates (genCA, genSignedCert) or one from
cert-manager. The generated pair is proven with a real TLS handshake against admission's own HTTPS
server, under the Service's DNS name, trusting only the rendered caBundle."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import ssl
from pathlib import Path
from typing import Any

import helm_python
import pytest

from tessera.admission.config import WebhookSettings
from tessera.admission.entrypoints.webhook import MUTATE_PATH, webhook_configuration
from tessera.admission.entrypoints.webhook_server import tls_server, webhook_app
from tessera.core.embedded import free_port
from tests.deploy.chart import NAMESPACE, VALUE_SETS, Rendered, merged, render

SERVICE_DNS = f"tessera-admission.{NAMESPACE}.svc"
TLS_SECRET = "tessera-admission-webhook-tls"


@pytest.fixture(scope="module")
def self_signed() -> Rendered:
    return render(VALUE_SETS["default"])


@pytest.fixture(scope="module")
def cert_manager() -> Rendered:
    return render(VALUE_SETS["cert-manager"])


def _hook(chart: Rendered) -> dict[str, Any]:
    (hook,) = chart.get("MutatingWebhookConfiguration", "tessera-admission")["webhooks"]
    return dict(hook)


def _container(chart: Rendered) -> dict[str, Any]:
    pod = chart.get("Deployment", "tessera-admission")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return dict(container)


@pytest.mark.parametrize("mode", ["default", "cert-manager"])
def test_the_configuration_is_the_one_admission_builds_calling_the_service(mode: str) -> None:
    chart = render(VALUE_SETS[mode])
    hook = _hook(chart)
    (built,) = webhook_configuration("https://unused")["webhooks"]
    for key in ("clientConfig",):
        hook.pop(key), built.pop(key)
    assert hook == built  # rules, objectSelector on the queue label, Fail, sideEffects None, timeout
    config = _hook(chart)["clientConfig"]
    assert config["service"] == {
        "name": "tessera-admission",
        "namespace": NAMESPACE,
        "path": MUTATE_PATH,
        "port": 443,
    }
    service_ports = chart.get("Service", "tessera-admission")["spec"]["ports"]
    assert {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"} in service_ports
    container = _container(chart)
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = WebhookSettings(
        port=env["TESSERA_ADMISSION_WEBHOOK__PORT"],
        cert_file=env["TESSERA_ADMISSION_WEBHOOK__CERT_FILE"],
        key_file=env["TESSERA_ADMISSION_WEBHOOK__KEY_FILE"],
    )
    assert settings.tls and settings.port == 9443
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert settings.cert_file is not None and settings.key_file is not None
    assert Path(mount["mountPath"]) == settings.cert_file.parent == settings.key_file.parent
    pod = chart.get("Deployment", "tessera-admission")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert volume == {"name": "webhook-tls", "secret": {"secretName": TLS_SECRET}}


def test_helm_generates_a_ca_and_a_certificate_it_signs_for_the_service(self_signed: Rendered) -> None:
    secret = self_signed.get("Secret", TLS_SECRET)
    assert secret["type"] == "kubernetes.io/tls"
    ca_bundle = _hook(self_signed)["clientConfig"]["caBundle"]
    assert secret["data"]["ca.crt"] == ca_bundle
    assert secret["data"]["tls.crt"] != ca_bundle, "a certificate signed by the CA, not the CA itself"
    annotations = self_signed.get("Deployment", "tessera-admission")["spec"]["template"]["metadata"]
    checksum = hashlib.sha256(secret["data"]["tls.crt"].encode()).hexdigest()
    assert annotations["annotations"]["checksum/webhook-tls"] == checksum  # a new pair rolls the pods
    assert "cert-manager.io/inject-ca-from" not in (
        self_signed.get("MutatingWebhookConfiguration", "tessera-admission")["metadata"].get("annotations")
        or {}
    )
    assert not self_signed.of_kind("Certificate", "Issuer")


async def test_admission_serves_the_generated_certificate_and_the_ca_bundle_verifies_it(
    self_signed: Rendered, tmp_path: Path
) -> None:
    data = self_signed.get("Secret", TLS_SECRET)["data"]
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(base64.b64decode(data["tls.crt"]))
    key.write_bytes(base64.b64decode(data["tls.key"]))
    settings = WebhookSettings(port=free_port(), cert_file=cert, key_file=key)
    server = tls_server(webhook_app(), "127.0.0.1", settings)
    serving = asyncio.create_task(server.serve())
    ca = base64.b64decode(_hook(self_signed)["clientConfig"]["caBundle"]).decode()
    trusting = ssl.create_default_context(cadata=ca)
    try:
        while not server.started:
            assert not serving.done(), "the webhook's HTTPS server did not start"
            await asyncio.sleep(0.05)
        for name in (SERVICE_DNS, f"tessera-admission.{NAMESPACE}", f"{SERVICE_DNS}.cluster.local"):
            answer = await _post(settings.port, trusting, name)
            assert answer["response"]["allowed"] is True, name
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            await _post(settings.port, trusting, "tessera-scheduler.tessera.svc")
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            await _post(settings.port, ssl.create_default_context(), SERVICE_DNS)
    finally:
        server.should_exit = True
        await serving


async def _post(port: int, context: ssl.SSLContext, server_name: str) -> dict[str, Any]:
    """POST an AdmissionReview to 127.0.0.1 as the API server would to the Service's name."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "6d1c2a3b-0000-4000-8000-000000000002",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "namespace": "team-a",
            "operation": "CREATE",
            "object": {"metadata": {"name": "j", "labels": {"tessera.io/queue": "q"}}, "spec": {}},
        },
    }
    body = json.dumps(review).encode()
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_name
    )
    try:
        head = (
            f"POST {MUTATE_PATH} HTTP/1.1\r\nHost: {server_name}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    status, _, payload = raw.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200"), status
    answer: dict[str, Any] = json.loads(payload)
    return answer


def test_cert_manager_issues_the_certificate_and_injects_its_ca(cert_manager: Rendered) -> None:
    configuration = cert_manager.get("MutatingWebhookConfiguration", "tessera-admission")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/tessera-admission-webhook"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]  # the cainjector fills it
    assert not cert_manager.of_kind("Secret"), "cert-manager writes the certificate's Secret"
    serving = cert_manager.get("Certificate", "tessera-admission-webhook")["spec"]
    assert serving["secretName"] == TLS_SECRET
    assert SERVICE_DNS in serving["dnsNames"]
    assert serving["issuerRef"] == {
        "name": "tessera-admission-webhook-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    # the chart's own CA: a self-signed Issuer signs a CA Certificate, whose Secret a CA Issuer uses
    ca = cert_manager.get("Certificate", "tessera-admission-webhook-ca")["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "tessera-admission-selfsigned"
    assert cert_manager.get("Issuer", "tessera-admission-selfsigned")["spec"] == {"selfSigned": {}}
    ca_issuer = cert_manager.get("Issuer", "tessera-admission-webhook-ca")["spec"]
    assert ca_issuer == {"ca": {"secretName": ca["secretName"]}}
    template = cert_manager.get("Deployment", "tessera-admission")["spec"]["template"]["metadata"]
    assert "checksum/webhook-tls" not in (template.get("annotations") or {})


def test_cert_manager_with_your_issuer_makes_only_the_certificate() -> None:
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer"}
    values = {"admission": {"webhook": {"certManager": {"issuerRef": issuer, "duration": "2160h"}}}}
    chart = render(merged(VALUE_SETS["cert-manager"], values))
    assert not chart.of_kind("Issuer")
    (certificate,) = chart.of_kind("Certificate")
    assert certificate["spec"]["issuerRef"] == {**issuer, "group": "cert-manager.io"}
    assert certificate["spec"]["duration"] == "2160h"


def test_the_webhook_without_the_kubernetes_api_fails_saying_why() -> None:
    values = merged(VALUE_SETS["default"], {"admission": {"kubernetesApi": {"enabled": False}}})
    with pytest.raises(
        helm_python.HelmRenderError, match=r"admission\.webhook\.enabled needs admission\.kubernetesApi"
    ):
        render(values)


def test_without_the_webhook_nothing_of_it_is_rendered() -> None:
    off = {"admission": {"webhook": {"enabled": False}, "kubernetesApi": {"enabled": False}}}
    chart = render(merged(VALUE_SETS["default"], off))
    assert not chart.of_kind("MutatingWebhookConfiguration", "Secret", "Certificate", "Issuer")
    container = _container(chart)
    assert [p["name"] for p in container["ports"]] == ["http"]
    assert not [e for e in container["env"] if "WEBHOOK" in e["name"]]
    assert [p["name"] for p in chart.get("Service", "tessera-admission")["spec"]["ports"]] == ["http"]
    assert chart.get("ServiceAccount", "tessera-admission")["automountServiceAccountToken"] is False
    assert not [
        r for r in chart.of_kind("ClusterRole", "Role") if r["metadata"]["name"] == "tessera-admission"
    ]


@pytest.mark.parametrize(
    ("webhook", "message"),
    [
        ({"port": "9443"}, "at '/admission/webhook/port': got string, want integer"),
        ({"certManager": {"issuerRef": {"kind": "Vault"}}}, "/admission/webhook/certManager/issuerRef/kind"),
        ({"timeoutSeconds": 60}, "/admission/webhook/timeoutSeconds"),
    ],
)
def test_a_wrong_webhook_value_fails_with_the_schema_message(webhook: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=message):
        render(merged(VALUE_SETS["default"], {"admission": {"webhook": webhook}}))
