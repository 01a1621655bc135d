"""`tessera tokens`: bearer tokens for tenants (needs the admin token in TESSERA_TOKEN)."""

from __future__ import annotations

from typing import Annotated

import httpx
import typer
from rich.console import Console

from tessera.cli.jobs import ApiOption, _client, _fail_unreachable, fail_on_error

app = typer.Typer(help="Bearer tokens that let a tenant use admission.", no_args_is_help=True)
console = Console()


@app.command()
def create(
    tenant: Annotated[str, typer.Argument(help="the tenant the token acts for")], api: ApiOption = None
) -> None:
    """Create a token for TENANT and print it once (admission keeps only its hash).

    The tenant then sets TESSERA_TOKEN to it: it may submit only to its own queue and sees only
    its own jobs."""
    with _client(api) as client:
        try:
            response = client.post("/v1/tokens", json={"tenant": tenant})
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    fail_on_error(response)
    console.print(response.json()["token"], soft_wrap=True)
