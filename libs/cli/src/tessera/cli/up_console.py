"""What ``tessera up`` prints: each component's lines under its name, and the table of what runs where."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tessera.cli.devcluster import DevclusterProcess
from tessera.cli.up_autoscaling import APISERVICE, ExternalMetrics
from tessera.core.embedded import Endpoints, StateDir

_STYLES = ("cyan", "green", "yellow", "magenta", "blue", "bright_red")


def _console_sink(console: Console, names: list[str]) -> Callable[[str, str], None]:
    width = max((len(n) for n in names), default=0)
    styles = {n: _STYLES[i % len(_STYLES)] for i, n in enumerate(names)}

    def sink(name: str, line: str) -> None:
        label = Text(f"{name:<{width}} | ", style=styles.get(name, "white"))
        console.print(label + Text(line), soft_wrap=True, highlight=False)

    return sink


def _print_table(
    console: Console,
    state: StateDir,
    endpoints: Endpoints,
    devcluster: DevclusterProcess | None = None,
    otlp_endpoint: str | None = None,
    external_metrics: ExternalMetrics | None = None,
) -> None:
    table = Table(title="Tessera is up", title_justify="left", caption=f"state and logs under {state.root}")
    for column in ("component", "url", "log"):
        table.add_column(column, overflow="fold")
    logs = state.logs.name
    table.add_row("postgres", _hide_password(endpoints.database_url), f"{logs}/postgres.log")
    table.add_row("nats", _hide_password(endpoints.nats_url), f"{logs}/nats.log")
    if devcluster is not None:
        table.add_row("devcluster", devcluster.url, f"{logs}/devcluster.log")
    for name, ep in endpoints.services.items():
        table.add_row(name, ep.base_url, f"{logs}/{name}.log")
    if endpoints.admission_api_url:
        table.add_row("admission API", endpoints.admission_api_url, "")
    if otlp_endpoint:
        table.add_row("traces (OTLP)", otlp_endpoint, "")
    if external_metrics is not None:
        table.add_row(f"external metrics ({APISERVICE})", external_metrics.url, f"{logs}/forecaster.log")
    console.print(table)
    if endpoints.kubeconfig:
        console.print(f"kubectl --kubeconfig {endpoints.kubeconfig} get nodes,pods -o wide")
    if endpoints.kubeconfig and external_metrics is not None:
        console.print(
            f"kubectl --kubeconfig {endpoints.kubeconfig} get predictiveautoscalers,hpa -A   "
            "(the devcluster runs the HPAs on the forecaster's external metrics)"
        )
    tenants = state.credentials / "tenants"
    if tenants.is_dir():
        console.print(f"NATS credentials of each tenant's publishers: {tenants}/<tenant>.json")
    console.print(f"endpoints: {state.endpoints_file}   stop with Ctrl-C")


def _hide_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    if not at or ":" not in auth:
        return url
    return f"{scheme}{sep}{auth.split(':', 1)[0]}:***@{host}"
