"""The usage API's cache of admission's verdicts on bearer tokens: bounded however many tokens callers
make up, a refusal remembered only briefly, a grant for `CACHE_S` (ADR 0016), so a revoked token stops
reading within that."""

from __future__ import annotations

import secrets
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import HTTPException

import tessera.telemetry.entrypoints.usage_api as usage_api
from tessera.telemetry.entrypoints.usage_api import CACHE_S, Scope


class Admission:
    """Admission's answers by token: a tenant's tokens may read their tenant; others are unknown."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.asked = 0

    async def check(self, deps: Any, token: str, tenant: str | None) -> Scope | int:
        self.asked += 1
        own = self.tokens.get(token)
        if own is None:
            return 401
        return Scope(own) if tenant in (None, own) else 403


@pytest.fixture
def admission(monkeypatch: pytest.MonkeyPatch) -> Admission:
    fake = Admission()
    monkeypatch.setattr(usage_api, "_check", fake.check)
    monkeypatch.setattr(usage_api, "_cache", usage_api.VerdictCache())
    return fake


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(usage_api, "_now", lambda: now[0])
    return now


DEPS: Any = SimpleNamespace(admin_token="admin", admission_url="http://admission")


async def resolve(token: str, tenant: str | None = None) -> Scope | int:
    try:
        return await usage_api._resolve(DEPS, token, tenant)
    except HTTPException as exc:
        return exc.status_code


async def test_made_up_tokens_and_tenants_leave_at_most_the_bound(
    admission: Admission, clock: list[float]
) -> None:
    admission.tokens["tok-a"] = "team-a"
    assert await resolve("tok-a") == Scope("team-a")
    for i in range(3 * usage_api.CACHE_MAX):
        assert await resolve(secrets.token_hex(8)) == 401
        assert await resolve("tok-a", f"tenant-{i}") == 403
        clock[0] += 0.001
    assert len(usage_api._cache) <= usage_api.CACHE_MAX + usage_api.NEGATIVE_CACHE_MAX
    assert len(usage_api._cache.refused) <= usage_api.NEGATIVE_CACHE_MAX
    # refusals never push a grant out: the valid token is still answered from the cache
    asked = admission.asked
    assert await resolve("tok-a") == Scope("team-a")
    assert admission.asked == asked


async def test_granted_entries_are_bounded_oldest_out_first(admission: Admission, clock: list[float]) -> None:
    for i in range(usage_api.CACHE_MAX + 10):
        admission.tokens[f"tok-{i}"] = f"team-{i}"
        assert await resolve(f"tok-{i}") == Scope(f"team-{i}")
    assert len(usage_api._cache.granted) == usage_api.CACHE_MAX
    asked = admission.asked
    assert await resolve(f"tok-{usage_api.CACHE_MAX + 9}") == Scope(f"team-{usage_api.CACHE_MAX + 9}")
    assert admission.asked == asked  # the newest is cached
    assert await resolve("tok-0") == Scope("team-0")
    assert admission.asked == asked + 1  # the oldest was evicted, so admission is asked again


async def test_expired_entries_go_before_live_ones(admission: Admission, clock: list[float]) -> None:
    admission.tokens["old"] = "team-old"
    assert await resolve("old") == Scope("team-old")
    clock[0] += CACHE_S + 1  # expired
    for i in range(usage_api.CACHE_MAX):
        admission.tokens[f"tok-{i}"] = f"team-{i}"
        assert await resolve(f"tok-{i}") == Scope(f"team-{i}")
    assert "old" not in {v.tenant for _, v in usage_api._cache.granted.values()}
    asked = admission.asked
    assert await resolve("tok-0") == Scope("team-0")
    assert admission.asked == asked  # the first live one stayed


async def test_a_refusal_is_remembered_briefly_and_a_grant_for_the_documented_minute(
    admission: Admission, clock: list[float]
) -> None:
    assert await resolve("new") == 401
    admission.tokens["new"] = "team-n"  # issued just after a first try
    assert await resolve("new") == 401  # still the cached refusal
    clock[0] += usage_api.NEGATIVE_CACHE_S + 0.1
    assert await resolve("new") == Scope("team-n")
    # revoked: still served from the cache for at most CACHE_S, then refused
    del admission.tokens["new"]
    clock[0] += CACHE_S - 1
    assert await resolve("new") == Scope("team-n")
    clock[0] += 1.1
    assert await resolve("new") == 401


async def test_the_admin_token_is_not_cached(admission: Admission, clock: list[float]) -> None:
    assert await resolve("admin") == usage_api.ALL
    assert len(usage_api._cache) == 0 and admission.asked == 0
