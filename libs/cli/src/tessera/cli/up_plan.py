"""The plan of ``tessera up``: its options, its default ports, and how each service is launched.

``plan_services`` turns the options into a `ServiceSpec` per service (its command, environment and log
file) and the `Endpoints` it will serve; ``tessera.cli.up_stack`` starts them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.cli.supervisor import ServiceSpec
from tessera.cli.up_auth import ServiceAccess
from tessera.cli.up_autoscaling import DEFAULT_HPA_SYNC_S, ExternalMetrics
from tessera.core.embedded import Endpoints, ServiceEndpoint, StateDir

SERVICES = ("telemetry", "forecaster", "admission", "scheduler", "slicing", "checkpoint")
DEFAULT_NATS_PORT = 14222
DEFAULT_POSTGRES_PORT = 15432
DEFAULT_SERVICE_PORTS = {
    "admission": 18080,
    "telemetry": 18081,
    "forecaster": 18082,
    "scheduler": 18083,
    "slicing": 18084,
    "checkpoint": 18085,
}
HOST = "127.0.0.1"

Migrate = Callable[[str], None]
ServiceArgv = Callable[[str], list[str]]
Access = Callable[[str], ServiceAccess]


@dataclass(frozen=True)
class UpOptions:
    state_dir: Path = Path(".tessera")
    services: tuple[str, ...] = SERVICES
    nats_url: str | None = None
    database_url: str | None = None
    kubeconfig: Path | None = None
    #: the GPU inventory the devcluster simulates (telemetry reads it without a devcluster)
    cluster_file: Path | None = None
    #: start the devcluster when no kubeconfig is given
    devcluster: bool = True
    devcluster_speed: float = 1.0
    #: simulated seconds between the devcluster's HPA syncs; 0: no HPA controller
    hpa_sync_seconds: float = DEFAULT_HPA_SYNC_S
    ready_timeout: float = 60.0
    stop_timeout: float = 10.0
    #: prefer the fixed default ports (14222, 15432, 18080…) when no port is remembered yet;
    #: off, fresh state directories get kernel-chosen free ports (tests running side by side)
    use_default_ports: bool = True
    #: an OTLP/HTTP collector (Jaeger: http://localhost:4318) every service exports its spans to
    otlp_endpoint: str | None = None

    def default_port(self, default: int) -> int | None:
        return default if self.use_default_ports else None


# -- the plan -----------------------------------------------------------------------------------------
def default_service_argv(name: str) -> list[str]:
    return [sys.executable, "-m", f"tessera.{name}"]


def migrate_all(database_url: str) -> None:
    from tessera.core.db.migrations import migrate_all as run_migrations

    run_migrations(database_url)


SINGLE_LEADERS = ("scheduler", "slicing")
"""Services that elect a leader on a Lease when they have replicas; `tessera up` runs one of each."""
TOKEN_READERS = ("telemetry", "checkpoint", "forecaster")
"""Services whose tenant-facing reads check bearer tokens with admission (`tessera.core.tenant_tokens`):
as open as admission on a local stack."""


def plan_services(
    names: Sequence[str],
    ports: dict[str, int],
    *,
    nats_url: str,
    database_url: str,
    kubeconfig: Path | None,
    state: StateDir,
    service_argv: ServiceArgv,
    cluster_file: Path | None = None,
    devcluster_url: str | None = None,
    otlp_endpoint: str | None = None,
    access: Access | None = None,
    external_metrics: ExternalMetrics | None = None,
) -> tuple[list[ServiceSpec], Endpoints]:
    """How to launch each service, and the endpoints it will serve. ``access`` gives each service its
    own NATS user and PostgreSQL role; without it every service uses ``nats_url`` and ``database_url``.
    ``external_metrics``: the forecaster serves the external metrics API over HTTPS there."""
    specs: list[ServiceSpec] = []
    services: dict[str, ServiceEndpoint] = {}
    for name in names:
        prefix = f"TESSERA_{name.upper()}_"
        own = access(name) if access is not None else ServiceAccess(nats_url, database_url)
        env = {
            "TESSERA_NATS_URL": own.nats_url,
            "TESSERA_DATABASE_URL": own.database_url,
            prefix + "HTTP_HOST": HOST,
            prefix + "HTTP_PORT": str(ports[name]),
        }
        if own.nats_inbox_prefix is not None:  # its user may read replies on this prefix only
            env[prefix + "NATS_INBOX_PREFIX"] = own.nats_inbox_prefix
        if kubeconfig is not None:
            env["TESSERA_KUBECONFIG"] = str(kubeconfig)
            if name in SINGLE_LEADERS:
                # one replica, restarted by the supervisor only once it has died: no lease to wait
                # out (a restarted process is a new candidate and would wait for its own old lease)
                env[prefix + "LEADER_ELECTION__ENABLED"] = "false"
        if otlp_endpoint is not None:  # the OpenTelemetry SDK's own variable (see core's tracing)
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
        if name == "admission":  # the local stack is open unless the caller asks for tokens
            env["TESSERA_ADMISSION_AUTH"] = os.environ.get("TESSERA_ADMISSION_AUTH", "disabled")
        if name == "forecaster":  # its KEDA scaler on a free port: stacks side by side never collide
            env["TESSERA_FORECASTER_GRPC_HOST"] = HOST
            env["TESSERA_FORECASTER_GRPC_PORT"] = "0"
            if external_metrics is not None:
                env.update(external_metrics.forecaster_env())
        if name == "telemetry" and cluster_file is not None:
            env["TESSERA_TELEMETRY_CLUSTER_FILE"] = str(cluster_file)
        if name == "telemetry" and devcluster_url is not None:
            env["TESSERA_TELEMETRY_DEVCLUSTER_URL"] = devcluster_url
        if name in TOKEN_READERS:  # their reads check tenants' tokens with admission, as open as it
            env[prefix + "AUTH"] = os.environ.get("TESSERA_ADMISSION_AUTH", "disabled")
            if "admission" in ports:
                env[prefix + "ADMISSION_URL"] = f"http://{HOST}:{ports['admission']}"
        log_file = state.log_file(name)
        specs.append(ServiceSpec(name, service_argv(name), env, log_file))
        base = f"http://{HOST}:{ports[name]}"
        services[name] = ServiceEndpoint(name, base, f"{base}/healthz", f"{base}/readyz", str(log_file))
    admission = services.get("admission")
    endpoints = Endpoints(
        nats_url=nats_url,
        database_url=database_url,
        admission_api_url=admission.base_url if admission else None,
        services=services,
        kubeconfig=str(kubeconfig) if kubeconfig else None,
    )
    return specs, endpoints
