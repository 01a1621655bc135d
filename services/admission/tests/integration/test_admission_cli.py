"""The `tessera queues` and `tessera jobs cancel` commands against the real admission app (Postgres
and NATS behind it); `tessera tokens` is in test_admission_cli_tokens."""

from __future__ import annotations

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
from tessera.cli import jobs, queues
from tessera.cli.main import app
from tessera.core.runner import create_app
from tessera.testing.services import settings_for

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "queues" / "queues.yaml"
JOBS = Path(__file__).resolve().parents[4] / "examples" / "jobs"


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


def test_apply_status_and_cancel(cli: TestClient) -> None:
    runner = CliRunner()
    applied = runner.invoke(app, ["queues", "apply", str(EXAMPLE)])
    assert applied.exit_code == 0, applied.output
    assert "3 queues" in applied.output and "4 tenant queues" in applied.output

    submitted = runner.invoke(app, ["jobs", "submit", str(JOBS / "ddp-2x4.yaml")])
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.output.strip()

    deadline = time.monotonic() + 20
    while cli.get("/v1/queues/team-a/status").json()["admitted"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = runner.invoke(app, ["queues", "status", "team-a"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if "team-a" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    # the DDP example (2 x 4 A100s) is admitted into team-a: 8 GPUs in use, none borrowed
    assert cells == ["team-a", "research", "a100-80gb", "gpu", "8", "8", "0", "0", "0", "1"]

    every = runner.invoke(app, ["queues", "status"], env={"COLUMNS": "200"})
    assert all(name in every.output for name in ("team-a", "team-b", "inference"))

    cancelled = runner.invoke(app, ["jobs", "cancel", job_id])
    assert cancelled.exit_code == 0 and f"cancelled {job_id}" in cancelled.output
    again = runner.invoke(app, ["jobs", "cancel", job_id])
    assert again.exit_code == 1
    assert "cannot be cancelled (field state)" in " ".join(again.output.split())


def test_a_bad_file_changes_nothing_and_names_the_field(cli: TestClient, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues:\n  - name: q\n    quotas: [{flavor: nope, resources: {gpu: 1}}]\n")
    result = CliRunner().invoke(app, ["queues", "apply", str(bad)])
    assert result.exit_code == 1
    output = " ".join(result.output.split())
    assert "unknown flavor 'nope'" in output and "queues.q.flavors.nope" in output
    assert cli.get("/v1/queues").json() == []
