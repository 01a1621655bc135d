"""A pod group's template and its shorthand: read from each other, and written into the template."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.contracts.jobs import PodGroupSpec
from tessera.contracts.validation import parse_job_spec

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def container(**resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": "main", "image": IMAGE, **({"resources": resources} if resources else {})}


def group(**fields: Any) -> PodGroupSpec:
    return PodGroupSpec.model_validate({"name": "worker", "replicas": 2, **fields})


def test_the_shorthand_fills_the_first_container() -> None:
    g = group(cpu="8", memory="32Gi", gpu={"count": 4}, template={"spec": {"containers": [container()]}})
    rendered = g.pod_template()
    assert rendered is not None
    main = rendered["spec"]["containers"][0]
    assert main["image"] == IMAGE
    assert main["resources"] == {
        "requests": {"cpu": "8000m", "memory": "32768Mi"},
        "limits": {"nvidia.com/gpu": "4"},
    }
    assert g.template == {"spec": {"containers": [container()]}}, "the template itself is left as given"


@pytest.mark.parametrize(
    ("gpu", "limits", "annotations"),
    [
        ({"milli": 250}, {"nvidia.com/gpu": "1"}, {"tessera.io/gpu-milli": "250"}),
        ({"mig_profile": "1g.10gb"}, {"nvidia.com/mig-1g.10gb": "1"}, {}),
        (
            {"count": 2, "models": ["A100-80GB"]},
            {"nvidia.com/gpu": "2"},
            {"tessera.io/gpu-models": "A100-80GB"},
        ),
    ],
)
def test_each_gpu_shorthand_becomes_its_resource(
    gpu: dict[str, Any], limits: dict[str, str], annotations: dict[str, str]
) -> None:
    rendered = group(gpu=gpu, template={"spec": {"containers": [container()]}}).pod_template()
    assert rendered is not None
    assert rendered["spec"]["containers"][0]["resources"]["limits"] == limits
    assert rendered["metadata"]["annotations"] == annotations


def test_resources_left_out_of_the_shorthand_are_read_from_the_template() -> None:
    template = {
        "spec": {
            "containers": [
                container(requests={"cpu": "6", "memory": "24Gi"}, limits={"nvidia.com/gpu": 8}),
                {
                    "name": "sidecar",
                    "image": "fluent/fluent-bit:3.1",
                    "resources": {"limits": {"cpu": "500m"}},
                },
            ]
        }
    }
    g = group(template=template)
    assert (g.cpu_milli, g.memory_mib) == (6500, 24 * 1024)
    assert g.gpu is not None and g.gpu.count == 8
    again = PodGroupSpec.model_validate(g.model_dump(mode="json"))
    assert again == g, "a stored spec reads back the same"


def test_a_fractional_template_reads_back_as_milli() -> None:
    template = {
        "metadata": {"annotations": {"tessera.io/gpu-milli": "300"}},
        "spec": {"containers": [container(limits={"nvidia.com/gpu": "1"})]},
    }
    g = group(template=template)
    assert g.gpu is not None and g.gpu.milli == 300


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {
                "gpu": {"count": 2},
                "template": {"spec": {"containers": [container(limits={"nvidia.com/gpu": 4})]}},
            },
            "gpu 2 whole GPU(s) disagrees with the template's 4 whole GPU(s)",
        ),
        (
            {"cpu": "4", "template": {"spec": {"containers": [container(requests={"cpu": "2"})]}}},
            "cpu '4' disagrees with the template's 2000m",
        ),
        (
            {"template": {"spec": {"containers": [container(limits={"nvidia.com/gpu": "half"})]}}},
            "template: nvidia.com/gpu must be a whole number, got 'half'",
        ),
    ],
)
def test_a_template_that_contradicts_the_shorthand_is_refused(fields: dict[str, Any], reason: str) -> None:
    spec = {"name": "train", "tenant": "research", "pod_groups": [{"name": "w", "replicas": 1, **fields}]}
    parsed, errors = parse_job_spec(spec)
    assert parsed is None
    assert [(e.field, e.reason) for e in errors] == [("pod_groups[0]", reason)]
