"""An event admission can never publish does not wedge its outbox: it moves to
`admission.outbox_dead_letters` with the reason, and the jobs submitted after it are announced, each
exactly once, on a connection that stays up."""

from __future__ import annotations

from collections import Counter

import pytest

from tessera.contracts import subjects
from tessera.contracts.base import FieldError
from tessera.contracts.events import JobRejected
from tessera.testing.builders import a_job
from tessera.testing.services import eventually, read_stream

from .conftest import Api

pytestmark = pytest.mark.integration


def just_under_the_limit(limit: int) -> JobRejected:
    """An event whose body passes nats.py's own size check (the body alone) while its headers take it
    over the server's limit: sent as is, the server would close the connection."""
    event = JobRejected(job_id="too-big", errors=[FieldError(field="spec", reason="")])
    room = limit - 100 - len(event.model_dump_json())
    return JobRejected(job_id="too-big", errors=[FieldError(field="spec", reason="r" * room)])


async def test_an_event_that_cannot_be_published_holds_up_no_later_job(api: Api) -> None:
    limit = api.ctx.nc.max_payload
    async with api.ctx.uow() as uow:
        await uow.publish(just_under_the_limit(limit))
        await uow.commit()
    job_ids: set[str] = set()
    for i in range(5):
        response = await api.client.post("/v1/jobs", json=a_job(f"later-{i}").as_dict())
        assert response.status_code == 201, response.text
        job_ids.add(response.json()["id"])

    async def announced() -> Counter[str] | None:
        stored = await read_stream(api.ctx.js, subjects.JOB_ACCEPTED, idle_s=0.2)
        counts = Counter(e.subject for e in stored)
        return counts if set(counts) >= set(job_ids) else None

    counts = await eventually(announced, timeout=30, what="every later job announced")
    assert all(counts[job_id] == 1 for job_id in job_ids), counts

    reason = await eventually(
        lambda: api.scalar(
            "SELECT max(reason) FROM admission.outbox_dead_letters WHERE headers->>'ce-subject' = 'too-big'"
        ),
        timeout=20,
        what="the event in the outbox dead-letter table",
    )
    assert "over the limit" in reason
    assert await api.scalar("SELECT count(*) FROM admission.outbox") == 0
    assert not [e for e in await read_stream(api.ctx.js, subjects.JOB_REJECTED) if e.subject == "too-big"]
    assert api.ctx.nc.is_connected
    assert (await api.client.get("/healthz")).status_code == 200
