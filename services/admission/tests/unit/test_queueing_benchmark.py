"""The cycle micro-benchmark returns consistent figures (its speed is reported by bench/, not here)."""

from __future__ import annotations

import itertools

import pytest

from tessera.admission.domain.queueing.benchmark import run_cycle_benchmark


@pytest.mark.parametrize("nodes", [0, 40])
def test_one_cycle_examines_every_queued_job_once(nodes: int) -> None:
    ticks = itertools.count()
    result = run_cycle_benchmark(
        queues=6, jobs=300, queues_per_cohort=3, nodes=nodes, clock=lambda: float(next(ticks))
    )
    assert result.admitted + result.waiting == 300
    assert 0 < result.admitted < 300
    assert result.with_shape_oracle is (nodes > 0)
    assert result.admissions_per_s == result.admitted / result.cycle_s
    assert result.as_dict()["jobs"] == 300


def test_same_seed_same_outcome() -> None:
    first = run_cycle_benchmark(queues=4, jobs=200, seed=7)
    second = run_cycle_benchmark(queues=4, jobs=200, seed=7)
    assert (first.admitted, first.waiting, first.decisions) == (
        second.admitted,
        second.waiting,
        second.decisions,
    )


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="fill"):
        run_cycle_benchmark(fill=0.0)
