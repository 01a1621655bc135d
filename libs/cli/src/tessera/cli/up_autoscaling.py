"""The closed autoscaling loop under ``tessera up``: with the devcluster, the stack

- runs the devcluster's simulated HPA controller (``--hpa-sync-seconds``, upstream's algorithm),
- applies the ``PredictiveAutoscaler`` CRD (``deploy/crds``), which the forecaster's controller reconciles,
- serves the forecaster's external metrics API over HTTPS with a certificate of the stack's own
  (``tessera.cli.up_certs``), and registers it as the cluster's ``external.metrics.k8s.io`` provider: a
  Service without a selector, Endpoints naming the forecaster on loopback, and the ``APIService`` with
  the CA as its ``caBundle``, as the chart does in a real cluster.

So an HPA on an External metric, whether a PredictiveAutoscaler owns it (``via: hpa``) or a user wrote
it, is scaled by the devcluster on what the forecaster serves (docs/adr/0025-predictive-autoscaler.md)."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from tessera.cli.devcluster import DevclusterProcess
from tessera.cli.up_certs import CertificateError, ServingCertificate, serving_certificate
from tessera.core.embedded import ComponentError, StateDir

#: upstream's `--horizontal-pod-autoscaler-sync-period`
DEFAULT_HPA_SYNC_S = 15.0
#: the port of the forecaster's HTTPS external metrics API when free
DEFAULT_METRICS_TLS_PORT = 18443
METRICS_PORT_NAME = "service.forecaster.metrics_tls"
SERVICE_NAMESPACE = "tessera"
SERVICE_NAME = "tessera-forecaster"
SERVICE_PORT = 443
PORT_NAME = "metrics-tls"
GROUP, VERSION = "external.metrics.k8s.io", "v1beta1"
APISERVICE = f"{VERSION}.{GROUP}"
#: the names the aggregation layer may call the forecaster's Service by (it verifies the last)
DNS_NAMES = (SERVICE_NAME, f"{SERVICE_NAME}.{SERVICE_NAMESPACE}", f"{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc")
CRD_FILE = Path("deploy") / "crds" / "tessera.io_predictiveautoscalers.yaml"


class AutoscalingDevcluster(DevclusterProcess):
    """The devcluster, with its HPA controller every ``hpa_sync_seconds`` simulated seconds (None: off)."""

    def __init__(self, *, hpa_sync_seconds: float | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hpa_sync_seconds = hpa_sync_seconds

    def command(self) -> list[str]:
        if self.hpa_sync_seconds is None:
            return super().command()
        return [*super().command(), "--hpa-sync-seconds", f"{self.hpa_sync_seconds:g}"]


@dataclass(frozen=True)
class ExternalMetrics:
    """Where the forecaster serves the external metrics API over HTTPS, with what certificate."""

    port: int
    certificate: ServingCertificate

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def forecaster_env(self) -> dict[str, str]:
        prefix = "TESSERA_FORECASTER_METRICS_TLS__"
        return {
            prefix + "CERT_FILE": str(self.certificate.cert),
            prefix + "KEY_FILE": str(self.certificate.key),
            prefix + "PORT": str(self.port),
        }

    def endpoint(self) -> dict[str, str]:
        """What ``endpoints.json`` says of it."""
        return {
            "url": self.url,
            "apiservice": APISERVICE,
            "service": f"{SERVICE_NAMESPACE}/{SERVICE_NAME}",
            "ca_file": str(self.certificate.ca),
        }


def prepare(state: StateDir, kubeconfig: Path, console: Console, port: int | None) -> ExternalMetrics | None:
    """Before the services start: the CRD applied to the devcluster, and the forecaster's certificate
    and HTTPS port (``port`` when free). What cannot be done is said, and the stack runs without it."""
    crd = crd_file()
    if crd is None:
        console.print(f"[yellow]![/] no {CRD_FILE} here: PredictiveAutoscalers are not served")
    else:
        try:
            apply_crd(kubeconfig, crd)
        except Exception as err:  # the devcluster answered ready: its log tells why it refused
            raise ComponentError("devcluster", f"applying {crd}: {type(err).__name__}: {err}") from err
        console.print(f"[green]✓[/] PredictiveAutoscaler CRD applied ({crd.name})")
    try:
        certificate = serving_certificate(state.root / "pki" / "forecaster-metrics", SERVICE_NAME, DNS_NAMES)
    except CertificateError as err:
        console.print(f"[yellow]![/] no external metrics APIService: {escape(str(err))}", soft_wrap=True)
        return None
    chosen = state.choose_port(METRICS_PORT_NAME, port)
    state.remember_ports({METRICS_PORT_NAME: chosen})
    return ExternalMetrics(chosen, certificate)


def crd_file(search: tuple[Path, ...] | None = None) -> Path | None:
    """The PredictiveAutoscaler CRD of the repository ``tessera up`` runs from or was installed from."""
    roots = search if search is not None else (Path.cwd(), Path(__file__).resolve().parents[5])
    return next((root / CRD_FILE for root in roots if (root / CRD_FILE).is_file()), None)


def apply_crd(kubeconfig: Path, crd: Path) -> None:
    """Create the CRD, or replace the one a previous run left."""
    from kubernetes import client as k8s

    body = yaml.safe_load(crd.read_text())
    name = body["metadata"]["name"]
    with _client(kubeconfig) as api:
        ext: Any = k8s.ApiextensionsV1Api(api)
        _create_or_replace(
            lambda: ext.create_custom_resource_definition(body, _preload_content=False),
            lambda: ext.read_custom_resource_definition(name, _preload_content=False),
            lambda current: ext.replace_custom_resource_definition(name, current, _preload_content=False),
            body,
        )


def register_external_metrics(kubeconfig: Path, metrics: ExternalMetrics) -> None:
    """The forecaster's Service, its Endpoints on loopback and the APIService trusting the stack's CA,
    created or brought back to these (a previous run's may name another port or CA)."""
    from kubernetes import client as k8s

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
        "spec": {"ports": [{"name": PORT_NAME, "port": SERVICE_PORT, "targetPort": metrics.port}]},
    }
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
        "subsets": [
            {"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": PORT_NAME, "port": metrics.port}]}
        ],
    }
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {
            "group": GROUP,
            "version": VERSION,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
            "service": {"namespace": SERVICE_NAMESPACE, "name": SERVICE_NAME, "port": SERVICE_PORT},
            "caBundle": base64.b64encode(metrics.certificate.ca_pem()).decode(),
        },
    }
    with _client(kubeconfig) as api:
        core: Any = k8s.CoreV1Api(api)
        registration: Any = k8s.ApiregistrationV1Api(api)
        _ensure_namespace(core, SERVICE_NAMESPACE)
        _create_or_replace(
            lambda: core.create_namespaced_service(SERVICE_NAMESPACE, service),
            lambda: core.read_namespaced_service(SERVICE_NAME, SERVICE_NAMESPACE, _preload_content=False),
            lambda current: core.replace_namespaced_service(
                SERVICE_NAME, SERVICE_NAMESPACE, current, _preload_content=False
            ),
            service,
        )
        _create_or_replace(
            lambda: core.create_namespaced_endpoints(SERVICE_NAMESPACE, endpoints),
            lambda: core.read_namespaced_endpoints(SERVICE_NAME, SERVICE_NAMESPACE, _preload_content=False),
            lambda current: core.replace_namespaced_endpoints(
                SERVICE_NAME, SERVICE_NAMESPACE, current, _preload_content=False
            ),
            endpoints,
        )
        _create_or_replace(
            lambda: registration.create_api_service(apiservice),
            lambda: registration.read_api_service(APISERVICE, _preload_content=False),
            lambda current: registration.replace_api_service(APISERVICE, current, _preload_content=False),
            apiservice,
        )


def _ensure_namespace(core: Any, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core.create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise


def _create_or_replace(
    create: Callable[[], Any],
    read: Callable[[], Any],
    replace: Callable[[dict[str, Any]], Any],
    body: dict[str, Any],
) -> None:
    """Create; when it exists, replace it with ``body`` at the stored resourceVersion. ``read`` answers
    the raw response (``_preload_content=False``)."""
    from kubernetes.client.exceptions import ApiException

    try:
        create()
        return
    except ApiException as error:
        if error.status != 409:
            raise
    stored = json.loads(read().data).get("metadata") or {}
    replace({**body, "metadata": {**body["metadata"], "resourceVersion": stored.get("resourceVersion")}})


@contextlib.contextmanager
def _client(kubeconfig: Path) -> Iterator[Any]:
    """The official client on a kubeconfig, closed at the end of the block."""
    from tessera.cluster.kube import api_client

    api = api_client(kubeconfig=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]
