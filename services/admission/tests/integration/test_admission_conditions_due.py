"""Which jobs' conditions are due to be written, on real Postgres: a job whose record changed since
its conditions were written is due again even when the change carries an earlier time than the
record written (a cycle's clock may be read before the job was queued). Without it, a gated pod
kept the `Pending` condition and never said why it waited."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tessera.admission.adapters import orm
from tessera.admission.adapters.config_repository import ConfigRepository
from tessera.admission.domain.documents import QueueingDocument
from tessera.admission.domain.workload_sync import Applied
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import submit_job
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.core.db.engine import make_engine, make_session_factory

pytestmark = pytest.mark.integration

ONE_GPU = {
    "flavors": [{"name": "a100-80gb"}],
    "queues": [{"name": "team", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 1}}]}],
    "tenant_queues": [{"tenant": "t", "queue": "team"}],
}


def job(i: int) -> dict[str, object]:
    return {"name": f"j{i}", "tenant": "t", "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}}]}


async def test_a_wait_reason_stamped_before_the_reported_record_is_still_due(
    admission_db: tuple[str, str],
) -> None:
    _, url = admission_db
    engine = make_engine(url, pool_size=2)
    sessions = make_session_factory(engine)

    def uow() -> AdmissionUnitOfWork:
        return AdmissionUnitOfWork(sessions, orm.outbox, orm.inbox, "test")

    try:
        async with uow() as work:
            repo = ConfigRepository(work.session)
            before = await repo.load()
            await repo.save(before, before.merged(QueueingDocument.model_validate(ONE_GPU)))
            await work.commit()
        for i in range(2):
            async with uow() as work:
                assert (await submit_job(job(i), work, f"job-{i}")).state == "queued"
                await work.workloads.record(
                    f"job-{i}", "t", [("Pod", f"p{i}")], Applied.SUSPENDED, datetime.now(UTC)
                )
                await work.commit()

        async with uow() as work:
            due = {item.job_id: item for item in await work.workloads.conditions_due()}
        assert set(due) == {"job-0", "job-1"}
        queued_at = due["job-1"].updated_at
        for item in due.values():
            async with uow() as work:
                await work.workloads.mark_reported(item.job_id, item.updated_at)
                await work.commit()
        async with uow() as work:
            assert await work.workloads.conditions_due() == []

        # a cycle whose clock was read before the jobs were queued: job-0 is admitted, job-1 waits
        async with uow() as work:
            report = await run_cycle(work, now=queued_at - timedelta(seconds=1))
        assert report.admitted == ["job-0"]

        async with uow() as work:
            due = {item.job_id: item for item in await work.workloads.conditions_due()}
        assert set(due) == {"job-0", "job-1"}
        assert due["job-1"].view.waiting is not None
        assert due["job-1"].updated_at < queued_at
    finally:
        await engine.dispose()
