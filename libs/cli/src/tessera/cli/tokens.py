"""`tessera tokens`: bearer tokens for tenants: create, list, revoke. Every command needs the admin
token, even on a stack with auth disabled: TESSERA_TOKEN, else the state directory's admin-token,
which `tessera up` writes (mode 0600) and prints once, at the stack's first start."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tessera.cli.client import ADMIN_TOKEN_FILE, fail_on_error
from tessera.cli.jobs import ApiOption, _client, _fail_unreachable

app = typer.Typer(help="Bearer tokens that let a tenant use admission (admin token).", no_args_is_help=True)


def console() -> Console:
    """Standard output, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console()


def err() -> Console:
    """Standard error, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console(stderr=True)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+)([smhd]?)$")


def parse_duration(value: str | None) -> int | None:
    """``3600``, ``90m``, ``12h`` or ``30d`` as seconds."""
    if value is None:
        return None
    found = _DURATION.fullmatch(value.strip())
    if found is None or int(found[1]) == 0:
        raise typer.BadParameter(
            f"{value!r} is not a duration like 3600, 90m, 12h or 30d", param_hint="--ttl"
        )
    return int(found[1]) * _UNITS[found[2] or "s"]


def _call(api: str | None, send: Callable[[httpx.Client], httpx.Response]) -> Any:
    with _client(api) as client:
        try:
            response = send(client)
        except httpx.HTTPError as exc:
            raise _fail_unreachable(str(client.base_url), exc) from exc
    fail_on_error(response)
    return response.json()


@app.command()
def create(
    tenant: Annotated[str, typer.Argument(help="the tenant the token acts for (a DNS label)")],
    ttl: Annotated[str | None, typer.Option(help="it expires after this long: 3600, 90m, 12h, 30d")] = None,
    expires_at: Annotated[
        datetime | None, typer.Option(help="it expires then (ISO 8601, UTC unless a zone is given)")
    ] = None,
    api: ApiOption = None,
) -> None:
    """Create a token for TENANT and print it once (admission keeps only its hash).

    The tenant then sets TESSERA_TOKEN to it: it may submit only to its own queue and sees only
    its own jobs and queue. Without --ttl or --expires-at it lasts until revoked."""
    if ttl is not None and expires_at is not None:
        raise typer.BadParameter("give --ttl or --expires-at, not both", param_hint="--ttl")
    body: dict[str, Any] = {"tenant": tenant}
    if (seconds := parse_duration(ttl)) is not None:
        body["ttl_seconds"] = seconds
    if expires_at is not None:
        body["expires_at"] = (expires_at if expires_at.tzinfo else expires_at.replace(tzinfo=UTC)).isoformat()
    made = _call(api, lambda client: client.post("/v1/tokens", json=body))
    console().print(made["token"], soft_wrap=True)
    until = f"expires {made['expires_at']}" if made.get("expires_at") else "does not expire"
    err().print(f"token {made['id']} for tenant {escape(tenant)}; {until}", soft_wrap=True)


@app.command("list")
def list_tokens(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's tokens")] = None,
    api: ApiOption = None,
) -> None:
    """Every token, oldest first: its id, tenant, state and times (never the token itself)."""
    params = {"tenant": tenant} if tenant else {}
    found = _call(api, lambda client: client.get("/v1/tokens", params=params))
    table = Table("id", "tenant", "state", "created", "expires", "revoked")
    for t in found:
        table.add_row(
            t["id"],
            "(admin)" if t["admin"] else escape(t["tenant"] or ""),
            t["state"],
            t["created_at"],
            t["expires_at"] or "",
            t["revoked_at"] or "",
        )
    console().print(table)


@app.command()
def revoke(
    token_id: Annotated[str, typer.Argument(help="the token's id, as `tessera tokens list` shows it")],
    api: ApiOption = None,
) -> None:
    """Revoke a token: from now on admission answers it 401."""
    revoked = _call(api, lambda client: client.post(f"/v1/tokens/{token_id}/revoke"))
    console().print(f"revoked {revoked['id']} (tenant {escape(revoked['tenant'] or '(admin)')})")


def with_admin_token(migrate: Callable[[str], None], state_dir: Path, show: Console) -> Callable[[str], None]:
    """``tessera up``'s migrations, then the stack's admin token: made at its first start (kept
    hashed in admission's table and in clear in STATE_DIR/admin-token, mode 0600) and printed that
    once; a later start says where it is."""

    def migrate_then_ensure(database_url: str) -> None:
        from tessera.admission.admin_token import ensure_admin_token  # the database client, when used

        migrate(database_url)
        path = state_dir.resolve() / ADMIN_TOKEN_FILE
        made = ensure_admin_token(database_url, path)
        if made is not None:
            show.print(
                f"[green]✓[/] admin token (shown this once; the CLI reads it from {escape(str(path))}, "
                f"readable by you alone): {made}",
                soft_wrap=True,
            )
        else:
            show.print(f"[green]✓[/] admin token in {escape(str(path))}", soft_wrap=True)

    return migrate_then_ensure
