"""``tessera up``: the whole system on one machine, with no Docker (the command and its options).

The work is done in ``tessera.cli.up_stack``, imported only when ``tessera up`` runs: it pulls in
SQLAlchemy, the Kubernetes client and the services' modules, seconds of CPU that every other
``tessera`` command (``jobs list``, ``--help``) would otherwise pay at start.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tessera.cli.client import state_dir as cli_state_dir
from tessera.cli.up_autoscaling import DEFAULT_HPA_SYNC_S
from tessera.contracts.subjects import SERVICES

if TYPE_CHECKING:
    from tessera.cli.up_stack import (
        Migrate,
        ServiceArgv,
        UpOptions,
        default_service_argv,
        migrate_all,
        plan_services,
        run_up,
        start_devcluster,
    )

_FROM_UP_STACK = {
    "Migrate",
    "ServiceArgv",
    "UpOptions",
    "default_service_argv",
    "migrate_all",
    "plan_services",
    "run_up",
    "start_devcluster",
}


def __getattr__(name: str) -> Any:
    """The stack's names, re-exported here, imported at their first use."""
    if name in _FROM_UP_STACK:
        from tessera.cli import up_stack

        return getattr(up_stack, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SERVICES",
    "Migrate",
    "ServiceArgv",
    "UpOptions",
    "check_url",
    "default_service_argv",
    "migrate_all",
    "parse_services",
    "plan_services",
    "register",
    "resolve_cluster_file",
    "run_up",
    "start_devcluster",
    "up",
]

DEFAULT_CLUSTER_FILE = Path("examples/clusters/dev-4x8.yaml")


# -- input checks -------------------------------------------------------------------------------------
def parse_services(values: Iterable[str] | None) -> tuple[str, ...]:
    """``--services`` values (repeated and/or comma-separated) as known service names, in order."""
    if not values:
        return SERVICES
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        raise typer.BadParameter(
            f"unknown service(s) {', '.join(unknown)}; choose from {', '.join(SERVICES)}",
            param_hint="--services",
        )
    if not names:
        raise typer.BadParameter("name at least one service", param_hint="--services")
    return tuple(dict.fromkeys(names))


def check_url(value: str | None, schemes: Sequence[str], flag: str) -> str | None:
    if value is None or not value.strip():
        return None
    value = value.strip()
    if not any(value.startswith(f"{s}://") for s in schemes):
        raise typer.BadParameter(
            f"{value!r} is not a URL with scheme {' or '.join(schemes)}", param_hint=flag
        )
    return value


def resolve_cluster_file(given: Path | None, *, needed: bool) -> Path | None:
    """``--cluster-file``, else the example dev cluster when run from the repository."""
    if given is not None:
        if not given.is_file():
            raise typer.BadParameter(f"{given} is not a file", param_hint="--cluster-file")
        return given.resolve()
    if DEFAULT_CLUSTER_FILE.is_file():
        return DEFAULT_CLUSTER_FILE.resolve()
    if needed:
        raise typer.BadParameter(
            f"telemetry needs a cluster file and {DEFAULT_CLUSTER_FILE} is not here; pass one",
            param_hint="--cluster-file",
        )
    return None


# -- the command --------------------------------------------------------------------------------------
def register(app: typer.Typer) -> None:
    """Add the ``up`` command to the ``tessera`` app."""
    app.command("up")(up)


def up(
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where data, logs, ports.json and endpoints.json are kept "
            "(default: tessera's own --state-dir, else TESSERA_STATE_DIR, else .tessera)."
        ),
    ] = None,
    services: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Services to run (repeat or comma-separate); all six by default: {', '.join(SERVICES)}."
        ),
    ] = None,
    nats_url: Annotated[
        str | None,
        typer.Option(envvar="TESSERA_NATS_URL", help="Use this NATS instead of starting one."),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="TESSERA_DATABASE_URL",
            help="Use this PostgreSQL (postgresql://user:pass@host:port/db) instead of starting one.",
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            help="Use this Kubernetes cluster instead of the devcluster (passed as TESSERA_KUBECONFIG)."
        ),
    ] = None,
    cluster_file: Annotated[
        Path | None,
        typer.Option(
            envvar="TESSERA_TELEMETRY_CLUSTER_FILE",
            help="Cluster file (YAML) the devcluster simulates (and telemetry reports without one). "
            f"Default: {DEFAULT_CLUSTER_FILE} if present, else 4 nodes of 8 A100-80GB.",
        ),
    ] = None,
    devcluster: Annotated[
        bool,
        typer.Option(
            help="Start the devcluster (a simulated GPU cluster) and write STATE_DIR/kubeconfig; "
            "off when --kubeconfig is given."
        ),
    ] = True,
    devcluster_speed: Annotated[
        float, typer.Option(min=0.001, help="Simulated seconds per wall-clock second in the devcluster.")
    ] = 1.0,
    hpa_sync_seconds: Annotated[
        float,
        typer.Option(
            min=0,
            help="Simulated seconds between the devcluster's HPA controller syncs (upstream's default "
            "period); 0 runs no HPA controller.",
        ),
    ] = DEFAULT_HPA_SYNC_S,
    ready_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for each component to become ready.")
    ] = 60.0,
    stop_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds a service gets after SIGTERM before SIGKILL.")
    ] = 10.0,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            help="Export every service's spans over OTLP/HTTP to this collector (sets "
            "OTEL_EXPORTER_OTLP_ENDPOINT for each service), e.g. http://localhost:4318 for Jaeger."
        ),
    ] = None,
) -> None:
    """Run Tessera on this machine: PostgreSQL, NATS, the devcluster and the six services, until Ctrl-C.

    Data lives under --state-dir and is reused by the next run; endpoints.json there says where
    everything is. The devcluster writes STATE_DIR/kubeconfig (try `kubectl --kubeconfig
    .tessera/kubeconfig get nodes,pods -o wide`); --kubeconfig uses a real cluster instead.

    With the devcluster, the autoscaling loop is closed: the devcluster runs the HPA controller
    (upstream's algorithm, every --hpa-sync-seconds), the PredictiveAutoscaler CRD is applied, and the
    forecaster serves the external metrics API over HTTPS (a certificate made under STATE_DIR/pki)
    and is registered as the v1beta1.external.metrics.k8s.io APIService, so HPAs on External metrics,
    and those PredictiveAutoscalers own (via: hpa), scale on its forecasts.

    Ports: NATS 14222, PostgreSQL 15432, devcluster 16443, services 18080-18085 and the external
    metrics API 18443 when free, else free ones, remembered in ports.json. Ctrl-C or SIGTERM stops
    the services, then the devcluster, then NATS, then PostgreSQL.
    """
    if kubeconfig is not None and not kubeconfig.is_file():
        raise typer.BadParameter(f"{kubeconfig} is not a file", param_hint="--kubeconfig")
    chosen = parse_services(services)
    with_devcluster = devcluster and kubeconfig is None
    if kubeconfig is None or cluster_file is not None:
        # without a devcluster or a cluster, telemetry reports the cluster file's GPUs
        cluster_file = resolve_cluster_file(
            cluster_file, needed="telemetry" in chosen and kubeconfig is None and not devcluster
        )
    # through this module, so a name replaced here (a test's stand-in for the stack) is the one used
    this = sys.modules[__name__]
    options = this.UpOptions(
        state_dir=state_dir if state_dir is not None else cli_state_dir(),
        services=chosen,
        nats_url=check_url(nats_url, ("nats", "tls"), "--nats-url"),
        database_url=check_url(database_url, ("postgresql", "postgres"), "--database-url"),
        kubeconfig=kubeconfig.resolve() if kubeconfig else None,
        cluster_file=cluster_file,
        devcluster=with_devcluster,
        devcluster_speed=devcluster_speed,
        hpa_sync_seconds=hpa_sync_seconds,
        ready_timeout=ready_timeout,
        stop_timeout=stop_timeout,
        otlp_endpoint=check_url(otlp_endpoint, ("http", "https"), "--otlp-endpoint"),
    )
    from rich.console import Console

    from tessera.cli.tokens import with_admin_token  # made at the first start, printed that once

    console = Console()
    migrate = with_admin_token(this.migrate_all, options.state_dir, console)
    raise typer.Exit(this.run_up(options, console=console, migrate=migrate))
