"""`tessera jobs explain` against the real admission app (Postgres and NATS behind it): a job waiting
for quota, the one holding it, the scheduler's report about it, and an id nobody knows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from tessera.admission.bootstrap import build
from tessera.admission.config import AdmissionSettings
from tessera.admission.service_layer.handlers import handle_scheduler_event
from tessera.cli import jobs, queues
from tessera.cli.main import app
from tessera.contracts.events import GangUnschedulable
from tessera.core.runner import create_app
from tessera.testing.builders import an_envelope
from tessera.testing.services import settings_for

pytestmark = pytest.mark.integration

CONFIG = """
flavors: [{name: a100, gpu_model: A100-80GB}]
queues: [{name: team-q, quotas: [{flavor: a100, resources: {gpu: 4}}]}]
tenant_queues: [{tenant: team, queue: team-q}]
"""
JOB = """
name: {name}
tenant: team
pod_groups: [{{name: worker, replicas: 1, cpu: "2", memory: 8Gi, gpu: {{count: 4}}}}]
"""
WIDE = {"COLUMNS": "200", "NO_COLOR": "1"}


@pytest.fixture
def cli(admission_db: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings = settings_for(AdmissionSettings, *admission_db, cycle_interval_s=0.05, auth="disabled")
    with TestClient(create_app(build(settings), settings), base_url="http://admission") as client:

        @contextmanager
        def shared(api: str | None, handled: frozenset[int] = frozenset()) -> Iterator[Any]:
            yield client

        for module in (jobs, queues):
            monkeypatch.setattr(module, "_client", shared)
        yield client


def submit(runner: CliRunner, tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.format(name=name))
    result = runner.invoke(app, ["jobs", "submit", str(path)])
    assert result.exit_code == 0, result.output
    return result.output.strip()


def explained(runner: CliRunner, job_id: str) -> dict[str, Any]:
    result = runner.invoke(app, ["jobs", "explain", job_id, "--json"], env=WIDE)
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.output)
    return found


def until(probe: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_explain_tells_why_a_job_waits_and_where_its_quota_went(cli: TestClient, tmp_path: Path) -> None:
    runner = CliRunner()
    config = tmp_path / "queues.yaml"
    config.write_text(CONFIG)
    assert runner.invoke(app, ["queues", "apply", str(config)]).exit_code == 0
    holder = submit(runner, tmp_path, "holder")
    until(lambda: explained(runner, holder)["admission"]["decision"] == "admitted", "the holder's admission")
    waiter = submit(runner, tmp_path, "waiter")
    until(lambda: explained(runner, waiter)["admission"]["decision"] == "waiting", "the waiter's wait")

    waiting = explained(runner, waiter)
    assert waiting["job"]["state"] == "queued" and waiting["waiting"] is True
    assert [step["kind"] for step in waiting["story"]] == ["submitted", "queued", "waiting"]
    wait = waiting["story"][-1]
    why = "queue team-q: needs 4 A100-80GB GPUs, 0 free in quota, no cohort to borrow from; no preemptible victims"
    assert (wait["code"], wait["message"]) == ("QuotaExhausted", why)
    assert waiting["admission"]["reason"] == f"QuotaExhausted: {why}"
    assert waiting["scheduler"] is None
    assert "team-q has no unused quota" in waiting["hint"]

    shown = runner.invoke(app, ["jobs", "explain", waiter], env=WIDE)
    assert shown.exit_code == 0, shown.output
    text = shown.output
    assert f"waiter ({waiter})" in text and "tenant team, queue team-q" in text
    assert "waiting" in text and "QuotaExhausted: queue team-q: needs 4 A100-80GB GPUs" in " ".join(
        text.split()
    )
    assert "admission  waiting: QuotaExhausted" in text
    assert "why it waits: its queue team-q has no unused quota" in text

    holding = explained(runner, holder)
    assert [step["kind"] for step in holding["story"]] == ["submitted", "queued", "admitted"]
    assert holding["admission"] == {
        "decision": "admitted",
        "reason": "admitted to queue team-q in flavor a100",
        "at": holding["story"][-1]["at"],
    }
    assert holding["scheduler"] == {"decision": "pending", "reason": "not placed yet", "at": None}

    # the scheduler says it cannot place the holder: admission records it, explain tells it
    report = GangUnschedulable(job_id=holder, message="insufficient GPU on 4 nodes", rejected_nodes={})

    async def unschedulable() -> None:
        deps = cli.app.state.deps  # type: ignore[attr-defined]
        async with deps.uow() as uow:
            await handle_scheduler_event(an_envelope(report), uow)
            await uow.commit()

    assert cli.portal is not None
    cli.portal.call(unschedulable)
    holding = explained(runner, holder)
    assert holding["scheduler"]["decision"] == "unschedulable"
    assert holding["scheduler"]["reason"] == "insufficient GPU on 4 nodes"
    assert holding["story"][-1]["kind"] == "unschedulable" and holding["waiting"] is True
    assert "scheduler found no room" in holding["hint"]
    shown = runner.invoke(app, ["jobs", "explain", holder], env=WIDE)
    assert "scheduler  unschedulable: insufficient GPU on 4 nodes" in shown.output


def test_explaining_an_unknown_job_says_so_and_fails(cli: TestClient) -> None:
    for args in (["jobs", "explain", "job-nobody"], ["jobs", "explain", "job-nobody", "--json"]):
        result = CliRunner().invoke(app, args, env=WIDE)
        assert result.exit_code == 1
        assert "no job with id job-nobody" in result.output
