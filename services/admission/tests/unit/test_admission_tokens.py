"""Tokens in the service layer: kept hashed, acting for one tenant, refused once revoked or expired;
a tenant must be a name a job may carry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.admission.domain.tokens import tenant_error
from tessera.admission.service_layer.tokens import (
    InvalidTenant,
    TokenRefused,
    grant_of,
    hash_token,
    issue_admin_token,
    issue_token,
    revoke_token,
)

T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


async def test_a_token_is_kept_hashed_and_acts_for_its_tenant(uow: Any) -> None:
    async with uow:
        token, record = await issue_token(uow, "team")
        admin, _ = await issue_admin_token(uow)
        await uow.commit()
    assert token not in uow.fake_tokens.by_hash and hash_token(token) in uow.fake_tokens.by_hash
    assert record.id == hash_token(token)[:16] and record.id not in token
    async with uow:
        grant = await grant_of(uow, token)
        as_admin = await grant_of(uow, admin)
        with pytest.raises(TokenRefused, match="unknown bearer token"):
            await grant_of(uow, "tsr_guessed")
    assert (grant.tenant, grant.admin) == ("team", False)
    assert (as_admin.tenant, as_admin.admin) == (None, True)


async def test_an_expired_or_revoked_token_is_refused(uow: Any) -> None:
    async with uow:
        expiring, _ = await issue_token(uow, "team", expires_at=T0 + timedelta(hours=1))
        revoked, record = await issue_token(uow, "team")
        await uow.commit()
    async with uow:
        assert (await grant_of(uow, expiring, T0)).tenant == "team"
        with pytest.raises(TokenRefused, match="expired at 2026-11-28T10:00:00"):
            await grant_of(uow, expiring, T0 + timedelta(hours=1))
        assert (await grant_of(uow, revoked, T0)).tenant == "team"
        first = await revoke_token(uow, record.id, T0)
        again = await revoke_token(uow, record.id, T0 + timedelta(days=1))
        assert await revoke_token(uow, "0000000000000000", T0) is None
        with pytest.raises(TokenRefused, match="revoked at 2026-11-28T09:00:00"):
            await grant_of(uow, revoked, T0 + timedelta(seconds=1))
    assert first is not None and again is not None and first.revoked_at == again.revoked_at == T0


@pytest.mark.parametrize("tenant", ["", " ", "a" * 64, "Team", "a\x00b", "a\nb", "-a", "a_b", "é"])
async def test_a_token_tenant_is_a_name_a_job_may_carry(uow: Any, tenant: str) -> None:
    assert tenant_error(tenant) is not None
    async with uow:
        with pytest.raises(InvalidTenant):
            await issue_token(uow, tenant)
    assert uow.fake_tokens.by_hash == {}


def test_valid_tenants_pass() -> None:
    assert [tenant_error(t) for t in ("a", "team-a", "a" * 63, "0")] == [None] * 4


async def test_the_tenant_telemetry_bills_unattributed_usage_to_is_reserved(uow: Any) -> None:
    """Telemetry bills GPU use no job is known for to tenant `unknown`: a token for it would read
    (and its jobs would be billed with) everyone's unattributed usage."""
    assert tenant_error("unknown") == "'unknown' is reserved for usage no job is known for"
    async with uow:
        with pytest.raises(InvalidTenant, match="reserved for usage no job is known for"):
            await issue_token(uow, "unknown")
    assert uow.fake_tokens.by_hash == {}
    assert tenant_error("unknown-team") is None
