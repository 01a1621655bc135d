"""The shared check of tenants' bearer tokens with admission, against a fake admission: what is cached and
for how long, an admission that fails, and job ids that are not plain path segments."""

from __future__ import annotations

from collections.abc import Awaitable

import httpx
import pytest
from fastapi import HTTPException
from starlette.requests import Request

from tessera.core.tenant_tokens import CACHE_S, NEGATIVE_CACHE_S, Scope, TenantTokens
from tessera.testing.fake_admission import FakeAdmission


def request(token: str | None) -> Request:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


def tokens_of(admission: FakeAdmission, clock: list[float]) -> TenantTokens:
    return TenantTokens(
        "http://admission", "required", "root", transport=admission.transport(), clock=lambda: clock[0]
    )


async def refused(call: Awaitable[object]) -> int:
    with pytest.raises(HTTPException) as caught:
        await call
    return caught.value.status_code


async def test_a_grant_is_trusted_for_a_minute_and_a_refusal_for_seconds(clock: list[float]) -> None:
    admission = FakeAdmission(jobs={"j": "team-a"})
    tokens = tokens_of(admission, clock)
    assert await refused(tokens.scope(request("new"))) == 401
    admission.tokens["new"] = "team-a"
    assert await refused(tokens.scope(request("new"))) == 401, "the refusal is remembered"
    clock[0] += NEGATIVE_CACHE_S + 0.1
    assert await tokens.scope(request("new")) == Scope("team-a")
    del admission.tokens["new"]  # revoked
    assert await tokens.scope(request("new")) == Scope("team-a"), "the grant is remembered"
    clock[0] += CACHE_S + 0.1
    assert await refused(tokens.scope(request("new"))) == 401


async def test_the_admin_token_is_never_asked_about_nor_cached(clock: list[float]) -> None:
    admission = FakeAdmission()
    tokens = tokens_of(admission, clock)
    assert await tokens.scope(request("root")) == Scope(None)
    assert await tokens.scope(request("root"), "team-b") == Scope("team-b")
    await tokens.require_job(request("root"), "anything")
    assert admission.asked == 0 and len(tokens.cache) == 0


async def test_an_admission_that_fails_is_503_and_not_remembered(clock: list[float]) -> None:
    admission = FakeAdmission(tokens={"tok-a": "team-a"}, jobs={"j": "team-a"})
    failing = [True]

    def answer(call: httpx.Request) -> httpx.Response:
        return httpx.Response(503) if failing[0] else admission.answer(call)

    tokens = TenantTokens("http://admission", transport=httpx.MockTransport(answer), clock=lambda: clock[0])
    assert await refused(tokens.require_job(request("tok-a"), "j")) == 503
    failing[0] = False
    await tokens.require_job(request("tok-a"), "j")


async def test_a_job_id_is_one_path_segment_whatever_it_holds(clock: list[float]) -> None:
    odd = "a/b?c#d%2F"
    admission = FakeAdmission(
        tokens={"tok-a": "team-a", "tok-b": "team-b"}, jobs={odd: "team-a", "b": "team-b"}
    )
    tokens = tokens_of(admission, clock)
    await tokens.require_job(request("tok-a"), odd)
    assert await refused(tokens.require_job(request("tok-b"), odd)) == 404
    assert await refused(tokens.require_job(request("tok-a"), "b")) == 404


async def test_without_a_token_or_admission(clock: list[float]) -> None:
    assert await refused(TenantTokens("http://admission").scope(request(None))) == 401
    assert await refused(TenantTokens(None).scope(request("tok-a"))) == 403
    assert await TenantTokens(None, "disabled").scope(request(None), "team-a") == Scope("team-a")


async def test_an_empty_tenant_is_no_tenant(clock: list[float]) -> None:
    # `?namespace=` left empty: every tenant for an admin's token, never a tenant named '' (which
    # matched no row, and was remembered for the next request naming no tenant at all)
    admission = FakeAdmission(tokens={"issued-admin": None}, jobs={"j": "team-a"})
    tokens = tokens_of(admission, clock)
    assert await tokens.scope(request("issued-admin"), "") == Scope(None)
    assert await tokens.scope(request("issued-admin")) == Scope(None)
    assert await tokens.scope(request("root"), "") == Scope(None)
    assert await TenantTokens(None, "disabled").scope(request(None), "") == Scope(None)
