"""`tessera up`'s registration of the forecaster with a devcluster: the CRD is served once applied, and
the devcluster's aggregation layer reaches an HTTPS backend holding the certificate `tessera up` made,
trusting the CA it put in the APIService; a second registration (the next run: another port, another
CA) replaces the first rather than failing."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.cli.up_autoscaling import (
    APISERVICE,
    DNS_NAMES,
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    ExternalMetrics,
    apply_crd,
    crd_file,
    register_external_metrics,
)
from tessera.cli.up_certs import ServingCertificate, serving_certificate
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.testing import api_client, start_cluster

pytestmark = pytest.mark.integration

DISCOVERY = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "external.metrics.k8s.io/v1beta1"}


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    running = start_cluster()
    yield running
    running.stop()


class _Discovery(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(DISCOVERY).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[tuple[int, ServingCertificate]]:
    """An HTTPS server on loopback holding the certificate `tessera up` makes for the forecaster."""
    certificate = serving_certificate(tmp_path / "pki", SERVICE_NAME, DNS_NAMES)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate.cert, certificate.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1]), certificate
    server.shutdown()
    server.server_close()


def test_the_crd_is_served_and_the_api_server_reaches_the_registered_backend_over_tls(
    cluster: DevCluster, backend: tuple[int, ServingCertificate], tmp_path: Path
) -> None:
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    crd = crd_file()
    assert crd is not None
    apply_crd(kubeconfig, crd)
    apply_crd(kubeconfig, crd)  # the next run finds it: replaced, not an error
    # a first registration as a previous run left it: another port and another CA
    stale = serving_certificate(tmp_path / "old-pki", SERVICE_NAME, DNS_NAMES)
    register_external_metrics(kubeconfig, ExternalMetrics(1, stale))
    port, certificate = backend
    register_external_metrics(kubeconfig, ExternalMetrics(port, certificate))
    with api_client(cluster) as api:
        listed: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "tessera.io", "v1alpha1", "default", "predictiveautoscalers"
        )
        assert listed["items"] == []
        endpoints = client.CoreV1Api(api).read_namespaced_endpoints(SERVICE_NAME, SERVICE_NAMESPACE)
        assert [p.port for p in endpoints.subsets[0].ports] == [port]
        registered: Any = client.ApiregistrationV1Api(api).read_api_service(APISERVICE)
        assert base64.b64decode(registered.spec.ca_bundle) == certificate.ca.read_bytes()
    # through the aggregation layer, verifying the backend against the new CA
    with urllib.request.urlopen(f"{cluster.url}/apis/external.metrics.k8s.io/v1beta1", timeout=10) as reply:
        assert json.loads(reply.read()) == DISCOVERY
