"""Pod templates against the Kubernetes OpenAPI schema: each error names its path in the job spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.admission.domain.templates import job_template_errors, template_errors
from tessera.admission.service_layer.handlers import submit_job
from tessera.contracts.jobs import JobSpec
from tessera.testing.builders import a_job

EXAMPLES = Path(__file__).parents[4] / "examples" / "jobs"
PREFIX = "pod_groups[0].template"


def errors_of(template: object) -> list[tuple[str, str]]:
    return [(e.field, e.reason) for e in template_errors(template, PREFIX)]


def test_a_full_template_passes() -> None:
    template = {
        "metadata": {"labels": {"app": "trainer"}, "annotations": {"team": "research"}},
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                    "command": ["torchrun"],
                    "args": ["train.py"],
                    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                    "ports": [{"containerPort": 29500, "name": "c10d"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "resources": {"limits": {"nvidia.com/gpu": 8}},
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            },
            "serviceAccountName": "trainer",
            "priorityClassName": "research-high",
        },
    }
    assert errors_of(template) == []


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ({"spec": {"containers": [{"name": "main"}]}}, [(f"{PREFIX}.spec.containers[0].image", "required")]),
        (
            {"spec": {"containers": [{"image": "nginx:1.27"}]}},
            [(f"{PREFIX}.spec.containers[0].name", "required")],
        ),
        ({"spec": {"containers": []}}, [(f"{PREFIX}.spec.containers", "required: at least one container")]),
        ({"metadata": {}}, [(f"{PREFIX}.spec", "required")]),
        (
            {"spec": {"containers": [{"name": "m", "image": "nginx:1.27", "imagePullPolice": "Always"}]}},
            [(f"{PREFIX}.spec.containers[0].imagePullPolice", "is not a known field")],
        ),
        (
            {
                "spec": {
                    "containers": [{"name": "m", "image": "nginx:1.27", "ports": [{"containerPort": "http"}]}]
                }
            },
            [
                (
                    f"{PREFIX}.spec.containers[0].ports[0].containerPort",
                    "must be of type integer, got 'http'",
                )
            ],
        ),
        ("nginx", [(PREFIX, "must be a PodTemplateSpec object (metadata, spec)")]),
    ],
)
def test_errors_name_the_path_and_the_reason(template: object, expected: list[tuple[str, str]]) -> None:
    assert errors_of(template) == expected


def test_a_template_is_required_only_where_workloads_run_on_a_cluster() -> None:
    spec = a_job("train").build()
    assert job_template_errors(spec, required=False) == []
    (error,) = job_template_errors(spec, required=True)
    assert (error.field, error.reason) == (PREFIX, "required: the pods' image and command to run")


@pytest.mark.parametrize("example", ["ddp-2x4.yaml", "inference-fractional.yaml"])
def test_the_example_jobs_carry_valid_templates_with_real_images(example: str) -> None:
    spec = JobSpec.model_validate(yaml.safe_load((EXAMPLES / example).read_text()))
    assert job_template_errors(spec, required=True) == []
    for group in spec.pod_groups:
        rendered = group.pod_template()
        assert rendered is not None
        images = [c["image"] for c in rendered["spec"]["containers"]]
        assert all(":" in image and "busybox" not in image for image in images), images


async def test_a_job_without_an_image_is_rejected_naming_the_path(uow: Any) -> None:
    spec = a_job("train").as_dict()
    spec["pod_groups"][0]["template"] = {"spec": {"containers": [{"name": "main"}]}}
    async with uow:
        result = await submit_job(spec, uow, "train-1", templates_required=True)
    assert [(e.field, e.reason) for e in result.errors] == [
        (f"{PREFIX}.spec.containers[0].image", "required")
    ]
    assert "train-1" not in uow.fake_jobs.workloads
