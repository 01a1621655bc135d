"""What ``tessera up`` starts before the services: PostgreSQL, NATS, each service's role, the devcluster.

Each start pushes its stop on the run's `contextlib.ExitStack`, so once the services have stopped they
stop in reverse order: the devcluster, then NATS, then PostgreSQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from rich.console import Console

from tessera.cli.devcluster import DEFAULT_DEVCLUSTER_PORT, DevclusterProcess, write_default_cluster
from tessera.cli.up_auth import StackAuth, tenants_now
from tessera.cli.up_autoscaling import AutoscalingDevcluster
from tessera.cli.up_plan import DEFAULT_NATS_PORT, DEFAULT_POSTGRES_PORT, HOST, UpOptions
from tessera.core.embedded import ComponentError, ManagedProcess, NatsServer, PostgresServer, StateDir


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
        stack.callback(stopping, console, "devcluster", devcluster.stop)
        devcluster.start(timeout=options.ready_timeout)
    state.remember_ports({"devcluster": devcluster.port})
    hpa = f"; HPA controller every {options.hpa_sync_seconds:g}s" if options.hpa_sync_seconds > 0 else ""
    console.print(
        f"[green]✓[/] devcluster ready on {devcluster.url} ({cluster_file.name}, speed x{options.devcluster_speed:g}{hpa}); "
        f"kubeconfig {devcluster.kubeconfig}"
    )
    return devcluster


def grant_roles(auth: StackAuth, infra: Sequence[ManagedProcess], admin_url: str, console: Console) -> None:
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


def start_infra(
    options: UpOptions, state: StateDir, console: Console, stack: contextlib.ExitStack, auth: StackAuth
) -> tuple[str, str, list[ManagedProcess]]:
    """Start what no URL was given for; stops are pushed on ``stack`` (NATS stops before PostgreSQL).
    Returns the URLs (NATS's as its admin user) and the servers started, which ``tessera.cli.up_stack`` restarts
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
            stack.callback(stopping, console, "postgres", pg.cleanup)
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
            stack.callback(stopping, console, "nats", nats.stop)
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


def stopping(console: Console, component: str, stop: Callable[[], None]) -> None:
    console.print(f"stopping {component}…")
    stop()
