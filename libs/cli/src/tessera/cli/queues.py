"""`tessera queues`: apply a queueing configuration and show queue status."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from tessera.cli.client import fail_on_error
from tessera.cli.jobs import ApiOption, _client, _fail_unreachable, load_job_file

app = typer.Typer(
    help="Queues, cohorts, tenant queues and priority classes (changes need the admin token when auth "
    "is on; a tenant's token sees its own queue only).",
    no_args_is_help=True,
)


def console() -> Console:
    """Standard output, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console()


@app.command()
def apply(
    file: Annotated[Path, typer.Argument(help="YAML or JSON: flavors, cohorts, queues, tenant_queues, ...")],
    api: ApiOption = None,
) -> None:
    """Create or replace, by name, every flavor, cohort, queue, tenant queue and priority class in FILE.

    The whole result is checked first; a bad file changes nothing and names the field at fault."""
    document = load_job_file(file)
    if not isinstance(document, dict):
        raise typer.BadParameter(f"{file} must hold a mapping (flavors:, queues:, ...)")
    with _client(api) as client:
        try:
            response = client.put("/v1/config", json=document)
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    fail_on_error(response)
    counts = response.json()
    console().print(", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items()))


def _status(client: httpx.Client, name: str) -> dict[str, Any]:
    response = client.get(f"/v1/queues/{name}/status")
    fail_on_error(response)
    body: dict[str, Any] = response.json()
    return body


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="one queue; every queue when omitted")] = None,
    api: ApiOption = None,
) -> None:
    """Usage, borrowed and lent quota per flavor and resource, with pending and admitted job counts."""
    with _client(api) as client:
        try:
            if name:
                names = [name]
            else:
                listed = client.get("/v1/queues")
                fail_on_error(listed)
                names = [q["name"] for q in listed.json()]
            found = [_status(client, n) for n in names]
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    if not found:
        console().print(
            "no queues to show: none is configured (open mode: admission admits every valid job), "
            "or none is this token's tenant's"
        )
        return
    table = Table(
        "queue", "cohort", "flavor", "resource", "nominal", "usage", "borrowed", "lent", "pending", "admitted"
    )
    for q in found:
        rows = q["resources"] or [
            {"flavor": "-", "resource": "-", "nominal": 0, "usage": 0, "borrowed": 0, "lent": 0}
        ]
        for i, r in enumerate(rows):
            first = i == 0
            table.add_row(
                q["name"] if first else "",
                (q["cohort"] or "-") if first else "",
                r["flavor"],
                r["resource"],
                str(r["nominal"]),
                str(r["usage"]),
                str(r["borrowed"]),
                str(r["lent"]),
                str(q["pending"]) if first else "",
                str(q["admitted"]) if first else "",
            )
    console().print(table)
