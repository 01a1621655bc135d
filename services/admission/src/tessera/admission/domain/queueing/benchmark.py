"""A micro-benchmark of one admission cycle, for `bench/admission.py` to call.

It builds `queues` queues in cohorts of `queues_per_cohort`, queues `jobs` jobs across them
(1, 2, 4 or 8 GPUs per pod, 1-4 pods, two flavors, random priorities) and times one
`run_cycle`. Quota is sized so that about `fill` of the requested GPUs fit, so the cycle
exercises both admissions and waits. With `nodes` > 0 a free-shape oracle of 8-GPU nodes
checks every gang too. Nothing is printed; the caller reports the figures.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from tessera.admission.domain.queueing.builders import a_job, a_queue
from tessera.admission.domain.queueing.config import QueueingConfig
from tessera.admission.domain.queueing.engine import QueueingEngine
from tessera.admission.domain.queueing.model import FairSharing
from tessera.admission.domain.queueing.shape import FreeShapeOracle, NodeFree

FLAVORS = ("a100", "t4")
GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class CycleBenchmark:
    queues: int
    jobs: int
    admitted: int
    waiting: int
    decisions: int
    cycle_s: float
    setup_s: float
    admissions_per_s: float
    jobs_examined_per_s: float
    with_shape_oracle: bool
    fair_sharing: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_cycle_benchmark(
    queues: int = 50,
    jobs: int = 10_000,
    queues_per_cohort: int = 10,
    fill: float = 0.6,
    nodes: int = 0,
    fair_sharing: bool = True,
    seed: int = 42,
    clock: Callable[[], float] = time.perf_counter,
) -> CycleBenchmark:
    """Time one admission cycle over `jobs` queued jobs spread across `queues` queues."""
    if queues < 1 or jobs < 1 or queues_per_cohort < 1:
        raise ValueError("queues, jobs and queues_per_cohort must be at least 1")
    if not 0 < fill <= 1:
        raise ValueError("fill must be in (0, 1]")
    rng = random.Random(seed)
    started = clock()
    specs = []
    workloads = []
    demand = [0] * queues
    for i in range(jobs):
        q = rng.randrange(queues)
        per_pod = rng.choice((1, 1, 2, 4, 8))
        pods = rng.choice((1, 1, 2, 4))
        flavors = rng.choice(((), ("a100",), ("t4",)))
        demand[q] += per_pod * pods
        workloads.append(
            a_job(f"job-{i}")
            .queue(f"q{q}")
            .priority(rng.choice((0, 0, 10, 100)))
            .at(float(i))
            .flavors(*flavors)
            .gpus(per_pod, pods=pods)
            .build()
        )
    for q in range(queues):
        # Split the nominal quota over the two flavors so that about `fill` of demand fits.
        share = max(GPUS_PER_NODE * 4, int(demand[q] * fill / 2))
        builder = a_queue(f"q{q}").cohort(f"cohort-{q // queues_per_cohort}")
        for flavor in FLAVORS:
            builder.nominal(gpu=share, flavor=flavor)
        specs.append(builder.build())
    config = QueueingConfig.build(
        flavors=FLAVORS,
        queues=specs,
        fair_sharing=FairSharing(enabled=fair_sharing, usage_half_life_s=3600.0),
    )
    engine = QueueingEngine(config)
    for workload in workloads:
        engine.submit(workload)
    oracle = None
    if nodes > 0:
        oracle = FreeShapeOracle([NodeFree(f"node-{n}", FLAVORS[n % 2], GPUS_PER_NODE) for n in range(nodes)])
    setup_s = clock() - started
    began = clock()
    result = engine.run_cycle(now=float(jobs), oracle=oracle)
    cycle_s = max(clock() - began, 1e-9)
    return CycleBenchmark(
        queues=queues,
        jobs=jobs,
        admitted=result.admitted,
        waiting=len(result.waits),
        decisions=len(result.decisions),
        cycle_s=cycle_s,
        setup_s=setup_s,
        admissions_per_s=result.admitted / cycle_s,
        jobs_examined_per_s=result.examined / cycle_s,
        with_shape_oracle=oracle is not None,
        fair_sharing=fair_sharing,
    )
