"""The `tessera` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from tessera.cli import devcluster, jobs, queues, tokens, up, usage
from tessera.cli.client import STATE_DIR_ENV, err, use_state_dir

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


def console() -> Console:
    """Standard output, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console()


@app.callback()
def options(
    state_dir: Annotated[
        Path | None,
        typer.Option(
            envvar=STATE_DIR_ENV,
            help="The stack's state directory: `tessera up` keeps its data there, and the other "
            "commands find the running stack through its endpoints.json (default: .tessera).",
        ),
    ] = None,
) -> None:
    """Tessera: gang scheduling, GPU sharing and cheap preemption for GPU clusters on Kubernetes."""
    use_state_dir(state_dir)


@contracts_app.command("export")
def export_contracts(directory: Annotated[Path, typer.Argument(help="where to write the schemas")]) -> None:
    """Write a JSON Schema per command and event (and the job spec), and an AsyncAPI 3 document."""
    from tessera.contracts.export import export

    for path in export(directory):
        console().print(f"wrote {path}")


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
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError

    try:
        url = make_url(database_url)
        driver, _ = url.drivername, url.port  # the port is read (and checked) only when asked for
    except (ArgumentError, ValueError):
        raise typer.BadParameter(
            "not a database URL; give postgresql://user:pass@host:port/db", param_hint="--database-url"
        ) from None
    if not driver.startswith("postgres"):
        raise typer.BadParameter(
            f"{driver!r} is not PostgreSQL; give postgresql://user:pass@host:port/db",
            param_hint="--database-url",
        )
    for name in [service] if service else list(SERVICES):
        try:
            migrate_one(name, database_url)
        except DBAPIError as exc:  # the database answered, and refused: a wrong password, no such database
            reason = str(exc.orig or exc).strip().splitlines()[0]
            err().print(f"[red]error[/]: cannot migrate {name}: {escape(reason)}", soft_wrap=True)
            raise typer.Exit(1) from exc
        console().print(f"migrated [bold]{name}[/]")


def main() -> None:
    # the commands report the errors they expect; this is the net for the rest: one line, no traceback
    try:
        app()
    except httpx.HTTPError as exc:
        err().print(f"[red]error[/]: {escape(type(exc).__name__)}: {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)
    except (OSError, ValueError) as exc:  # an unreadable or malformed endpoints.json, a bad file
        err().print(f"[red]error[/]: {escape(str(exc))}", soft_wrap=True)
        sys.exit(1)
