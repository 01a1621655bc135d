"""Rightsizing: pods that hold more GPU than they use. Pure.

Over a window (`window_s`, tumbling) each container's use of each GPU it holds goes into two
histograms: its utilisation in percent of a whole GPU (1 % bins) and its GPU memory (256 MiB bins).
At the end of the window, with enough readings, the 95th percentiles with `headroom` give what it
needs, and:

* **fits_smaller_share**: what it needs fits a smaller share than it holds, by at least
  `min_saving_milli`: the recommendation is a fractional share (milli-GPU, rounded up to
  `step_milli`) and, on a MIG-capable model, the smallest MIG profile whose memory and compute fit;
* **whole_gpu_underused**: it holds a whole GPU and its p95 stayed under `whole_gpu_below_pct` for
  `whole_gpu_window_s` (hours, typically).

A recommendation is made once per container and GPU and kind, until the holder changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from tessera.cluster.catalogue import MigProfile
from tessera.cluster.catalogue import model as catalogue_model

MEMORY_BIN_MIB = 256
HOURS_PER_DAY = 24.0


class FindingKind(StrEnum):
    FITS_SMALLER_SHARE = "fits_smaller_share"
    WHOLE_GPU_UNDERUSED = "whole_gpu_underused"


@dataclass(frozen=True)
class RightsizingPolicy:
    window_s: float = 3600.0
    min_samples: int = 30
    headroom: float = 1.2
    step_milli: int = 50
    min_saving_milli: int = 100
    whole_gpu_below_pct: float = 10.0
    whole_gpu_window_s: float = 4 * 3600.0


@dataclass(frozen=True)
class Recommendation:
    kind: FindingKind
    node: str
    gpu_uuid: str
    gpu_model: str
    namespace: str
    pod: str
    container: str
    window_start: datetime
    window_end: datetime
    samples: int
    allocated_milli: int
    p95_utilization_pct: float
    p95_memory_mib: int
    recommended_milli: int
    recommended_mig_profile: str | None

    @property
    def saving_milli(self) -> int:
        return max(0, self.allocated_milli - self.recommended_milli)

    @property
    def saving_gpu_hours_per_day(self) -> float:
        return self.saving_milli / 1000 * HOURS_PER_DAY

    @property
    def window_saving_gpu_hours(self) -> float:
        """GPU-hours the smaller share would have saved over the window observed."""
        return self.saving_milli / 1000 * (self.window_end - self.window_start).total_seconds() / 3600


def _percentile(counts: dict[int, int], total: int, q: float) -> int:
    """The bin at quantile q of a sparse histogram."""
    rank = math.ceil(q * total)
    seen = 0
    for b in sorted(counts):
        seen += counts[b]
        if seen >= rank:
            return b
    return max(counts) if counts else 0


def smallest_mig_profile(gpu_model: str, memory_mib: float, compute_fraction: float) -> MigProfile | None:
    """The smallest MIG profile of the model (fewest compute, then memory slices; no media
    extensions) with at least `memory_mib` of memory and `compute_fraction` of the GPU's compute."""
    try:
        geometry = catalogue_model(gpu_model).mig
    except (KeyError, ValueError):
        return None
    if geometry is None:
        return None
    fitting = [
        p
        for p in geometry.profiles
        if not p.media_extensions
        and p.memory_mib >= memory_mib
        and p.compute_slices / geometry.compute_slices >= compute_fraction - 1e-9
    ]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_slices))


def recommended_milli(
    p95_util_pct: float, p95_memory_mib: float, gpu_memory_mib: int, policy: RightsizingPolicy
) -> int:
    compute = p95_util_pct * policy.headroom * 10.0
    memory = p95_memory_mib * policy.headroom / gpu_memory_mib * 1000.0 if gpu_memory_mib > 0 else 0.0
    need = max(compute, memory, 1.0)
    step = policy.step_milli
    return int(min(1000, max(step, math.ceil(need / step) * step)))


@dataclass
class _Window:
    start: datetime
    #: when the window is evaluated
    due: datetime
    allocated_milli: int
    whole: bool
    gpu_model: str
    gpu_memory_mib: int
    node: str
    util: dict[int, int] = field(default_factory=dict)
    memory: dict[int, int] = field(default_factory=dict)
    samples: int = 0
    last: datetime | None = None
    #: for whole GPUs: since when every window stayed under the threshold
    underused_since: datetime | None = None


@dataclass
class RightsizingTracker:
    policy: RightsizingPolicy = field(default_factory=RightsizingPolicy)
    _windows: dict[tuple[str, str, str, str], _Window] = field(default_factory=dict)
    _reported: set[tuple[str, str, str, str, FindingKind]] = field(default_factory=set)

    @property
    def _span(self) -> timedelta:
        return timedelta(seconds=self.policy.window_s)

    def observe(
        self,
        node: str,
        gpu_uuid: str,
        gpu_model: str,
        gpu_memory_mib: int,
        namespace: str,
        pod: str,
        container: str,
        at: datetime,
        allocated_gpus: float,
        used_gpus: float,
        memory_mib: float,
        mig: bool = False,
    ) -> Sequence[Recommendation]:
        """Count one reading of the container's use of the GPU; what its window's end recommends."""
        key = (gpu_uuid, namespace, pod, container)
        milli = round(allocated_gpus * 1000)
        w = self._windows.get(key)
        if w is None or w.allocated_milli != milli:
            if w is not None:
                self.forget(gpu_uuid, namespace, pod, container)
            w = self._windows[key] = _Window(
                at, at + self._span, milli, milli >= 1000 and not mig, gpu_model, gpu_memory_mib, node
            )
        out: Sequence[Recommendation] = ()
        if at >= w.due:
            out = self._evaluate(key, w, at)
            underused_since = w.underused_since
            w = self._windows[key] = _Window(
                at, at + self._span, milli, w.whole, gpu_model, gpu_memory_mib, node
            )
            w.underused_since = underused_since
        u = min(100, max(0, round(used_gpus * 100)))
        w.util[u] = w.util.get(u, 0) + 1
        m = int(memory_mib) // MEMORY_BIN_MIB
        w.memory[m] = w.memory.get(m, 0) + 1
        w.samples += 1
        w.last = at
        return out

    def _evaluate(self, key: tuple[str, str, str, str], w: _Window, end: datetime) -> list[Recommendation]:
        policy = self.policy
        if w.samples < policy.min_samples or w.allocated_milli <= 0:
            return []
        p95_util = float(_percentile(w.util, w.samples, 0.95))
        p95_mem = (_percentile(w.memory, w.samples, 0.95) + 1) * MEMORY_BIN_MIB
        p95_mem = min(p95_mem, w.gpu_memory_mib) if w.gpu_memory_mib else p95_mem
        milli = recommended_milli(p95_util, p95_mem, w.gpu_memory_mib, policy)
        mig = smallest_mig_profile(w.gpu_model, p95_mem * policy.headroom, p95_util * policy.headroom / 100)
        gpu_uuid, namespace, pod, container = key
        out = []

        def rec(kind: FindingKind, start: datetime) -> Recommendation:
            return Recommendation(
                kind,
                w.node,
                gpu_uuid,
                w.gpu_model,
                namespace,
                pod,
                container,
                start,
                end,
                w.samples,
                w.allocated_milli,
                p95_util,
                int(p95_mem),
                milli,
                mig.name if mig else None,
            )

        if (
            w.allocated_milli - milli >= policy.min_saving_milli
            and (*key, FindingKind.FITS_SMALLER_SHARE) not in self._reported
        ):
            self._reported.add((*key, FindingKind.FITS_SMALLER_SHARE))
            out.append(rec(FindingKind.FITS_SMALLER_SHARE, w.start))
        if w.whole:
            if p95_util < policy.whole_gpu_below_pct:
                since = w.underused_since or w.start
                w.underused_since = since
                long_enough = end - since >= timedelta(seconds=policy.whole_gpu_window_s)
                if long_enough and (*key, FindingKind.WHOLE_GPU_UNDERUSED) not in self._reported:
                    self._reported.add((*key, FindingKind.WHOLE_GPU_UNDERUSED))
                    out.append(rec(FindingKind.WHOLE_GPU_UNDERUSED, since))
            else:
                w.underused_since = None
        return out

    def forget(self, gpu_uuid: str, namespace: str, pod: str, container: str) -> None:
        """The container let the GPU go (or its share changed): start over."""
        key = (gpu_uuid, namespace, pod, container)
        self._windows.pop(key, None)
        for kind in FindingKind:
            self._reported.discard((*key, kind))

    def prune(self, before: datetime) -> int:
        """Forget the containers not read since `before` (gone pods: their windows would never end);
        how many."""
        gone = [k for k, w in self._windows.items() if w.last is None or w.last < before]
        for key in gone:
            self.forget(*key)
        return len(gone)

    def seed_reported(
        self, gpu_uuid: str, namespace: str, pod: str, container: str, kind: FindingKind
    ) -> None:
        """A recommendation made before a restart: not made again."""
        self._reported.add((gpu_uuid, namespace, pod, container, kind))

    def holders(self) -> set[tuple[str, str, str, str]]:
        return set(self._windows)
