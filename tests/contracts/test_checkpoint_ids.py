"""A checkpoint has one id in every service that lists it (the checkpoint service and admission)."""

from __future__ import annotations

from tessera.checkpoint.domain.model import checkpoint_id as checkpoint_service_id
from tessera.contracts.events import checkpoint_id


def test_the_published_checkpoint_id_is_the_checkpoint_services_own() -> None:
    for job, uri in [("job-1", "file:///ckpt/job-1/step-7-ab"), ("a.b", "s3://bucket/a.b/step-0-x")]:
        assert checkpoint_id(job, uri) == checkpoint_service_id(job, uri)
    assert checkpoint_id("job-1", "file:///a") != checkpoint_id("job-2", "file:///a")
