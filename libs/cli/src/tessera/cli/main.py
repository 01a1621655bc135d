"""The `tessera` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tessera.cli import devcluster, jobs, queues, tokens, up, usage

app = typer.Typer(
    help="Tessera: gang scheduling, GPU sharing and cheap preemption for GPU clusters on Kubernetes.",
    no_args_is_help=True,
)
contracts_app = typer.Typer(help="The published commands and events.", no_args_is_help=True)
app.add_typer(jobs.app, name="jobs")
app.add_typer(queues.app, name="queues")
app.add_typer(tokens.app, name="tokens")
app.add_typer(contracts_app, name="contracts")
app.add_typer(devcluster.app, name="devcluster")
app.add_typer(usage.app, name="usage")
up.register(app)
console = Console()


@contracts_app.command("export")
def export_contracts(directory: Annotated[Path, typer.Argument(help="where to write the schemas")]) -> None:
    """Write a JSON Schema per command and event (and the job spec), and an AsyncAPI 3 document."""
    from tessera.contracts.export import export

    for path in export(directory):
        console.print(f"wrote {path}")


@app.command()
def migrate(
    service: Annotated[str | None, typer.Argument(help="one service's schema; all six when omitted")] = None,
    database_url: Annotated[
        str | None, typer.Option(envvar="TESSERA_DATABASE_URL", help="postgresql://user:pass@host:port/db")
    ] = None,
) -> None:
    """Upgrade the database schemas to the latest revision."""
    from tessera.contracts.subjects import SERVICES
    from tessera.core.db.migrations import migrate as migrate_one

    if not database_url:
        raise typer.BadParameter(
            "give --database-url or set TESSERA_DATABASE_URL", param_hint="--database-url"
        )
    if service is not None and service not in SERVICES:
        raise typer.BadParameter(
            f"unknown service {service!r}; one of {', '.join(SERVICES)}", param_hint="SERVICE"
        )
    for name in [service] if service else list(SERVICES):
        migrate_one(name, database_url)
        console.print(f"migrated [bold]{name}[/]")


def main() -> None:
    app()
