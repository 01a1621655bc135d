"""Tokens through the whole app on real Postgres: only the admin token makes, lists and revokes
them, even with auth disabled; a tenant must be a name a job may carry; an expired or revoked
token is answered 401; the admin token of `tessera up` is kept hashed and in a 0600 file."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.admission.adapters import orm
from tessera.admission.admin_token import ensure_admin_token
from tessera.core.db.engine import async_url
from tessera.core.db.migrations import migrate

from .conftest import Api

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": "Bearer admin-secret"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def execute(db: str, statement: str, **params: Any) -> None:
    engine = create_async_engine(async_url(db))
    try:
        async with engine.begin() as conn:
            await conn.execute(text(statement), params)
    finally:
        await engine.dispose()


async def test_with_auth_disabled_only_the_admin_token_makes_tokens(api: Api, tmp_path: Path) -> None:
    anyone = await api.client.post("/v1/tokens", json={"tenant": "a"})
    assert anyone.status_code == 401 and anyone.json()["field"] == "Authorization"
    assert (await api.client.get("/v1/tokens")).status_code == 401
    assert (await api.client.get("/v1/jobs")).status_code == 200, "the rest of the API stays open"

    file = tmp_path / "state" / "admin-token"
    admin = await asyncio.to_thread(ensure_admin_token, api.db, file)
    assert admin is not None and file.read_text().strip() == admin
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert await asyncio.to_thread(ensure_admin_token, api.db, file) is None, "made once, then kept"
    assert file.read_text().strip() == admin
    stored = await api.scalar("SELECT count(*) FROM admission.tokens WHERE admin AND sha256 <> :t", t=admin)
    assert stored == 1, "stored hashed"

    made = await api.client.post("/v1/tokens", json={"tenant": "a"}, headers=bearer(admin))
    assert made.status_code == 201, made.text
    tenant_token = made.json()["token"]
    by_tenant = await api.client.post("/v1/tokens", json={"tenant": "a"}, headers=bearer(tenant_token))
    assert by_tenant.status_code == 403 and by_tenant.json()["code"] == "forbidden"

    await execute(api.db, "UPDATE admission.tokens SET revoked_at = now() WHERE admin")
    renewed = await asyncio.to_thread(ensure_admin_token, api.db, file)
    assert renewed not in (None, admin), "a revoked admin token on file is replaced"
    assert file.read_text().strip() == renewed


@pytest.mark.parametrize(
    "tenant", ["", "Team-A", "a\\u0001b", "a\\u0000", "a" * 64, "-a", "a b", "\\ud800"], ids=repr
)
async def test_a_token_tenant_must_be_a_name_a_job_may_carry(secured_api: Api, tenant: str) -> None:
    body = '{"tenant": "' + tenant + '"}'  # JSON escapes as written: a lone surrogate, control characters
    response = await secured_api.client.post(
        "/v1/tokens", content=body, headers={**ADMIN, "Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "tenant"
    assert await secured_api.scalar("SELECT count(*) FROM admission.tokens") == 0


async def test_tokens_expire_are_listed_without_secrets_and_are_revoked(secured_api: Api) -> None:
    api = secured_api
    made = await api.client.post("/v1/tokens", json={"tenant": "a", "ttl_seconds": 3600}, headers=ADMIN)
    assert made.status_code == 201, made.text
    a = made.json()
    assert a["state"] == "active" and a["expires_at"] is not None and a["revoked_at"] is None
    lifetime = await api.scalar(
        "SELECT extract(epoch FROM expires_at - created_at) FROM admission.tokens WHERE id = :id", id=a["id"]
    )
    assert 3500 < lifetime <= 3600
    b = (await api.client.post("/v1/tokens", json={"tenant": "b"}, headers=ADMIN)).json()
    assert b["expires_at"] is None
    assert (await api.client.get("/v1/jobs", headers=bearer(a["token"]))).status_code == 200

    for bad, field in [
        ({"tenant": "a", "ttl_seconds": 60, "expires_at": "2999-01-01T00:00:00Z"}, None),
        ({"tenant": "a", "expires_at": "2000-01-01T00:00:00Z"}, "expires_at"),
        ({"tenant": "a", "expires_at": "2999-01-01T00:00:00"}, "expires_at"),
        ({"tenant": "a", "ttl_seconds": "60"}, "ttl_seconds"),
        ({"tenant": "a", "ttl_seconds": 0}, "ttl_seconds"),
    ]:
        refused = await api.client.post("/v1/tokens", json=bad, headers=ADMIN)
        assert refused.status_code == 422, bad
        assert field is None or refused.json()["field"] == field, refused.json()

    listed = await api.client.get("/v1/tokens", headers=ADMIN)
    assert listed.status_code == 200
    assert [(t["id"], t["tenant"], t["state"]) for t in listed.json()] == [
        (a["id"], "a", "active"),
        (b["id"], "b", "active"),
    ]
    assert a["token"] not in listed.text and b["token"] not in listed.text
    assert all("token" not in t for t in listed.json())
    only_b = (await api.client.get("/v1/tokens", params={"tenant": "b"}, headers=ADMIN)).json()
    assert [t["id"] for t in only_b] == [b["id"]]
    assert (await api.client.get("/v1/tokens", headers=bearer(a["token"]))).status_code == 403
    assert (
        await api.client.post(f"/v1/tokens/{b['id']}/revoke", headers=bearer(a["token"]))
    ).status_code == 403

    revoked = await api.client.post(f"/v1/tokens/{b['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    refused = await api.client.get("/v1/jobs", headers=bearer(b["token"]))
    assert refused.status_code == 401 and "revoked" in refused.json()["message"]
    again = await api.client.post(f"/v1/tokens/{b['id']}/revoke", headers=ADMIN)
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]
    missing = await api.client.post("/v1/tokens/0000000000000000/revoke", headers=ADMIN)
    assert missing.status_code == 404

    await execute(
        api.db,
        "UPDATE admission.tokens SET expires_at = now() - interval '1 second' WHERE id = :id",
        id=a["id"],
    )
    expired = await api.client.get("/v1/jobs", headers=bearer(a["token"]))
    assert expired.status_code == 401 and "expired" in expired.json()["message"]
    states = {t["id"]: t["state"] for t in (await api.client.get("/v1/tokens", headers=ADMIN)).json()}
    assert states == {a["id"]: "expired", b["id"]: "revoked"}


async def test_the_migration_revokes_tokens_no_tenant_may_hold_and_matches_the_tables(
    fresh_database: str,
) -> None:
    db = fresh_database
    await asyncio.to_thread(migrate, "admission", db, "admission_0005")
    await execute(
        db,
        "INSERT INTO admission.tokens (sha256, tenant, admin) VALUES "
        "(repeat('a', 64), 'team-a', false), (repeat('b', 64), '', false), "
        "(repeat('c', 64), E'x\\x01', false), (repeat('d', 64), NULL, true)",
    )
    await asyncio.to_thread(migrate, "admission", db)
    engine = create_async_engine(async_url(db))
    try:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text("SELECT id, revoked_at IS NOT NULL FROM admission.tokens ORDER BY id")
                )
            ).all()

            def diff(connection: Any) -> list[Any]:
                ours = ("tokens", "idempotency_keys")
                context = MigrationContext.configure(
                    connection,
                    opts={
                        "include_schemas": True,
                        "include_name": lambda name, kind, parent: kind != "table" or name in ours,
                    },
                )
                return [d for d in compare_metadata(context, orm.metadata) if any(t in repr(d) for t in ours)]

            differences = await conn.run_sync(diff)
    finally:
        await engine.dispose()
    assert [tuple(r) for r in rows] == [
        ("a" * 16, False),
        ("b" * 16, True),
        ("c" * 16, True),
        ("d" * 16, False),
    ]
    assert differences == []
