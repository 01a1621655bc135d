"""Bearer tokens in Postgres, stored as their sha256; the tenant's idempotency keys beside them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import idempotency_keys, tokens
from tessera.admission.domain.tokens import TokenRecord, token_id

_COLUMNS = (
    tokens.c.id,
    tokens.c.tenant,
    tokens.c.admin,
    tokens.c.created_at,
    tokens.c.expires_at,
    tokens.c.revoked_at,
)


def _record(row: Any) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        tenant=row.tenant,
        admin=bool(row.admin),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


class TokenRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(
        self, sha256: str, tenant: str | None, admin: bool = False, expires_at: datetime | None = None
    ) -> TokenRecord:
        row = (
            await self.session.execute(
                insert(tokens)
                .values(sha256=sha256, id=token_id(sha256), tenant=tenant, admin=admin, expires_at=expires_at)
                .returning(*_COLUMNS)
            )
        ).one()
        return _record(row)

    async def find(self, sha256: str) -> TokenRecord | None:
        row = (await self.session.execute(select(*_COLUMNS).where(tokens.c.sha256 == sha256))).first()
        return None if row is None else _record(row)

    async def list(self, *, tenant: str | None = None) -> list[TokenRecord]:
        query = select(*_COLUMNS).order_by(tokens.c.created_at, tokens.c.id)
        if tenant is not None:
            query = query.where(tokens.c.tenant == tenant)
        return [_record(row) for row in await self.session.execute(query)]

    async def revoke(self, id_: str, at: datetime) -> TokenRecord | None:
        """Revoke the token named ``id_`` (a token revoked already keeps its first time)."""
        await self.session.execute(
            update(tokens).where(tokens.c.id == id_, tokens.c.revoked_at.is_(None)).values(revoked_at=at)
        )
        row = (await self.session.execute(select(*_COLUMNS).where(tokens.c.id == id_))).first()
        return None if row is None else _record(row)


class IdempotencyKeyRepository:
    """Which job each (tenant, Idempotency-Key) made, and the hash of the body it came with."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def find(self, tenant: str, key: str) -> tuple[str, str] | None:
        """(body_sha256, job_id) of the tenant's key, or None when the tenant never sent it."""
        row = (
            await self.session.execute(
                select(idempotency_keys.c.body_sha256, idempotency_keys.c.job_id).where(
                    idempotency_keys.c.tenant == tenant, idempotency_keys.c.key == key
                )
            )
        ).first()
        return None if row is None else (row.body_sha256, row.job_id)

    async def claim(self, tenant: str, key: str, body_sha256: str, job_id: str) -> bool:
        """Record that the tenant's key made ``job_id``; False when a concurrent submission recorded
        the key first (this waits for it to commit or roll back)."""
        result = await self.session.execute(
            pg_insert(idempotency_keys)
            .values(tenant=tenant, key=key, body_sha256=body_sha256, job_id=job_id)
            .on_conflict_do_nothing(index_elements=[idempotency_keys.c.tenant, idempotency_keys.c.key])
            .returning(idempotency_keys.c.job_id)
        )
        return result.first() is not None
