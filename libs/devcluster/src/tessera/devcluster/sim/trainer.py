"""Simulated training processes that checkpoint through the real client library.

A pod annotated `tessera.io/checkpointable: "true"` runs, once Running, a trainer on a thread of its own:
a synthetic NumPy state of `tessera.io/sim-state-bytes` bytes and a loop that advances a step counter
`tessera.io/sim-steps-per-second` times per simulated second and calls `Checkpointer.step(step, state)`
of `tessera.checkpoint_client`, the library real training code uses. So:

- at start it restores: from `TESSERA_CHECKPOINT_URI` in the pod's container env when set (what the
  checkpoint service hands a restarted job), else from the newest complete checkpoint of its job, so a
  recreated pod resumes from the step saved last;
- it checkpoints every `tessera.io/sim-checkpoint-interval` simulated seconds to the devcluster's
  checkpoint storage, and, when the devcluster has a NATS URL, whenever the checkpoint service asks on
  `subjects.save_checkpoint(job_id)`; the library reports each outcome on `report_checkpoint`;
- it closes the checkpointer (waiting for the flush under way) when the pod ends, is deleted or evicted,
  or its node is lost.

The job id is the pod's `tessera.io/job-id` label (`JOB_ID_LABEL`, what the scheduler puts on a job's
pods, as it sets `TESSERA_CHECKPOINT_URI` and the checkpointable annotation), else its
PodGroup, else the pod's name. The first 8 bytes of the state hold the step as an int64, so a restored
state shows which step it was saved at.

The trainer shows what it does in the pod's annotations: `tessera.io/sim-step` (refreshed about once a
second), `tessera.io/sim-restored-step`, `tessera.io/last-checkpoint` (the URI) and
`tessera.io/last-checkpoint-step`, or `tessera.io/last-checkpoint-error` when a checkpoint failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.cluster.conventions import (
    CHECKPOINT_URI_ENV,
    CHECKPOINTABLE_ANNOTATION,
    JOB_ID_LABEL,
    POD_GROUP_LABEL,
    SIM_CHECKPOINT_INTERVAL_ANNOTATION,
    SIM_STATE_BYTES_ANNOTATION,
    SIM_STEPS_PER_SECOND_ANNOTATION,
)

if TYPE_CHECKING:  # imported when the first trainer starts: it is slow to import, most pods never need it
    from tessera.checkpoint_client import Checkpointer, CheckpointResult

log = logging.getLogger(__name__)

# the pod's side, as the scheduler writes it (`tessera.cluster.conventions`)
STATE_BYTES_ANNOTATION = SIM_STATE_BYTES_ANNOTATION
STEPS_PER_SECOND_ANNOTATION = SIM_STEPS_PER_SECOND_ANNOTATION
CHECKPOINT_INTERVAL_ANNOTATION = SIM_CHECKPOINT_INTERVAL_ANNOTATION
STEP_ANNOTATION = "tessera.io/sim-step"
RESTORED_STEP_ANNOTATION = "tessera.io/sim-restored-step"
LAST_CHECKPOINT_ANNOTATION = "tessera.io/last-checkpoint"
LAST_CHECKPOINT_STEP_ANNOTATION = "tessera.io/last-checkpoint-step"
CHECKPOINT_ERROR_ANNOTATION = "tessera.io/last-checkpoint-error"

Publish = Callable[[dict[str, str]], None]


@dataclass(frozen=True)
class TrainerSettings:
    """The devcluster's side: where checkpoints go and how trainers run unless their pod says otherwise."""

    #: NATS of the checkpoint service; without one, trainers still checkpoint to storage periodically
    nats_url: str | None = None
    #: fsspec URL of the checkpoint root; None: a temporary directory made when the first trainer starts
    storage_url: str | None = None
    steps_per_second: float = 1.0  # per simulated second
    #: simulated seconds between periodic checkpoints; None: only when asked
    checkpoint_interval_s: float | None = 300.0
    state_bytes: int = 4 * 2**20
    keep: int = 3
    #: wall-clock seconds between two updates of the step annotation
    report_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.steps_per_second <= 0:
            raise ValueError(f"steps_per_second: must be positive, got {self.steps_per_second}")
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError(
                f"checkpoint_interval_s: must be positive or None, got {self.checkpoint_interval_s}"
            )
        if self.state_bytes < 8:
            raise ValueError(f"state_bytes: must be at least 8, got {self.state_bytes}")


@dataclass(frozen=True)
class TrainerSpec:
    """What one pod's trainer does, from its labels, annotations and env."""

    job_id: str
    state_bytes: int
    steps_per_second: float
    checkpoint_interval_s: float | None
    restore_uri: str | None


def trainer_spec(pod: dict[str, Any], defaults: TrainerSettings) -> TrainerSpec | None:
    """The pod's trainer, or None when the pod is not checkpointable. A bad annotation is logged and
    its default used: the pod still runs."""
    meta = pod["metadata"]
    annotations = meta.get("annotations") or {}
    if str(annotations.get(CHECKPOINTABLE_ANNOTATION, "")).lower() != "true":
        return None
    labels = meta.get("labels") or {}
    name = meta["name"]
    job_id = labels.get(JOB_ID_LABEL) or labels.get(POD_GROUP_LABEL) or name
    state_bytes = _positive(annotations, STATE_BYTES_ANNOTATION, defaults.state_bytes, name, minimum=8)
    rate = _positive(annotations, STEPS_PER_SECOND_ANNOTATION, defaults.steps_per_second, name)
    interval: float | None = defaults.checkpoint_interval_s
    text = annotations.get(CHECKPOINT_INTERVAL_ANNOTATION)
    if text is not None and str(text).strip().lower() in ("0", "none", "never"):
        interval = None
    elif text is not None:
        interval = _positive(annotations, CHECKPOINT_INTERVAL_ANNOTATION, interval, name)
    return TrainerSpec(job_id, int(state_bytes), float(rate), interval, _env(pod, CHECKPOINT_URI_ENV))


def _positive(annotations: dict[str, Any], key: str, default: Any, pod: str, minimum: float = 0.0) -> Any:
    """The annotation as a positive number of at least `minimum`, else (logged) the default."""
    text = annotations.get(key)
    if text is None:
        return default
    try:
        value = float(str(text))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0 and value >= minimum):
        log.warning("pod %s: %s=%r is not a usable number; using %s", pod, key, text, default)
        return default
    return value


def _env(pod: dict[str, Any], name: str) -> str | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for var in container.get("env") or []:
            if var.get("name") == name and var.get("value"):
                return str(var["value"])
    return None


class Trainer:
    """One pod's training process: a thread that owns a `Checkpointer`."""

    def __init__(
        self,
        key: str,
        spec: TrainerSpec,
        settings: TrainerSettings,
        storage_url: str,
        speed: float,
        publish: Publish,
    ) -> None:
        self.key = key
        self.spec = spec
        self.step = 0
        self._settings = settings
        self._storage_url = storage_url
        self._speed = speed
        self._publish = publish
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"devcluster-trainer-{key}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop to end; the thread then closes the checkpointer. Never blocks."""
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        spec = self.spec
        interval = spec.checkpoint_interval_s
        try:
            from tessera.checkpoint_client import Checkpointer

            ckpt = Checkpointer(
                spec.job_id,
                self._storage_url,
                self._settings.nats_url,
                interval_s=interval / self._speed if interval else None,
                keep=self._settings.keep,
                on_result=self._on_result,
                metadata={"pod": self.key, "simulated": True},
                source=f"tessera-devcluster/{self.key}",
            )
        except Exception as exc:
            log.exception("trainer of %s could not start", self.key)
            self._publish({CHECKPOINT_ERROR_ANNOTATION: f"{type(exc).__name__}: {exc}"})
            return
        try:
            state = {"weights": np.zeros(spec.state_bytes, np.uint8)}
            self.step = self._restore(ckpt, state)
            self._publish({STEP_ANNOTATION: str(self.step), RESTORED_STEP_ANNOTATION: str(self.step)})
            self._train(ckpt, state)
        except Exception:
            log.exception("trainer of %s stopped", self.key)
        finally:
            ckpt.close(timeout=60)
            self._publish({STEP_ANNOTATION: str(self.step)})

    def _restore(self, ckpt: Checkpointer, state: dict[str, Any]) -> int:
        # the URI is resolved here rather than by `restore` from os.environ: that is the devcluster's
        # environment, shared by every simulated pod
        from tessera.checkpoint_client import latest_uri

        uri = self.spec.restore_uri or latest_uri(self._storage_url, self.spec.job_id)
        if uri is None:
            return 0
        try:
            step = ckpt.restore(state, uri=uri)
        except Exception as exc:
            log.warning("trainer of %s could not restore %s (%s); it starts afresh", self.key, uri, exc)
            self._publish({CHECKPOINT_ERROR_ANNOTATION: f"restore: {type(exc).__name__}: {exc}"})
            return 0
        log.info("trainer of %s resumes job %s at step %d", self.key, self.spec.job_id, step)
        return step

    def _train(self, ckpt: Checkpointer, state: dict[str, Any]) -> None:
        weights = state["weights"]
        period = 1.0 / (self.spec.steps_per_second * self._speed)
        next_report = time.monotonic() + self._settings.report_interval_s
        while not self._stop.wait(period):
            self.step += 1
            weights[:8].view(np.int64)[0] = self.step
            ckpt.step(self.step, state)
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + self._settings.report_interval_s
                self._publish({STEP_ANNOTATION: str(self.step)})

    def _on_result(self, result: CheckpointResult) -> None:
        if result.ok:
            self._publish(
                {LAST_CHECKPOINT_ANNOTATION: result.uri, LAST_CHECKPOINT_STEP_ANNOTATION: str(result.step)}
            )
        else:
            self._publish({CHECKPOINT_ERROR_ANNOTATION: f"step {result.step}: {result.reason}"})


class Trainers:
    """The trainers of the kubelet's pods. `start` and `stop` are called on the devcluster's loop;
    annotations the trainers publish from their threads are handed to `annotate` on that loop."""

    def __init__(
        self, settings: TrainerSettings, speed: float, annotate: Callable[[str, str, dict[str, str]], None]
    ) -> None:
        self.settings = settings
        self.speed = speed
        self._annotate = annotate
        self._live: dict[str, tuple[str, Trainer]] = {}  # by pod key: (uid, trainer)
        self._all: list[Trainer] = []
        self._storage_url = settings.storage_url

    @property
    def storage_url(self) -> str:
        if self._storage_url is None:
            root = Path(tempfile.mkdtemp(prefix="tessera-devcluster-checkpoints-"))
            self._storage_url = root.as_uri()
            log.info("trainers checkpoint under %s (no checkpoint root was configured)", root)
        return self._storage_url

    def get(self, key: str) -> Trainer | None:
        found = self._live.get(key)
        return found[1] if found else None

    def running(self) -> int:
        """Trainer threads still alive, those closing their checkpointer after their pod ended included."""
        return sum(t.alive for t in self._all)

    def start(self, key: str, uid: str, spec: TrainerSpec) -> Trainer:
        loop = asyncio.get_running_loop()

        def publish(annotations: dict[str, str]) -> None:  # from the trainer's threads
            # a closed loop: the devcluster stopped, nobody is left to see it
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._annotate, key, uid, annotations)

        trainer = Trainer(key, spec, self.settings, self.storage_url, self.speed, publish)
        self._live[key] = (uid, trainer)
        self._all = [t for t in self._all if t.alive]
        self._all.append(trainer)
        trainer.start()
        return trainer

    def stop(self, key: str, uid: str) -> None:
        found = self._live.get(key)
        if found is not None and found[0] == uid:
            del self._live[key]
            found[1].stop()

    async def stop_all(self, timeout: float = 60.0) -> None:
        """Stop every trainer and wait for their last flushes."""
        self._live.clear()
        trainers, self._all = self._all, []
        for trainer in trainers:
            trainer.stop()
        deadline = time.monotonic() + timeout
        for trainer in trainers:
            await asyncio.to_thread(trainer.join, max(0.0, deadline - time.monotonic()))
