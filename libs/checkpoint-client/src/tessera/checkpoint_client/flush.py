"""The flush thread's work: write one snapshot's staging to storage, and what it reports to the service."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.checkpoint_client.durable import TensorRecord, cleanup_torn, job_dir, prune, write_checkpoint
from tessera.checkpoint_client.format import dir_name
from tessera.checkpoint_client.results import CheckpointResult, SaveRequest, StorageUnavailable
from tessera.checkpoint_client.staging import Staging, StagingPool
from tessera.checkpoint_client.store import Store
from tessera.contracts.events import ReportCheckpoint

# The checkpointer's logger, as before this code had a module of its own.
log = logging.getLogger("tessera.checkpoint_client.checkpointer")


@dataclass
class Job:
    step: int
    checkpoint_id: str
    staging: Staging
    tensors: list[TensorRecord]
    objects: list[tuple[str, tuple[Any, ...], Any]]
    fences: list[Callable[[], None]]
    trigger: str
    requests: tuple[SaveRequest, ...]
    stall_s: float


def flush(
    job: Job,
    *,
    store: Store | None,
    store_error: str,
    pool: StagingPool,
    job_id: str,
    keep: int,
    chunk_bytes: int,
    metadata: dict[str, Any],
) -> CheckpointResult:
    """Write `job` (its staging goes back to `pool` either way) and prune old checkpoints; never raises."""
    started = time.perf_counter()
    directory = ""
    try:
        for fence in job.fences:
            fence()
        if store is None:
            raise StorageUnavailable(store_error)
        directory = store.join(job_dir(store, job_id), dir_name(job.step, job.checkpoint_id))
        written = write_checkpoint(
            store,
            job_id=job_id,
            step=job.step,
            checkpoint_id=job.checkpoint_id,
            arena=job.staging.used(),
            tensors=job.tensors,
            objects=job.objects,
            chunk_bytes=chunk_bytes,
            metadata={**metadata, "trigger": job.trigger},
        )
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        log.error("checkpoint of step %s failed: %s", job.step, reason)
        if directory and store is not None:
            cleanup_torn(store, directory)
        return CheckpointResult(
            ok=False,
            step=job.step,
            trigger=job.trigger,
            requests=job.requests,
            checkpoint_id=job.checkpoint_id,
            stall_s=job.stall_s,
            flush_s=time.perf_counter() - started,
            reason=reason,
        )
    finally:
        pool.release(job.staging)
    flush_s = time.perf_counter() - started
    try:
        prune(store, job_id, keep, written.path)
    except Exception as exc:  # the checkpoint is safe; old ones stay until the next prune
        log.warning("could not delete old checkpoints of %s: %s", job_id, exc)
    log.info("checkpoint of step %s saved to %s in %.2fs", job.step, written.uri, flush_s)
    return CheckpointResult(
        ok=True,
        step=job.step,
        trigger=job.trigger,
        requests=job.requests,
        uri=written.uri,
        checkpoint_id=job.checkpoint_id,
        size_bytes=written.total_bytes,
        stall_s=job.stall_s,
        flush_s=flush_s,
    )


def report(job_id: str, result: CheckpointResult, request: SaveRequest) -> ReportCheckpoint:
    """The report of `result` that answers `request`."""
    return ReportCheckpoint(
        job_id=job_id,
        request_id=request.request_id,
        outcome="saved" if result.ok else "failed",
        step=result.step,
        size_bytes=result.size_bytes,
        uri=result.uri,
        stall_s=result.stall_s,
        flush_s=result.flush_s,
        reason=result.reason if not result.ok else result.trigger,
        at=result.finished_at,
    )
