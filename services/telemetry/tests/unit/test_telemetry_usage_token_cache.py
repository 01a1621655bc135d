"""The usage API's cache of admission's verdicts on bearer tokens, as telemetry's settings build the shared
check (`tessera.core.tenant_tokens`): bounded however many tokens callers make up, a refusal remembered
only briefly, a grant for `CACHE_S` (ADR 0016), so a revoked token stops reading within that."""

from __future__ import annotations

import secrets

import pytest
from fastapi import HTTPException
from pydantic import SecretStr
from starlette.requests import Request

from tessera.core import tenant_tokens
from tessera.core.tenant_tokens import CACHE_S, Scope, TenantTokens
from tessera.telemetry.config import TelemetrySettings


class Admission:
    """Admission's answers by token: a tenant's tokens may read their tenant; others are unknown."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.asked = 0

    async def check(self, token: str, tenant: str | None) -> Scope | int:
        self.asked += 1
        own = self.tokens.get(token)
        if own is None:
            return 401
        return Scope(own) if tenant in (None, own) else 403


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


@pytest.fixture
def admission() -> Admission:
    return Admission()


@pytest.fixture
def tokens(admission: Admission, clock: list[float], monkeypatch: pytest.MonkeyPatch) -> TenantTokens:
    """Telemetry's check of tokens, with admission's answers made up (no HTTP) and a controlled clock."""
    settings = TelemetrySettings(admin_token=SecretStr("admin"), admission_url="http://admission")
    built = settings.tokens()
    built.clock = lambda: clock[0]
    monkeypatch.setattr(built, "_tenant_check", admission.check)
    return built


def request(token: str) -> Request:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    return Request({"type": "http", "method": "GET", "path": "/v1/usage", "headers": headers})


async def resolve(tokens: TenantTokens, token: str, tenant: str | None = None) -> Scope | int:
    try:
        return await tokens.scope(request(token), tenant)
    except HTTPException as exc:
        return exc.status_code


async def test_made_up_tokens_and_tenants_leave_at_most_the_bound(
    tokens: TenantTokens, admission: Admission, clock: list[float]
) -> None:
    admission.tokens["tok-a"] = "team-a"
    assert await resolve(tokens, "tok-a") == Scope("team-a")
    for i in range(3 * tenant_tokens.CACHE_MAX):
        assert await resolve(tokens, secrets.token_hex(8)) == 401
        assert await resolve(tokens, "tok-a", f"tenant-{i}") == 403
        clock[0] += 0.001
    assert len(tokens.cache) <= tenant_tokens.CACHE_MAX + tenant_tokens.NEGATIVE_CACHE_MAX
    assert len(tokens.cache.refused) <= tenant_tokens.NEGATIVE_CACHE_MAX
    # refusals never push a grant out: the valid token is still answered from the cache
    asked = admission.asked
    assert await resolve(tokens, "tok-a") == Scope("team-a")
    assert admission.asked == asked


async def test_granted_entries_are_bounded_oldest_out_first(
    tokens: TenantTokens, admission: Admission, clock: list[float]
) -> None:
    for i in range(tenant_tokens.CACHE_MAX + 10):
        admission.tokens[f"tok-{i}"] = f"team-{i}"
        assert await resolve(tokens, f"tok-{i}") == Scope(f"team-{i}")
    assert len(tokens.cache.granted) == tenant_tokens.CACHE_MAX
    asked = admission.asked
    newest = tenant_tokens.CACHE_MAX + 9
    assert await resolve(tokens, f"tok-{newest}") == Scope(f"team-{newest}")
    assert admission.asked == asked  # the newest is cached
    assert await resolve(tokens, "tok-0") == Scope("team-0")
    assert admission.asked == asked + 1  # the oldest was evicted, so admission is asked again


async def test_expired_entries_go_before_live_ones(
    tokens: TenantTokens, admission: Admission, clock: list[float]
) -> None:
    admission.tokens["old"] = "team-old"
    assert await resolve(tokens, "old") == Scope("team-old")
    clock[0] += CACHE_S + 1  # expired
    for i in range(tenant_tokens.CACHE_MAX):
        admission.tokens[f"tok-{i}"] = f"team-{i}"
        assert await resolve(tokens, f"tok-{i}") == Scope(f"team-{i}")
    assert "team-old" not in {v.tenant for _, v in tokens.cache.granted.values()}
    asked = admission.asked
    assert await resolve(tokens, "tok-0") == Scope("team-0")
    assert admission.asked == asked  # the first live one stayed


async def test_a_refusal_is_remembered_briefly_and_a_grant_for_the_documented_minute(
    tokens: TenantTokens, admission: Admission, clock: list[float]
) -> None:
    assert await resolve(tokens, "new") == 401
    admission.tokens["new"] = "team-n"  # issued just after a first try
    assert await resolve(tokens, "new") == 401  # still the cached refusal
    clock[0] += tenant_tokens.NEGATIVE_CACHE_S + 0.1
    assert await resolve(tokens, "new") == Scope("team-n")
    # revoked: still served from the cache for at most CACHE_S, then refused
    del admission.tokens["new"]
    clock[0] += CACHE_S - 1
    assert await resolve(tokens, "new") == Scope("team-n")
    clock[0] += 1.1
    assert await resolve(tokens, "new") == 401


async def test_the_admin_token_is_not_cached(tokens: TenantTokens, admission: Admission) -> None:
    assert await resolve(tokens, "admin") == tenant_tokens.ALL
    assert await resolve(tokens, "admin", "team-b") == Scope("team-b")
    assert len(tokens.cache) == 0 and admission.asked == 0
