"""Bearer tokens in Postgres, stored as their sha256."""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from tessera.admission.adapters.orm import tokens


class TokenRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, sha256: str, tenant: str | None, admin: bool = False) -> None:
        await self.session.execute(insert(tokens).values(sha256=sha256, tenant=tenant, admin=admin))

    async def find(self, sha256: str) -> tuple[str | None, bool] | None:
        """(tenant, admin) of the token with this hash, or None when there is none."""
        row = (
            await self.session.execute(
                select(tokens.c.tenant, tokens.c.admin).where(tokens.c.sha256 == sha256)
            )
        ).first()
        return None if row is None else (row.tenant, bool(row.admin))
