"""The query route on in-memory repositories, and the wiring: which consumers read what (never the
save commands the service sends), the retention rules, and the node watch only with a kubeconfig."""

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


@pytest.fixture
async def client(deps: CheckpointDeps) -> AsyncIterator[httpx.AsyncClient]:
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
    response = await client.get("/v1/jobs/a/checkpoints")
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
    assert [c["step"] for c in (await client.get("/v1/jobs/a/checkpoints?limit=1")).json()] == [30]
    assert (await client.get("/v1/jobs/unknown/checkpoints")).json() == []
    assert (await client.get("/v1/jobs/a/checkpoints?limit=0")).status_code == 422


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
