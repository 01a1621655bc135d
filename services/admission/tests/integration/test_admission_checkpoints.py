"""Through the service, on real Postgres and NATS: admission learns a job's checkpoints from the
checkpoint service's `checkpoint_saved`, lists them with the job, and a preempted job queues again and
is admitted resuming from its newest checkpoint (`job_admitted.resume_from`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from tessera.admission.adapters import orm
from tessera.admission.adapters.checkpoints import CheckpointRepository
from tessera.admission.domain.model import JobCheckpoint
from tessera.contracts import subjects
from tessera.contracts.events import CheckpointSaved, JobAdmitted, checkpoint_id
from tessera.core.db.engine import async_url
from tessera.core.messaging.envelope import encode
from tessera.core.messaging.streams import StreamLimits, ensure_stream
from tessera.testing.services import eventually, read_stream

from .conftest import Api

pytestmark = pytest.mark.integration

ONE_JOB_QUEUE = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 1}}]}],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}],
    "preemption_timing": {"checkpoint_grace_s": 60, "default_grace_s": 30, "release_timeout_s": 60},
}
T0 = datetime.now(UTC).replace(microsecond=0)


def job(name: str, priority: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "team",
        "priority": priority,
        "checkpointable": True,
        "pod_groups": [{"name": "worker", "replicas": 1, "gpu": {"count": 1}}],
    }


async def submit(api: Api, job_id: str, priority: int = 0) -> None:
    response = await api.client.post(
        "/v1/jobs", json=job(job_id, priority), headers={"Idempotency-Key": job_id}
    )
    assert response.status_code == 201, response.text


async def shown(api: Api, job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await api.client.get(f"/v1/jobs/{job_id}")).json()
    return found


async def state_is(api: Api, job_id: str, state: str) -> bool:
    return (await shown(api, job_id))["state"] == state


async def announce(api: Api, event: CheckpointSaved) -> None:
    subject, headers, body = encode(event, "tessera/checkpoint")
    await api.ctx.js.publish(subject, body, headers=headers)


def saved(step: int, at: datetime, request_id: str | None = None) -> CheckpointSaved:
    uri = f"file:///ckpt/low/step-{step}-{request_id or 'periodic'}"
    return CheckpointSaved(job_id="low", request_id=request_id, step=step, uri=uri, size_bytes=4096, at=at)


async def test_the_migrations_build_the_checkpoint_table_the_repository_uses(api: Api) -> None:
    def diff(connection: Any) -> list[Any]:
        context = MigrationContext.configure(
            connection,
            opts={
                "include_schemas": True,
                "include_name": lambda name, kind, parent: kind != "table" or name == "job_checkpoints",
            },
        )
        return [d for d in compare_metadata(context, orm.metadata) if "job_checkpoints" in repr(d)]

    engine = create_async_engine(async_url(api.db))
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await engine.dispose()


async def test_a_preempted_job_resumes_from_the_newest_checkpoint_the_checkpoint_service_announced(
    api: Api,
) -> None:
    await ensure_stream(api.ctx.js, "checkpoint", StreamLimits())
    assert (await api.client.put("/v1/config", json=ONE_JOB_QUEUE)).status_code == 200
    await submit(api, "low")
    await eventually(lambda: state_is(api, "low", "admitted"), what="the low-priority job admitted")

    first, second = saved(40, T0), saved(90, T0 + timedelta(minutes=5))
    for event in (second, first, second.model_copy()):  # out of order, and the second one twice
        await announce(api, event)

    async def both_listed() -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = (await shown(api, "low"))["checkpoints"]
        return listed if len(listed) == 2 else []

    listed = await eventually(both_listed, what="both checkpoints listed with the job")
    assert [{**c, "at": datetime.fromisoformat(c["at"])} for c in listed] == [
        {"id": checkpoint_id("low", e.uri), "step": e.step, "bytes": 4096, "uri": e.uri, "at": e.at}
        for e in (second, first)
    ], "newest first, each once, as the checkpoint service lists them"
    reasons = [h["reason"] for h in (await shown(api, "low"))["history"]]
    assert [r for r in reasons if r.startswith("checkpoint")] == [
        f"checkpoint saved at step 90 ({second.uri})",
        f"checkpoint saved at step 40 ({first.uri})",
    ]
    (in_list,) = [j for j in (await api.client.get("/v1/jobs", params={"tenant": "team"})).json()]
    assert [c["step"] for c in in_list["checkpoints"]] == [90, 40]

    # A higher-priority job takes the quota: low is asked to leave, saves on request, is released.
    await submit(api, "high", priority=100)

    async def asked() -> bool:
        return any(
            "preemption requested by high" in h["reason"] for h in (await shown(api, "low"))["history"]
        )

    await eventually(asked, what="low asked to give its quota to high")
    on_request = saved(120, T0 + timedelta(minutes=6), request_id="req-1")
    await announce(api, on_request)
    await eventually(
        lambda: _has_checkpoint(api, "low", 120), what="the requested checkpoint recorded before the release"
    )
    released = await api.client.post(
        "/v1/jobs/low/outcome",
        json={"state": "preempted", "reason": "1 pods evicted for high after checkpoint_saved at step 120"},
    )
    assert released.status_code == 200, released.text
    await eventually(lambda: state_is(api, "high", "admitted"), what="high admitted")
    assert (await shown(api, "low"))["state"] == "queued"

    assert (await api.client.post("/v1/jobs/high/cancel")).status_code == 200
    await eventually(lambda: state_is(api, "low", "admitted"), what="low admitted again")

    steps = [(h["state"], h["reason"]) for h in (await shown(api, "low"))["history"]]
    states = [state for state, _ in steps]
    saved_at = steps.index(("admitted", f"checkpoint saved at step 120 ({on_request.uri})"))
    released_at = states.index("preempted")
    assert saved_at < released_at and "checkpoint_saved at step 120" in steps[released_at][1]
    assert steps[released_at + 1] == ("queued", "requeued after preemption")
    assert steps[-1] == (
        "admitted",
        f"admitted to queue team-q in flavor a100; resumes from the checkpoint at step 120 ({on_request.uri})",
    )

    async def admissions() -> list[JobAdmitted]:
        found = [e.parse() for e in await read_stream(api.ctx.js, subjects.JOB_ADMITTED)]
        out = [e for e in found if isinstance(e, JobAdmitted) and e.job_id == "low"]
        return out if len(out) == 2 else []

    first_admission, again = await eventually(admissions, what="low's two job_admitted")
    assert (first_admission.resume_from, again.resume_from) == (None, on_request.uri)


async def _has_checkpoint(api: Api, job_id: str, step: int) -> bool:
    return any(c["step"] == step for c in (await shown(api, job_id))["checkpoints"])


async def test_the_repository_lists_each_job_s_newest_checkpoints_and_their_times_in_bulk(api: Api) -> None:
    for job_id in ("a", "b", "c"):
        response = await api.client.post(
            "/v1/jobs", json={**job(job_id), "tenant": "anyone"}, headers={"Idempotency-Key": job_id}
        )
        assert response.status_code == 201, response.text
    engine = create_async_engine(async_url(api.db))
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    try:
        async with sessions() as session, session.begin():
            repo = CheckpointRepository(session)
            for job_id, steps in (("a", (1, 2, 3)), ("b", (7,))):
                for step in steps:
                    at = T0 + timedelta(seconds=step)
                    new = JobCheckpoint(f"{job_id}-{step}", step, step * 10, f"file:///{job_id}/{step}", at)
                    assert await repo.add(job_id, new, None)
            assert not await repo.add("a", JobCheckpoint("a-1", 1, 10, "file:///a/1", T0), None)
        async with sessions() as session, session.begin():
            repo = CheckpointRepository(session)
            listed = await repo.of_jobs(["a", "b", "c"], limit=2)
            times = await repo.latest_times(["a", "b", "c"])
    finally:
        await engine.dispose()

    assert {j: [c.step for c in cs] for j, cs in listed.items()} == {"a": [3, 2], "b": [7]}
    assert times == {"a": T0 + timedelta(seconds=3), "b": T0 + timedelta(seconds=7)}
