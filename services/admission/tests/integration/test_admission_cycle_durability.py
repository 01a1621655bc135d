"""The cycle on real Postgres: two cycles racing on one database never hand out the same quota
twice, and a process killed in the middle of a cycle loses no job and admits none twice."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import nats
import pytest
from sqlalchemy import text

from tessera.admission.adapters import orm
from tessera.admission.adapters.config_repository import ConfigRepository
from tessera.admission.domain.documents import QueueingDocument
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import submit_job
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.contracts import subjects
from tessera.core.db.engine import make_engine, make_session_factory
from tessera.testing.services import ServiceProcess, eventually, read_stream

pytestmark = pytest.mark.integration


async def scalar(url: str, query: str) -> Any:
    engine = make_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(query))).scalar_one()
    finally:
        await engine.dispose()


TEN_GPUS = {
    "flavors": [{"name": "a100-80gb"}],
    "queues": [{"name": "team", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 10}}]}],
    "tenant_queues": [{"tenant": "t", "queue": "team"}],
}


def one_gpu_job(i: int) -> dict[str, Any]:
    return {"name": f"j{i}", "tenant": "t", "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}}]}


class Database:
    def __init__(self, url: str) -> None:
        self.engine = make_engine(url, pool_size=4)
        self.sessions = make_session_factory(self.engine)

    def uow(self) -> AdmissionUnitOfWork:
        return AdmissionUnitOfWork(self.sessions, orm.outbox, orm.inbox, "test")


async def seed(db: Database, jobs: int) -> None:
    async with db.uow() as uow:
        repo = ConfigRepository(uow.session)
        before = await repo.load()
        await repo.save(before, before.merged(QueueingDocument.model_validate(TEN_GPUS)))
        await uow.commit()
    for i in range(jobs):
        async with db.uow() as uow:
            result = await submit_job(one_gpu_job(i), uow, f"job-{i:02d}")
            assert result.state == "queued", result.errors
            await uow.commit()


async def test_two_replicas_racing_never_admit_the_same_quota_twice(admission_db: tuple[str, str]) -> None:
    _, url = admission_db
    first, second = Database(url), Database(url)
    try:
        await seed(first, 30)

        second_started = asyncio.Event()

        async def hold_the_first_cycle_open() -> None:
            # The second cycle starts while the first has read its view and not committed yet:
            # without the cycle lock it would read the same 30 queued jobs and admit 10 again.
            await asyncio.wait_for(second_started.wait(), timeout=5)
            await asyncio.sleep(0.5)

        async def cycle(db: Database, hook: Any = None) -> list[str]:
            async with db.uow() as uow:
                return (await run_cycle(uow, after_load=hook)).admitted

        async def second_cycle() -> list[str]:
            await asyncio.sleep(0.05)
            second_started.set()
            return await cycle(second)

        a, b = await asyncio.gather(cycle(first, hold_the_first_cycle_open), second_cycle())
    finally:
        await first.engine.dispose()
        await second.engine.dispose()
    assert len(a) + len(b) == 10, "the quota is 10 GPUs; the second cycle saw the first one's admissions"
    assert not set(a) & set(b)
    assert await scalar(url, "SELECT count(*) FROM admission.jobs WHERE state = 'admitted'") == 10
    assert (
        await scalar(url, f"SELECT count(*) FROM admission.outbox WHERE subject = '{subjects.JOB_ADMITTED}'")
        == 10
    )
    twice = "SELECT count(*) FROM (SELECT job_id FROM admission.job_transitions WHERE state = 'admitted' "
    assert await scalar(url, twice + "GROUP BY job_id HAVING count(*) > 1) AS t") == 0


async def test_a_crash_in_the_middle_of_a_cycle_loses_nothing_and_doubles_nothing(
    admission_db: tuple[str, str], tmp_path: Path
) -> None:
    nats_url, url = admission_db
    db = Database(url)
    try:
        await seed(db, 12)
    finally:
        await db.engine.dispose()
    proc = ServiceProcess(
        "admission",
        {
            "TESSERA_NATS_URL": nats_url,
            "TESSERA_DATABASE_URL": url,
            "TESSERA_ADMISSION_OUTBOX_POLL_S": "0.05",
        },
        tmp_path,
    )
    try:
        proc.start({"TESSERA_FAULTS": "admission.cycle.before_commit"})
        assert await proc.wait_exit() == -signal.SIGKILL
        assert await scalar(url, "SELECT count(*) FROM admission.jobs WHERE state = 'queued'") == 12
        assert (
            await scalar(url, "SELECT count(*) FROM admission.job_transitions WHERE state = 'admitted'") == 0
        )

        proc.start()
        await proc.wait_ready()

        async def settled() -> bool:
            admitted = await scalar(url, "SELECT count(*) FROM admission.jobs WHERE state = 'admitted'")
            return bool(admitted == 10 and await scalar(url, "SELECT count(*) FROM admission.outbox") == 0)

        await eventually(settled, what="10 jobs admitted and announced after the restart")
    finally:
        proc.stop()
    assert await scalar(url, "SELECT count(*) FROM admission.jobs WHERE state = 'queued'") == 2
    assert await scalar(url, "SELECT count(*) FROM admission.job_transitions WHERE state = 'admitted'") == 10
    nc = await nats.connect(nats_url)
    try:
        announced = [e.subject for e in await read_stream(nc.jetstream(), subjects.JOB_ADMITTED)]
    finally:
        await nc.close()
    assert len(announced) == len(set(announced)) == 10
