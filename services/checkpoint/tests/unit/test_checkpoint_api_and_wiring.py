"""The query route on in-memory repositories (a bearer token required, a tenant's seeing only its own
jobs, as a fake admission says), and the wiring: which consumers read what (never the save commands the
service sends), the retention rules, and the node watch only with a kubeconfig."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tessera.checkpoint import bootstrap
from tessera.checkpoint.adapters import orm
from tessera.checkpoint.adapters.nodes import KubeNodeWatch
from tessera.checkpoint.config import CheckpointSettings
from tessera.checkpoint.domain.model import Checkpoint, checkpoint_id
from tessera.checkpoint.entrypoints.api import router
from tessera.checkpoint.entrypoints.loops import time_out_requests, watch_nodes
from tessera.checkpoint.service_layer.dependencies import CheckpointDeps
from tessera.contracts import subjects
from tessera.core.db.retention import RetentionRule
from tessera.core.tenant_tokens import TenantTokens
from tessera.testing.fake_admission import FakeAdmission

ADMIN = {"Authorization": "Bearer root-token"}
TEAM_A = {"Authorization": "Bearer tok-a"}
TEAM_B = {"Authorization": "Bearer tok-b"}


@pytest.fixture
def admission(deps: CheckpointDeps) -> FakeAdmission:
    """Admission knowing two tenants' tokens and jobs `a` (team-a's) and `b` (team-b's); the service's
    admin token is configured, as the chart sets it."""
    fake = FakeAdmission(tokens={"tok-a": "team-a", "tok-b": "team-b"}, jobs={"a": "team-a", "b": "team-b"})
    deps.tokens = TenantTokens("http://admission", "required", "root-token", transport=fake.transport())
    return fake


@pytest.fixture
async def client(deps: CheckpointDeps, admission: FakeAdmission) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.include_router(router)
    app.state.deps = deps
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://checkpoint") as c:
        yield c


def saved(job_id: str, step: int, minute: int) -> Checkpoint:
    uri = f"file:///ckpt/{job_id}/step-{step}"
    at = datetime(2026, 11, 24, 9, minute, tzinfo=UTC)
    return Checkpoint(checkpoint_id(job_id, uri), job_id, step, uri, step * 100, at)


async def test_a_jobs_checkpoints_are_listed_newest_first(client: httpx.AsyncClient, uow: Any) -> None:
    for checkpoint in (saved("a", 10, 1), saved("a", 30, 3), saved("a", 20, 2), saved("b", 99, 9)):
        uow.stored.checkpoints[checkpoint.id] = checkpoint
    response = await client.get("/v1/jobs/a/checkpoints", headers=ADMIN)
    assert response.status_code == 200
    assert response.json() == [
        {
            "id": checkpoint_id("a", f"file:///ckpt/a/step-{step}"),
            "step": step,
            "bytes": step * 100,
            "uri": f"file:///ckpt/a/step-{step}",
            "at": f"2026-11-24T09:0{minute}:00Z",
        }
        for step, minute in ((30, 3), (20, 2), (10, 1))
    ]
    assert [
        c["step"] for c in (await client.get("/v1/jobs/a/checkpoints?limit=1", headers=ADMIN)).json()
    ] == [30]
    assert (await client.get("/v1/jobs/unknown/checkpoints", headers=ADMIN)).json() == []
    assert (await client.get("/v1/jobs/a/checkpoints?limit=0", headers=ADMIN)).status_code == 422


async def test_a_jobs_checkpoints_need_a_token_that_may_see_the_job(
    client: httpx.AsyncClient, uow: Any, admission: FakeAdmission
) -> None:
    for checkpoint in (saved("a", 10, 1), saved("b", 99, 9)):
        uow.stored.checkpoints[checkpoint.id] = checkpoint
    for headers in ({}, {"Authorization": "Basic x"}, {"Authorization": "Bearer made-up"}):
        refused = await client.get("/v1/jobs/a/checkpoints", headers=headers)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"

    async def steps(job: str, headers: dict[str, str]) -> tuple[int, list[int]]:
        response = await client.get(f"/v1/jobs/{job}/checkpoints", headers=headers)
        return response.status_code, [
            c["step"] for c in response.json()
        ] if response.status_code == 200 else []

    assert await steps("a", TEAM_A) == (200, [10])
    assert await steps("b", TEAM_B) == (200, [99])
    # another tenant's job is answered as an unknown one: 404, never 403
    assert await steps("b", TEAM_A) == (404, [])
    assert await steps("a", TEAM_B) == (404, [])
    assert await steps("unknown", TEAM_A) == (404, [])
    # the admin reads every job's, the configured token without asking admission
    asked = admission.asked
    assert await steps("a", ADMIN) == (200, [10]) and await steps("b", ADMIN) == (200, [99])
    assert admission.asked == asked
    # an admin token admission issued (as `tessera up` stores the admin's) reads every job's too
    admission.tokens["issued-admin"] = None
    assert await steps("b", {"Authorization": "Bearer issued-admin"}) == (200, [99])
    # a grant is remembered: the same question does not reach admission again
    asked = admission.asked
    assert await steps("a", TEAM_A) == (200, [10])
    assert admission.asked == asked


async def test_without_an_admission_url_only_the_admin_token_reads(
    client: httpx.AsyncClient, deps: CheckpointDeps
) -> None:
    deps.tokens = TenantTokens(None, "required", "root-token")
    assert (await client.get("/v1/jobs/a/checkpoints", headers=ADMIN)).status_code == 200
    assert (await client.get("/v1/jobs/a/checkpoints", headers=TEAM_A)).status_code == 403
    assert (await client.get("/v1/jobs/a/checkpoints")).status_code == 401


async def test_with_auth_disabled_every_caller_reads_every_jobs(
    client: httpx.AsyncClient, deps: CheckpointDeps
) -> None:
    deps.tokens = TenantTokens(None, "disabled")
    assert (await client.get("/v1/jobs/b/checkpoints")).status_code == 200


def test_the_openapi_document_says_the_route_needs_a_token() -> None:
    app = FastAPI()
    app.include_router(router)
    responses = app.openapi()["paths"]["/v1/jobs/{job_id}/checkpoints"]["get"]["responses"]
    assert {"200", "401", "404"} <= set(responses)


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a trailing `>` one or more."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


def test_the_consumers_read_reports_admission_and_the_scheduler_but_never_the_save_commands(
    deps: CheckpointDeps,
) -> None:
    specs = {spec.name: (spec.stream_owner, spec.filter_subject) for spec in bootstrap.consumers(deps)}
    assert specs == {
        "checkpoint-reports": ("checkpoint", subjects.REPORT_CHECKPOINT),
        "checkpoint-preemptions": ("admission", subjects.PREEMPTION_REQUESTED),
        "checkpoint-admitted": ("admission", subjects.JOB_ADMITTED),
        "checkpoint-jobs-finished": ("admission", subjects.JOB_FINISHED),
        "checkpoint-placements": ("scheduler", subjects.GANG_PLACED),
        "checkpoint-gangs-finished": ("scheduler", subjects.GANG_FINISHED),
    }
    save = subjects.save_checkpoint("job.with.dots")
    assert matches(subjects.stream_subjects("checkpoint"), save), "the service's own stream keeps them"
    assert not any(matches(subject, save) for _, subject in specs.values())
    assert matches(subjects.command("checkpoint", "*"), subjects.REPORT_CHECKPOINT)
    assert not matches(subjects.command("checkpoint", "*"), save)


def test_what_it_stores_is_kept_for_its_retention() -> None:
    settings = CheckpointSettings(history_retention_h=24, checkpoints_retention_h=48)
    assert bootstrap.build(settings).retention == [
        RetentionRule(orm.checkpoint_requests, "updated_at", 24 * 3600),
        RetentionRule(orm.jobs, "finished_at", 24 * 3600),
        RetentionRule(orm.checkpoints, "saved_at", 48 * 3600),
    ]


@pytest.mark.parametrize("env", [None, "TESSERA_KUBECONFIG", "TESSERA_CHECKPOINT_KUBECONFIG"])
async def test_nodes_are_watched_only_with_a_kubeconfig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: str | None
) -> None:
    for name in ("TESSERA_KUBECONFIG", "TESSERA_CHECKPOINT_KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    if env is not None:
        monkeypatch.setenv(env, str(tmp_path / "kubeconfig"))
    definition = bootstrap.build(CheckpointSettings())
    ctx: Any = type("Ctx", (), {"uow": None, "stop": None})()
    deps = await definition.dependencies(ctx)
    if env is None:  # a background task that ends would make the service unready
        assert deps.nodes is None and definition.background == [time_out_requests]
    else:
        assert isinstance(deps.nodes, KubeNodeWatch) and deps.nodes.kubeconfig == tmp_path / "kubeconfig"
        assert definition.background == [time_out_requests, watch_nodes]
