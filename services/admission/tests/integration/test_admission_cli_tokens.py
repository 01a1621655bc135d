"""`tessera tokens create|list|revoke` and `tessera up`'s admin token against the real admission app
(Postgres and NATS behind it, auth disabled as `tessera up` runs it): the token commands need the
admin token, which the CLI reads from the state directory."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from starlette.testclient import TestClient
from typer.testing import CliRunner

from tessera.admission.admin_token import ADMIN_TOKEN_FILE
from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.cli import client as cli_client
from tessera.cli import tokens
from tessera.cli.main import app
from tessera.core.runner import create_app
from tessera.testing.services import settings_for

from .conftest import scalar

pytestmark = pytest.mark.integration


@pytest.fixture
def cli(
    admission_db: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[TestClient]:
    monkeypatch.setenv("TESSERA_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("TESSERA_TOKEN", raising=False)
    settings = settings_for(AdmissionSettings, *admission_db, cycle_interval_s=0.05, auth="disabled")
    with TestClient(create_app(build(settings), settings), base_url="http://admission") as client:

        @contextmanager
        def shared(api: str | None) -> Iterator[Any]:
            token = cli_client.bearer_token()  # what admission_client sends
            client.headers.pop("Authorization", None)
            if token:
                client.headers["Authorization"] = f"Bearer {token}"
            yield client

        monkeypatch.setattr(tokens, "_client", shared)
        yield client


def test_the_admin_token_is_made_at_first_start_and_the_token_commands_use_it(
    cli: TestClient, admission_db: tuple[str, str], tmp_path: Path
) -> None:
    runner = CliRunner()
    refused = runner.invoke(app, ["tokens", "create", "research"])
    assert refused.exit_code == 1 and "error 401" in refused.output, refused.output

    state, migrated = tmp_path / "state", list[str]()
    shown = Console(record=True, width=400)
    start = tokens.with_admin_token(migrated.append, state, shown)
    start(admission_db[1])
    admin = (state / ADMIN_TOKEN_FILE).read_text().strip()
    first = shown.export_text()
    assert migrated == [admission_db[1]], "the migrations run first"
    assert admin.startswith("tsr_") and admin in first
    assert f"(shown this once; the CLI reads it from {state / 'admin-token'}" in first
    assert stat.S_IMODE((state / ADMIN_TOKEN_FILE).stat().st_mode) == 0o600
    start(admission_db[1])
    second = shown.export_text()
    assert admin not in second and f"admin token in {state / 'admin-token'}" in second, "printed once"
    assert (state / ADMIN_TOKEN_FILE).read_text().strip() == admin

    made = runner.invoke(app, ["tokens", "create", "research", "--ttl", "12h"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[0]
    assert token.startswith("tsr_")
    assert cli.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    lifetime = asyncio.run(
        scalar(
            admission_db[1],
            "SELECT extract(epoch FROM expires_at - created_at) FROM admission.tokens WHERE tenant = 'research'",
        )
    )
    assert 12 * 3600 - 60 < lifetime <= 12 * 3600

    listed = runner.invoke(app, ["tokens", "list"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0, listed.output
    assert token not in listed.output and admin not in listed.output
    row = next(line for line in listed.output.splitlines() if "research" in line)
    token_id = row.split("│")[1].strip()
    assert "active" in row and len(token_id) == 16

    revoked = runner.invoke(app, ["tokens", "revoke", token_id])
    assert revoked.exit_code == 0 and f"revoked {token_id}" in revoked.output, revoked.output
    assert cli.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    after = runner.invoke(app, ["tokens", "list", "--tenant", "research"], env={"COLUMNS": "250"})
    assert "revoked" in next(line for line in after.output.splitlines() if "research" in line)

    bad = runner.invoke(app, ["tokens", "create", "Bad_Tenant"])
    assert bad.exit_code == 1 and "(field tenant)" in " ".join(bad.output.split()), bad.output
    missing = runner.invoke(app, ["tokens", "revoke", "0000000000000000"])
    assert missing.exit_code == 1 and "no token with id" in missing.output
    assert runner.invoke(app, ["tokens", "create", "research", "--ttl", "soon"]).exit_code == 2


def test_tessera_up_prints_the_admin_token_once(
    admission_db: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`tessera up` as typed: its migrations step makes the token and prints it (the stack itself is
    left out: the command's run_up only runs the migrations it is given, on the test's database)."""
    from tessera.cli import up as up_command

    ran: list[str] = []

    def migrations_only(options: Any, *, console: Console, migrate: Any) -> int:
        migrate(admission_db[1])
        return 0

    monkeypatch.setattr(up_command, "run_up", migrations_only)
    monkeypatch.setattr(up_command, "migrate_all", ran.append)
    state = tmp_path / "stack"
    args = ["up", "--state-dir", str(state), "--no-devcluster", "--services", "admission"]
    first = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert first.exit_code == 0, first.output
    admin = (state / ADMIN_TOKEN_FILE).read_text().strip()
    assert ran == [admission_db[1]] and admin in first.output
    again = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert again.exit_code == 0 and admin not in again.output and "admin token in" in again.output
