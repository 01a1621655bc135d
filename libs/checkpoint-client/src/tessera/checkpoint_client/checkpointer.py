"""`Checkpointer`: what a training loop calls at each safe point.

    ckpt = Checkpointer("job-42", "file:///ckpt", nats_url=os.environ.get("TESSERA_NATS_URL"))
    start = ckpt.restore(state)                # the step saved last, 0 on a fresh start
    for step in range(start, total):
        train_one_step()
        ckpt.step(step + 1, state)             # a flag check unless a checkpoint is due
    ckpt.close()                               # waits for the last flush

A checkpoint is due when the checkpoint service asked for one over NATS (or `request()` was called, say
from a SIGTERM handler), or `interval_s` passed since the last one. Then `step` copies the state into
staging (the stall) and returns; a flush thread writes the staging to storage and reports the outcome.

While a flush runs, its staging is busy. With one staging buffer (the default) `step` does not block: the
due checkpoint is deferred to the first `step` after the flush ends, so the state saved is the newest one
and the loop never waits on the disk; `save()` (an explicit checkpoint) waits for the staging instead.
`buffers=2` lets a snapshot proceed during a flush at twice the staging memory; flushes still run one at
a time, in order.

A flush that fails (disk full, permission denied, storage gone) never raises into the training loop: the
result says why (`last_result`, `results`, `on_result`), the partial directory is removed when possible,
and the next checkpoint starts afresh.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import queue
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from tessera.checkpoint_client.durable import TensorRecord, read_arena
from tessera.checkpoint_client.flush import Job as _Job
from tessera.checkpoint_client.flush import flush, report
from tessera.checkpoint_client.format import DEFAULT_CHUNK_BYTES, Manifest
from tessera.checkpoint_client.restore import (
    check_state,
    copy_into,
    latest_uri,
    load,
    locate,
    staging_matching,
)
from tessera.checkpoint_client.results import CheckpointResult, SaveRequest, State, StorageUnavailable
from tessera.checkpoint_client.staging import Staging, StagingPool
from tessera.checkpoint_client.store import Store, open_store
from tessera.checkpoint_client.tree import Flat, LeafAdapter, NumpyAdapter, flatten
from tessera.contracts.events import ReportCheckpoint, SaveCheckpoint

__all__ = [
    "ENV_URI",
    "CheckpointResult",
    "Checkpointer",
    "SaveRequest",
    "State",
    "StorageUnavailable",
    "check_state",
    "latest_uri",
    "load",
    "new_checkpoint_id",
]

log = logging.getLogger(__name__)

ENV_URI = "TESSERA_CHECKPOINT_URI"


class Checkpointer:
    def __init__(
        self,
        job_id: str,
        storage_url: str,
        nats_url: str | None = None,
        *,
        interval_s: float | None = 1800.0,
        keep: int = 3,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        buffers: int = 1,
        adapters: Sequence[LeafAdapter] = (),
        on_result: Callable[[CheckpointResult], None] | None = None,
        storage_options: dict[str, Any] | None = None,
        rename_data: bool = True,
        metadata: dict[str, Any] | None = None,
        source: str | None = None,
        history: int = 32,
    ) -> None:
        if chunk_bytes < 1 or keep < 1:
            raise ValueError("chunk_bytes and keep must be positive")
        if not job_id:
            raise ValueError("job_id must not be empty")
        self.job_id = job_id
        self.storage_url = storage_url
        self.storage_options = dict(storage_options or {})
        self.interval_s = interval_s
        self.keep = keep
        self.chunk_bytes = chunk_bytes
        self.metadata = dict(metadata or {})
        self.on_result = on_result
        self.adapters: list[LeafAdapter] = [*adapters, NumpyAdapter()]
        self.pool = StagingPool(buffers)
        self.deferred = 0  # due checkpoints put off because the staging was still being flushed
        self.results: deque[CheckpointResult] = deque(maxlen=history)
        self._store: Store | None = None
        self._store_error = ""
        try:
            self._store = open_store(storage_url, storage_options, rename_data=rename_data)
        except Exception as exc:  # a bad URL must not stop training; every flush will say why
            self._store_error = f"storage {storage_url!r} unavailable: {type(exc).__name__}: {exc}"
            log.error("%s", self._store_error)
        self._lock = threading.Lock()
        self._requested = threading.Event()
        self._requests: list[SaveRequest] = []
        # What `request()` adds: appending to a deque takes no lock, so a signal handler that interrupts a
        # thread holding `_lock` (or `_requested`'s own lock) cannot deadlock; `step` and `save` take them in.
        self._inbox: deque[SaveRequest] = deque()
        self._answered: dict[str, CheckpointResult] = {}
        self._next_due = time.monotonic() + interval_s if interval_s else math.inf
        self._last_result: CheckpointResult | None = None
        self._inflight = 0
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._worker = threading.Thread(
            target=self._flush_loop, name=f"tessera-ckpt-flush-{job_id}", daemon=True
        )
        self._worker.start()
        self.link = None
        if nats_url:
            from tessera.checkpoint_client.nats_link import NatsLink

            self.link = NatsLink(
                nats_url, job_id, self._on_command, source=source or f"tessera-checkpoint-client/{job_id}"
            )
            self.link.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the training loop's side -------------------------------------------------------------------

    def step(self, step: int, state: State) -> bool:
        """At a safe point: snapshot when a checkpoint is due. True when a snapshot was taken."""
        if step < 0:
            raise ValueError(f"step must be 0 or more, not {step}")
        if self._inbox:
            self._take_inbox()
        if not self._requested.is_set() and time.monotonic() < self._next_due:
            return False
        if self.pool.free_count() == 0:
            self.deferred += 1
            return False
        return self._snapshot(step, state, block=False, trigger="")

    def save(self, step: int, state: State, *, wait: bool = False) -> CheckpointResult | None:
        """Checkpoint now (waiting for a busy staging); with `wait`, also for the flush, and return its result."""
        self._snapshot(step, state, block=True, trigger="manual")
        return self.wait() if wait else None

    def request(
        self, reason: str = "manual", request_id: str | None = None, deadline: datetime | None = None
    ) -> None:
        """Ask for a checkpoint at the next `step`; safe from any thread and from a signal handler: it takes
        no lock, only appends to a deque that the next `step` or `save` reads."""
        self._inbox.append(SaveRequest(reason, request_id, deadline))

    def prepare(self, state: State) -> None:
        """Allocate and touch the staging now rather than on the first checkpoint."""
        flat = flatten(state() if callable(state) else state, self.adapters)
        staging = self.pool.acquire(flat, self.adapters, block=True)
        if staging is not None:
            self.pool.release(staging)

    def wait(self, timeout: float | None = None) -> CheckpointResult | None:
        """Wait until every flush queued so far has ended; the last result."""
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout)
            return self._last_result

    @property
    def last_result(self) -> CheckpointResult | None:
        with self._lock:
            return self._last_result

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._inflight > 0

    def close(self, timeout: float | None = None) -> None:
        """Finish the pending flushes and stop the background threads."""
        if self._closed:
            return
        self.wait(timeout)
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout)
        if self.link is not None:
            self.link.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- snapshot --------------------------------------------------------------------------------------

    def _snapshot(self, step: int, state: State, *, block: bool, trigger: str) -> bool:
        if self._closed:
            raise RuntimeError("checkpointer is closed")
        if step < 0:
            raise ValueError(f"step must be 0 or more, not {step}")
        started = time.perf_counter()
        flat = flatten(state() if callable(state) else state, self.adapters)
        staging = self.pool.acquire(flat, self.adapters, block=block)
        if staging is None:
            self.deferred += 1
            return False
        try:
            used = _adapters_in(flat)
            for adapter in used:
                adapter.begin_copy()
            for leaf, view in zip(flat.tensors, staging.views, strict=True):
                assert leaf.adapter is not None
                leaf.adapter.copy_out(leaf.obj, view)
            fences = [f for f in (a.end_copy() for a in used) if f is not None]
        except BaseException:
            self.pool.release(staging)
            raise
        tensors = [
            TensorRecord(leaf.name, leaf.path, leaf.info, slot.offset)
            for leaf, slot in zip(flat.tensors, staging.plan.slots, strict=True)
            if leaf.info is not None
        ]
        objects = [(leaf.name, leaf.path, leaf.obj) for leaf in flat.objects]
        stall = time.perf_counter() - started
        self._take_inbox()
        with self._lock:
            requests = tuple(self._requests)
            self._requests.clear()
            self._requested.clear()
            self._inflight += 1
        self._next_due = time.monotonic() + self.interval_s if self.interval_s else math.inf
        job = _Job(
            step=step,
            checkpoint_id=new_checkpoint_id(),
            staging=staging,
            tensors=tensors,
            objects=objects,
            fences=fences,
            trigger=trigger or ("requested" if requests else "periodic"),
            requests=requests,
            stall_s=stall,
        )
        self._queue.put(job)
        return True

    # --- flush ------------------------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                result = self._flush(job)
            except (
                Exception
            ) as exc:  # a bug (`flush` returns its failures): the job fails, the thread goes on
                log.exception("checkpoint of step %s failed unexpectedly", job.step)
                self.pool.release(job.staging)  # no-op when the flush released it
                result = CheckpointResult(
                    ok=False,
                    step=job.step,
                    trigger=job.trigger,
                    requests=job.requests,
                    checkpoint_id=job.checkpoint_id,
                    stall_s=job.stall_s,
                    reason=f"internal error: {type(exc).__name__}: {exc}",
                )
            with self._lock:
                self._last_result = result
                self.results.append(result)
                for r in job.requests:
                    if r.request_id:
                        self._answered[r.request_id] = result
                self._inflight -= 1
                self._idle.notify_all()
            try:
                self._announce(result)
            except Exception:  # the result stands; only its report is lost, and the thread must go on
                log.exception("could not report the checkpoint of step %s", result.step)

    def _flush(self, job: _Job) -> CheckpointResult:
        return flush(
            job,
            store=self._store,
            store_error=self._store_error,
            pool=self.pool,
            job_id=self.job_id,
            keep=self.keep,
            chunk_bytes=self.chunk_bytes,
            metadata=self.metadata,
        )

    def _announce(self, result: CheckpointResult) -> None:
        if self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:
                log.exception("on_result callback failed")
        if self.link is not None:
            for request in result.requests or (SaveRequest(result.trigger),):
                self.link.report(self._report(result, request), result.checkpoint_id)

    def _report(self, result: CheckpointResult, request: SaveRequest) -> ReportCheckpoint:
        return report(self.job_id, result, request)

    # --- requests ---------------------------------------------------------------------------------------

    def _on_command(self, command: SaveCheckpoint) -> None:
        self._add_request(SaveRequest(command.reason, command.request_id, command.deadline))

    def _take_inbox(self) -> None:
        while True:
            try:
                request = self._inbox.popleft()
            except IndexError:
                return
            self._add_request(request)

    def _add_request(self, request: SaveRequest) -> None:
        with self._lock:
            answered = self._answered.get(request.request_id or "")
            if request.request_id and any(r.request_id == request.request_id for r in self._requests):
                return
            if answered is None:
                self._requests.append(request)
                self._requested.set()
                return
        log.info("save request %s was already answered: reporting again", request.request_id)
        if self.link is not None:
            self.link.report(self._report(answered, request), answered.checkpoint_id)

    # --- restore ----------------------------------------------------------------------------------------

    def restore(self, state: State, *, uri: str | None = None, strict: bool = True) -> int:
        """Load the checkpoint into `state` in place; the step it was saved at, 0 when there is none.

        Which checkpoint: `uri`, else `$TESSERA_CHECKPOINT_URI` (what the checkpoint service hands a
        restarted job), else the newest complete one of this job. Every chunk is verified before the
        state is touched, so a refused checkpoint leaves the state as it was."""
        uri = uri or os.environ.get(ENV_URI) or None
        found = self._locate(uri)
        if found is None:
            return 0
        store, directory, manifest = found
        live = flatten(state() if callable(state) else state, self.adapters)
        entries = check_state(live, manifest, strict=strict)
        staging = self._staging_matching(live, manifest)
        arena = staging.used() if staging is not None else np.empty(manifest.total_bytes, dtype=np.uint8)
        try:
            read_arena(store, directory, manifest, arena)
            copy_into(live, manifest, entries, arena, own=staging is None)
        finally:
            if staging is not None:
                self.pool.release(staging)
        log.info("restored step %s of %s from %s", manifest.step, self.job_id, store.uri(directory))
        return manifest.step

    def _locate(self, uri: str | None) -> tuple[Store, str, Manifest] | None:
        return locate(uri, self._store, self._store_error, self.job_id, self.storage_options)

    def _staging_matching(self, live: Flat, manifest: Manifest) -> Staging | None:
        return staging_matching(self.pool, self.adapters, live, manifest)


def new_checkpoint_id() -> str:
    """Milliseconds since the epoch in hex, then 4 random hex digits: two checkpoints of one step sort by time."""
    return f"{time.time_ns() // 1_000_000:x}{secrets.token_hex(2)}"


def _close_at_exit(ref: weakref.ref[Checkpointer]) -> None:
    checkpointer = ref()
    if checkpointer is not None:
        checkpointer.close()


def _adapters_in(flat: Flat) -> list[LeafAdapter]:
    seen: list[LeafAdapter] = []
    for leaf in flat.tensors:
        if leaf.adapter is not None and all(leaf.adapter is not a for a in seen):
            seen.append(leaf.adapter)
    return seen
