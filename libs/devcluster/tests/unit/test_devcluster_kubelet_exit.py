"""How long a simulated pod runs and how it exits: durations with units, a default, exit codes."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.devcluster.sim.context import SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION, SimSettings
from tessera.devcluster.sim.kubelet import parse_duration, sim_duration, sim_exit_code


def pod(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "annotations": annotations}}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("5s", 5.0), ("1.5m", 90.0), ("2h", 7200.0), ("250ms", 0.25), (" 3s ", 3.0)],
)
def test_a_duration_reads_with_or_without_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_a_pod_runs_for_its_annotation_else_the_default_else_until_deleted() -> None:
    assert sim_duration(pod(**{SIM_DURATION_ANNOTATION: "5s"}), default=60.0) == 5.0
    assert sim_duration(pod(), default=60.0) == 60.0
    assert sim_duration(pod()) is None
    assert sim_duration(pod(**{SIM_DURATION_ANNOTATION: "soon"}), default=60.0) is None


def test_a_pod_exits_with_its_annotated_code_else_zero() -> None:
    assert sim_exit_code(pod(**{SIM_EXIT_CODE_ANNOTATION: "137"})) == 137
    assert sim_exit_code(pod()) == 0
    assert sim_exit_code(pod(**{SIM_EXIT_CODE_ANNOTATION: "crash"})) == 0


def test_a_negative_default_duration_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="default_pod_seconds"):
        SimSettings(default_pod_seconds=-1.0)
