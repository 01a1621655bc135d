"""Bad input a job spec must refuse, naming the field: strict types, finite and bounded
quantities, text that can be stored (no NUL, no lone surrogate), and a pod that asks for something."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tessera.contracts.quantities import parse_cpu_milli, parse_memory_mib
from tessera.contracts.validation import parse_job_spec


def spec(**changes: Any) -> dict[str, Any]:
    return {
        "name": "train",
        "tenant": "a",
        "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}}],
        **changes,
    }


def group(**fields: Any) -> dict[str, Any]:
    return spec(pod_groups=[{"name": "w", "replicas": 1, **fields}])


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        (spec(name="a" * 64), "name", "at most 63 characters"),
        (spec(tenant="a" * 64), "tenant", "at most 63 characters"),
        (spec(labels={"k": "a\x00b"}), "labels", "k must not contain a NUL character"),
        (spec(labels={"a\x00": "v"}), "labels", "key must not contain a NUL character"),
        (spec(labels={"k": "\ud800"}), "labels.k", "valid string"),
        (spec(labels={"k" * 64: "v"}), f"labels.{'k' * 64}.[key]", "at most 63 characters"),
        (group(cpu=float("inf")), "pod_groups[0].cpu", "finite"),
        (group(cpu=1e308), "pod_groups[0].cpu", "finite"),
        (group(cpu="2000"), "pod_groups[0].cpu", "at most 1024 CPUs"),
        (group(memory=10**400), "pod_groups[0].memory", "finite"),
        (group(memory="17Ti"), "pod_groups[0].memory", "at most 16Ti"),
        (group(gpu={"count": True}), "pod_groups[0].gpu.count", "valid integer"),
        (group(gpu={"count": "2"}), "pod_groups[0].gpu.count", "valid integer"),
        (group(gpu={"milli": 500.0}), "pod_groups[0].gpu.milli", "valid integer"),
        (spec(pod_groups=[{"name": "w", "replicas": "2"}]), "pod_groups[0].replicas", "valid integer"),
        (spec(preemptible="yes"), "preemptible", "valid boolean"),
        (spec(priority=2**31), "priority", "less than or equal to 1000000000"),
        (group(cpu=0, memory=0), "pod_groups[0]", "must request some cpu, memory or GPU"),
        (group(cpu="0", memory="0"), "pod_groups[0]", "must request some cpu, memory or GPU"),
        (
            group(gpu={"count": 1}, template={"spec": {"containers": [{"name": "m", "image": "x\x00"}]}}),
            "pod_groups[0].template",
            "spec.containers[0].image must not contain a NUL character",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field(data: dict[str, Any], field: str, reason: str) -> None:
    parsed, errors = parse_job_spec(data)
    assert parsed is None
    assert errors[0].field == field
    assert reason in errors[0].reason


def test_error_paths_holding_a_users_key_can_be_written_as_utf8() -> None:
    _, errors = parse_job_spec(spec(labels={"\ud800": "v", "ok": 1}))
    assert errors
    body = json.dumps([e.model_dump() for e in errors], ensure_ascii=False)
    body.encode("utf-8")  # raises on a lone surrogate


def test_cpu_only_and_memory_only_groups_are_fine() -> None:
    assert parse_job_spec(group(cpu="500m", memory="0"))[1] == []
    assert parse_job_spec(group(cpu=0, memory="1Gi"))[1] == []
    assert parse_job_spec(group(cpu="1024", memory="16Ti"))[1] == []


def test_quantities_at_their_bounds() -> None:
    assert parse_cpu_milli(1024) == 1_024_000
    assert parse_memory_mib("16Ti") == 16 * 1024 * 1024
    with pytest.raises(ValueError, match="finite"):
        parse_cpu_milli(float("nan"))
    with pytest.raises(ValueError, match="negative"):
        parse_memory_mib(-1)
