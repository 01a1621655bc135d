"""`tessera-devcluster serve --hpa-sync-seconds`: the devcluster runs the HPA controller against its own
API server, which proxies the External metric to the APIService's backend over TLS; an HPA on it
scales its Deployment."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tessera.testing.pki import Pki, make_pki

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
SERVICE = ("metrics", "backend")  # namespace, name


class _Metric(http.server.BaseHTTPRequestHandler):
    """An external metrics backend serving `requests_per_s` = 4.2 for any selector."""

    def do_GET(self) -> None:
        item = {"metricName": "requests_per_s", "metricLabels": {}, "timestamp": "2026-01-01T00:00:00Z"}
        body = json.dumps(
            {
                "kind": "ExternalMetricValueList",
                "apiVersion": "external.metrics.k8s.io/v1beta1",
                "metadata": {},
                "items": [{**item, "value": "4200m"}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[tuple[int, Pki]]:
    pki = make_pki(tmp_path / "pki", "metrics-ca", dns_names=(f"{SERVICE[1]}.{SERVICE[0]}.svc",))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metric)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1]), pki
    server.shutdown()
    server.server_close()


def serve(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[bytes], client.ApiClient]:
    kubeconfig = tmp_path / "kubeconfig"
    command = [sys.executable, "-m", "tessera.devcluster", "serve", "--kubeconfig", str(kubeconfig)]
    command += ["--cluster", str(ROOT / "examples" / "clusters" / "dev-4x8.yaml"), "--speed", "10", *flags]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not kubeconfig.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the devcluster did not start"
        time.sleep(0.2)
    return proc, config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


def register(api: client.ApiClient, port: int, pki: Pki) -> None:
    namespace, name = SERVICE
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_service(
        namespace, {"metadata": {"name": name}, "spec": {"ports": [{"port": 443}]}}
    )
    core.create_namespaced_endpoints(
        namespace,
        {
            "metadata": {"name": name},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": port}]}],
        },
    )
    spec = {
        "group": "external.metrics.k8s.io",
        "version": "v1beta1",
        "groupPriorityMinimum": 100,
        "versionPriority": 100,
        "service": {"namespace": namespace, "name": name},
        "caBundle": base64.b64encode(pki.ca.read_bytes()).decode(),
    }
    client.ApiregistrationV1Api(api).create_api_service(
        {"metadata": {"name": "v1beta1.external.metrics.k8s.io"}, "spec": spec}
    )


def scaled_app(api: client.ApiClient) -> None:
    deployment = {
        "metadata": {"name": "chat"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "chat"}},
            "template": {
                "metadata": {"labels": {"app": "chat"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    client.AppsV1Api(api).create_namespaced_deployment("default", deployment)
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
            "minReplicas": 1,
            "maxReplicas": 10,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "requests_per_s"},
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }
            ],
        },
    }
    client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(
        "default", hpa, _preload_content=False
    )


def desired(api: client.ApiClient) -> int | None:
    answer: Any = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(
        "chat", "default", _preload_content=False
    )
    return (json.loads(answer.data).get("status") or {}).get("desiredReplicas")


def replicas(api: client.ApiClient) -> int:
    return int(client.AppsV1Api(api).read_namespaced_deployment_scale("chat", "default").spec.replicas)


def test_the_devcluster_runs_the_hpa_controller_on_the_registered_external_metrics(
    tmp_path: Path, backend: tuple[int, Pki]
) -> None:
    proc, api = serve(tmp_path, "--hpa-sync-seconds", "5")  # 0.5 s at x10
    try:
        register(api, *backend)
        scaled_app(api)
        deadline = time.monotonic() + 30
        while (replicas(api), desired(api)) != (5, 5):  # ceil(4.2 / 1), and the HPA's status says so
            assert time.monotonic() < deadline, f"not scaled to 5: {replicas(api)} replicas"
            time.sleep(0.2)
    finally:
        api.close()  # type: ignore[no-untyped-call]
        proc.terminate()
        proc.wait(timeout=30)


def test_a_sync_period_that_is_not_positive_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.devcluster.cli import main

    assert main(["serve", "--cluster", "unused.yaml", "--hpa-sync-seconds", "0"]) == 2
    assert "--hpa-sync-seconds: must be positive, got 0" in capsys.readouterr().err
