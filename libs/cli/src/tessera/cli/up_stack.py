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
import signal
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console
from rich.markup import escape

from tessera.cli.devcluster import DevclusterProcess
from tessera.cli.infra_watch import InfraWatch
from tessera.cli.supervisor import ServiceSpec, Supervisor
from tessera.cli.up_auth import StackAuth, TenantWatch
from tessera.cli.up_autoscaling import DEFAULT_METRICS_TLS_PORT, ExternalMetrics, register_external_metrics
from tessera.cli.up_autoscaling import prepare as prepare_autoscaling
from tessera.cli.up_console import _console_sink, _print_table
from tessera.cli.up_infra import grant_roles, start_devcluster, start_infra
from tessera.cli.up_plan import (
    DEFAULT_NATS_PORT,
    DEFAULT_POSTGRES_PORT,
    DEFAULT_SERVICE_PORTS,
    HOST,
    SERVICES,
    SINGLE_LEADERS,
    Access,
    Migrate,
    ServiceArgv,
    UpOptions,
    default_service_argv,
    migrate_all,
    plan_services,
)
from tessera.cli.webhook import register_webhook
from tessera.core.embedded import (
    ComponentError,
    Endpoints,
    ManagedProcess,
    NatsServer,
    StateDir,
    StateDirBusy,
    write_endpoints,
)
from tessera.core.embedded.state import write_json_atomically

__all__ = [
    "DEFAULT_NATS_PORT",
    "DEFAULT_POSTGRES_PORT",
    "DEFAULT_SERVICE_PORTS",
    "HOST",
    "SERVICES",
    "SINGLE_LEADERS",
    "Access",
    "Migrate",
    "ServiceArgv",
    "UpOptions",
    "default_service_argv",
    "migrate_all",
    "plan_services",
    "run_up",
    "start_devcluster",
]


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
            nats_url, database_url, infra = start_infra(options, state, console, stack, auth)
            with console.status("Running migrations…"):
                try:
                    (migrate or migrate_all)(database_url)
                except Exception as err:
                    raise ComponentError("migrations", f"{type(err).__name__}: {err}") from err
            console.print("[green]✓[/] migrations applied")
            grant_roles(auth, infra, database_url, console)
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
