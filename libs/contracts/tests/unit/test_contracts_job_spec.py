from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tessera.contracts.jobs import JobSpec
from tessera.contracts.quantities import parse_cpu_milli, parse_memory_mib
from tessera.contracts.validation import parse_job_spec

EXAMPLES = Path(__file__).parents[4] / "examples" / "jobs"


def base(**changes: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "name": "train",
        "tenant": "research",
        "pod_groups": [{"name": "worker", "replicas": 2, "gpu": {"count": 4}}],
    }
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        (base(name="Bad_Name"), "name", "DNS label"),
        (base(pod_groups=[]), "pod_groups", "at least 1"),
        (
            base(pod_groups=[{"name": "w", "replicas": 2, "min_available": 3}]),
            "pod_groups[0]",
            "min_available (3) exceeds replicas (2)",
        ),
        (
            base(pod_groups=[{"name": "w", "replicas": 1, "gpu": {"count": 1, "milli": 500}}]),
            "pod_groups[0].gpu",
            "exactly one of count, milli or mig_profile",
        ),
        (
            base(pod_groups=[{"name": "w", "replicas": 1, "gpu": {"mig_profile": "big"}}]),
            "pod_groups[0].gpu.mig_profile",
            "not a MIG profile",
        ),
        (
            base(pod_groups=[{"name": "w", "replicas": 1, "cpu": "lots"}]),
            "pod_groups[0].cpu",
            "not a quantity",
        ),
        (
            base(pod_groups=[{"name": "w", "replicas": 1}, {"name": "w", "replicas": 1}]),
            "(body)",
            "repeated: w",
        ),
        (base(colour="blue"), "colour", "not a known field"),
        ({"name": "x"}, "tenant", "is required"),
    ],
)
def test_invalid_specs_name_the_field_and_the_reason(
    spec: dict[str, object], field: str, reason: str
) -> None:
    parsed, errors = parse_job_spec(spec)
    assert parsed is None
    assert any(e.field == field and reason in e.reason for e in errors), errors


def test_the_invalid_example_is_rejected_naming_each_field() -> None:
    _, errors = parse_job_spec(yaml.safe_load((EXAMPLES / "invalid.yaml").read_text()))
    fields = {e.field for e in errors}
    assert {"name", "pod_groups[0]", "pod_groups[1].gpu"} <= fields


@pytest.mark.parametrize("example", ["ddp-2x4.yaml", "inference-fractional.yaml"])
def test_the_valid_examples_parse(example: str) -> None:
    spec, errors = parse_job_spec(yaml.safe_load((EXAMPLES / example).read_text()))
    assert errors == [] and spec is not None


def test_totals_and_defaults() -> None:
    spec = JobSpec.model_validate(
        base(
            pod_groups=[
                {"name": "w", "replicas": 2, "gpu": {"count": 4}},
                {
                    "name": "s",
                    "replicas": 3,
                    "min_available": 1,
                    "gpu": {"milli": 250},
                    "cpu": "500m",
                    "memory": "1Gi",
                },
            ]
        )
    )
    assert spec.total_gpu_milli == 2 * 4000 + 3 * 250
    assert spec.pod_groups[0].quorum == 2 and spec.pod_groups[1].quorum == 1
    assert spec.pod_groups[1].cpu_milli == 500 and spec.pod_groups[1].memory_mib == 1024


@pytest.mark.parametrize(("value", "milli"), [("500m", 500), ("4", 4000), (2.5, 2500), ("0.25", 250)])
def test_cpu_quantities(value: str | float, milli: int) -> None:
    assert parse_cpu_milli(value) == milli


@pytest.mark.parametrize(("value", "mib"), [("16Gi", 16384), ("512Mi", 512), ("1G", 953), (2**30, 1024)])
def test_memory_quantities(value: str | int, mib: int) -> None:
    assert parse_memory_mib(value) == mib
