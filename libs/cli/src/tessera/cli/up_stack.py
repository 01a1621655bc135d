"""What ``tessera up`` runs: the stack's plan, its start, its readiness wait and its stop.

Starts PostgreSQL and NATS (JetStream) from their PyPI packages under the state directory unless
URLs are given (NATS with a user per service and per tenant, each service with its own PostgreSQL
role: see ``tessera.cli.up_auth``), runs every migration, starts the devcluster unless a kubeconfig
is given (see ``tessera.cli.devcluster``) with the autoscaling loop closed on it (its HPA controller,
the PredictiveAutoscaler CRD, the forecaster as its external metrics APIService: see
``tessera.cli.up_autoscaling``), starts the six services under a supervisor, waits for each one's
``/readyz``, writes ``endpoints.json`` and prints what runs where. SIGINT/SIGTERM stop the services
(SIGTERM, then SIGKILL after a timeout), then NATS, then PostgreSQL. A second run reuses the data and,
where still free, the same ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console
from rich.markup import escape

from tessera.cli.devcluster import DEFAULT_DEVCLUSTER_PORT, DevclusterProcess, write_default_cluster
from tessera.cli.infra_watch import InfraWatch
from tessera.cli.supervisor import ServiceSpec, Supervisor
from tessera.cli.up_auth import ServiceAccess, StackAuth, TenantWatch, tenants_now
from tessera.cli.up_autoscaling import (
    DEFAULT_HPA_SYNC_S,
    DEFAULT_METRICS_TLS_PORT,
    AutoscalingDevcluster,
    ExternalMetrics,
    register_external_metrics,
)
from tessera.cli.up_autoscaling import prepare as prepare_autoscaling
from tessera.cli.up_console import _console_sink, _print_table
from tessera.cli.webhook import register_webhook
from tessera.core.embedded import (
    ComponentError,
    Endpoints,
    ManagedProcess,
    NatsServer,
    PostgresServer,
    ServiceEndpoint,
    StateDir,
    StateDirBusy,
    write_endpoints,
)
from tessera.core.embedded.state import write_json_atomically

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


def start_devcluster(
    options: UpOptions,
    state: StateDir,
    console: Console,
    stack: contextlib.ExitStack,
    nats_url: str | None = None,
) -> DevclusterProcess:
    """Start the devcluster simulating ``options.cluster_file`` (4x8 A100 by default); its stop goes on
    ``stack``, so it stops after the services and before NATS and PostgreSQL. Its simulated trainers
    talk to the checkpoint service on ``nats_url`` and checkpoint under the state directory; its HPA
    controller syncs every ``options.hpa_sync_seconds`` simulated seconds."""
    cluster_file = options.cluster_file or write_default_cluster(state.root / "devcluster-cluster.yaml")
    devcluster = AutoscalingDevcluster(
        hpa_sync_seconds=options.hpa_sync_seconds if options.hpa_sync_seconds > 0 else None,
        cluster_file=cluster_file,
        kubeconfig=state.root / "kubeconfig",
        port=state.choose_port("devcluster", options.default_port(DEFAULT_DEVCLUSTER_PORT)),
        log_file=state.log_file("devcluster"),
        speed=options.devcluster_speed,
        host=HOST,
        nats_url=nats_url,
        checkpoint_root=(state.root / "checkpoints").as_uri(),
        state_file=state.devcluster_state,
    )
    with console.status(f"Starting the devcluster on {devcluster.url} ({cluster_file.name})…"):
        stack.callback(_stopping, console, "devcluster", devcluster.stop)
        devcluster.start(timeout=options.ready_timeout)
    state.remember_ports({"devcluster": devcluster.port})
    hpa = f"; HPA controller every {options.hpa_sync_seconds:g}s" if options.hpa_sync_seconds > 0 else ""
    console.print(
        f"[green]✓[/] devcluster ready on {devcluster.url} ({cluster_file.name}, speed x{options.devcluster_speed:g}{hpa}); "
        f"kubeconfig {devcluster.kubeconfig}"
    )
    return devcluster


SINGLE_LEADERS = ("scheduler", "slicing")
"""Services that elect a leader on a Lease when they have replicas; `tessera up` runs one of each."""


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
        if name == "telemetry":  # GET /v1/usage checks tenants' tokens with admission, as open as it
            env["TESSERA_TELEMETRY_AUTH"] = os.environ.get("TESSERA_ADMISSION_AUTH", "disabled")
            if "admission" in ports:
                env["TESSERA_TELEMETRY_ADMISSION_URL"] = f"http://{HOST}:{ports['admission']}"
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


# -- running ------------------------------------------------------------------------------------------
class _Terminated(Exception):
    """SIGTERM arrived while starting (before the event loop took over signals)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def run_up(
    options: UpOptions,
    *,
    console: Console | None = None,
    migrate: Migrate | None = None,
    service_argv: ServiceArgv = default_service_argv,
) -> int:
    """Run the stack until SIGINT/SIGTERM; the exit code (0 after a clean stop)."""
    console = console or Console()
    state = StateDir(options.state_dir.resolve())
    previous_int = signal.getsignal(signal.SIGINT)
    previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with state.exclusive(), contextlib.ExitStack() as stack:
            # a run killed with SIGKILL left its endpoints behind: nothing answers there yet
            state.endpoints_file.unlink(missing_ok=True)
            auth = StackAuth(state, SERVICES)
            nats_url, database_url, infra = _start_infra(options, state, console, stack, auth)
            with console.status("Running migrations…"):
                try:
                    (migrate or migrate_all)(database_url)
                except Exception as err:
                    raise ComponentError("migrations", f"{type(err).__name__}: {err}") from err
            console.print("[green]✓[/] migrations applied")
            _grant_roles(auth, infra, database_url, console)
            kubeconfig, devcluster, external_metrics = options.kubeconfig, None, None
            if kubeconfig is None and options.devcluster:
                devcluster = start_devcluster(
                    options, state, console, stack, auth.devcluster_nats_url(nats_url)
                )
                kubeconfig = devcluster.kubeconfig
                if "forecaster" in options.services:
                    port = options.default_port(DEFAULT_METRICS_TLS_PORT)
                    external_metrics = prepare_autoscaling(state, kubeconfig, console, port)
            elif kubeconfig is None:
                console.print("[yellow]![/] no Kubernetes cluster: --no-devcluster and no --kubeconfig")
            ports = {
                n: state.choose_port(f"service.{n}", options.default_port(DEFAULT_SERVICE_PORTS[n]))
                for n in options.services
            }
            state.remember_ports({f"service.{n}": p for n, p in ports.items()})
            specs, endpoints = plan_services(
                options.services,
                ports,
                nats_url=nats_url,
                database_url=database_url,
                kubeconfig=kubeconfig,
                state=state,
                service_argv=service_argv,
                cluster_file=options.cluster_file,
                devcluster_url=devcluster.url if devcluster else None,
                otlp_endpoint=options.otlp_endpoint,
                access=lambda name: auth.access(name, nats_url, database_url),
                external_metrics=external_metrics,
            )
            # from here on the event loop owns SIGINT/SIGTERM; teardown below must not be interrupted
            stack.callback(_ignore_stop_signals)
            nats = next((s for s in infra if isinstance(s, NatsServer)), None)
            watch = TenantWatch(auth, nats, database_url, _no_sink) if nats is not None else None
            return asyncio.run(
                _serve(options, state, console, specs, endpoints, devcluster, infra, watch, external_metrics)
            )
    except (ComponentError, StateDirBusy) as err:
        console.print(f"[red]error:[/] {escape(str(err))}", soft_wrap=True)
        return 1
    except (KeyboardInterrupt, _Terminated):
        console.print("interrupted while starting; everything started so far was stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def _ignore_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _no_sink(name: str, line: str) -> None:
    return None


def _grant_roles(auth: StackAuth, infra: Sequence[ManagedProcess], admin_url: str, console: Console) -> None:
    """Each service's PostgreSQL role, when ``tessera up`` runs PostgreSQL (a given database is used
    as given)."""
    pg = next((s for s in infra if isinstance(s, PostgresServer)), None)
    if pg is None:
        return
    with console.status("Granting each service its PostgreSQL role…"):
        try:
            auth.grant_roles(pg, admin_url)
        except Exception as err:
            raise ComponentError("postgres roles", f"{type(err).__name__}: {err}", pg.log_file) from err
    console.print("[green]✓[/] a PostgreSQL role per service, each limited to its schema")


def _start_infra(
    options: UpOptions, state: StateDir, console: Console, stack: contextlib.ExitStack, auth: StackAuth
) -> tuple[str, str, list[ManagedProcess]]:
    """Start what no URL was given for; stops are pushed on ``stack`` (NATS stops before PostgreSQL).
    Returns the URLs (NATS's as its admin user) and the servers started, which ``_serve`` restarts
    when they die. NATS runs with a user per service and per tenant of the queue configuration."""
    started: list[ManagedProcess] = []
    database_url = options.database_url
    if database_url is None:
        pg = PostgresServer(
            state.pg_data,
            port=state.choose_port("postgres", options.default_port(DEFAULT_POSTGRES_PORT)),
            log_file=state.log_file("postgres"),
        )
        verb = "reusing" if (state.pg_data / "PG_VERSION").exists() else "creating"
        with console.status(f"Starting PostgreSQL on {HOST}:{pg.port} ({verb} {state.pg_data})…"):
            stack.callback(_stopping, console, "postgres", pg.cleanup)
            pg.start(timeout=options.ready_timeout)
        state.remember_ports({"postgres": pg.port})
        started.append(pg)
        database_url = pg.url
        console.print(f"[green]✓[/] postgres ready on {HOST}:{pg.port} ({verb} its data)")
    else:
        console.print("[green]✓[/] postgres: using the given database URL")
    nats_url = options.nats_url
    if nats_url is None:
        nats = NatsServer(
            state.nats_store,
            port=state.choose_port("nats", options.default_port(DEFAULT_NATS_PORT)),
            log_file=state.log_file("nats"),
        )
        auth.nats_server(nats, tenants_now(database_url))
        with console.status(f"Starting NATS with JetStream on {HOST}:{nats.port}…"):
            stack.callback(_stopping, console, "nats", nats.stop)
            nats.start(timeout=options.ready_timeout)
        state.remember_ports({"nats": nats.port})
        started.append(nats)
        nats_url = auth.admin_nats_url(nats.url)
        console.print(
            f"[green]✓[/] nats ready on {HOST}:{nats.port} (JetStream store {state.nats_store}; "
            f"a user per service and per tenant, {auth.nats.config_file})"
        )
    else:
        console.print("[green]✓[/] nats: using the given URL")
    return nats_url, database_url, started


def _stopping(console: Console, component: str, stop: Callable[[], None]) -> None:
    console.print(f"stopping {component}…")
    stop()


async def _serve(
    options: UpOptions,
    state: StateDir,
    console: Console,
    specs: list[ServiceSpec],
    endpoints: Endpoints,
    devcluster: DevclusterProcess | None = None,
    infra: Sequence[ManagedProcess] = (),
    tenant_watch: TenantWatch | None = None,
    external_metrics: ExternalMetrics | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # NATS, PostgreSQL and the devcluster (which restores its state file) are restarted in place
    # when they die; the services ride the outage out
    watched = [*infra, *([devcluster] if devcluster is not None else [])]
    sink = _console_sink(console, [s.component for s in watched] + [s.name for s in specs])
    supervisor = Supervisor(specs, sink=sink, stop_timeout=options.stop_timeout)
    infra_watches = [
        loop.create_task(InfraWatch(server, sink, ready_timeout=options.ready_timeout).run(stop))
        for server in watched
    ]
    if tenant_watch is not None:  # tenants of queues applied from now on get their NATS users
        tenant_watch.sink = sink
        infra_watches.append(loop.create_task(tenant_watch.run(stop)))
    try:
        await supervisor.start()
        if await _wait_ready(supervisor, endpoints, options.ready_timeout, stop, console):
            if devcluster is not None and endpoints.admission_api_url:
                # kubectl apply of a workload labelled tessera.io/queue is held for admission
                await asyncio.to_thread(register_webhook, devcluster.kubeconfig, endpoints.admission_api_url)
            if devcluster is not None and external_metrics is not None:
                # the devcluster proxies external.metrics.k8s.io to the forecaster, and its HPAs read it
                await asyncio.to_thread(register_external_metrics, devcluster.kubeconfig, external_metrics)
            _write_endpoints(state, endpoints, external_metrics)
            _print_table(console, state, endpoints, devcluster, options.otlp_endpoint, external_metrics)
            await stop.wait()
        console.print("stopping services…")
    finally:
        for task in infra_watches:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await supervisor.stop()
        state.endpoints_file.unlink(missing_ok=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0


def _write_endpoints(state: StateDir, endpoints: Endpoints, external_metrics: ExternalMetrics | None) -> None:
    """``endpoints.json``, with the external metrics API beside the services when it is served."""
    if external_metrics is None:
        write_endpoints(state.endpoints_file, endpoints)
        return
    write_json_atomically(
        state.endpoints_file, {**endpoints.to_json(), "external_metrics": external_metrics.endpoint()}
    )


async def _wait_ready(
    supervisor: Supervisor, endpoints: Endpoints, within: float, stop: asyncio.Event, console: Console
) -> bool:
    """Poll every ``/readyz`` until all answer 200; ``False`` when asked to stop meanwhile."""
    loop = asyncio.get_running_loop()
    pending = {name: ep.ready_url for name, ep in endpoints.services.items()}
    deadline = loop.time() + within
    async with httpx.AsyncClient(timeout=1.0) as client:
        with console.status("Waiting for the services to be ready…") as status:
            while pending:
                results = await asyncio.gather(*(_is_ready(client, url) for url in pending.values()))
                for name, ok in zip(list(pending), results, strict=True):
                    if ok:
                        del pending[name]
                        console.print(f"[green]✓[/] {name} ready")
                if not pending:
                    return True
                if loop.time() > deadline:
                    name = next(iter(pending))
                    others = f" (also not ready: {', '.join(list(pending)[1:])})" if len(pending) > 1 else ""
                    raise ComponentError(
                        name,
                        f"not ready after {within:.0f}s: {pending[name]} did not answer 200, "
                        f"{supervisor.restarts(name)} restart(s){others}",
                        Path(endpoints.services[name].log_file or ""),
                    )
                status.update(f"Waiting for {', '.join(pending)} to be ready…")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.2)
                if stop.is_set():
                    return False
    return True


async def _is_ready(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url)).status_code == 200
    except httpx.HTTPError:
        return False
