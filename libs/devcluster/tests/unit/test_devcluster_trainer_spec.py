"""Which pods run a simulated trainer, and how: from their labels, annotations and env."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.devcluster.sim.trainer import TrainerSettings, TrainerSpec, trainer_spec

DEFAULTS = TrainerSettings(steps_per_second=2.0, checkpoint_interval_s=60.0, state_bytes=1024)


def pod(
    annotations: dict[str, str], labels: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p-0", "labels": labels or {}, "annotations": annotations},
        "spec": {
            "containers": [{"name": "c", "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}]
        },
    }


def test_only_checkpointable_pods_run_a_trainer() -> None:
    assert trainer_spec(pod({}), DEFAULTS) is None
    assert trainer_spec(pod({"tessera.io/checkpointable": "false"}), DEFAULTS) is None
    assert trainer_spec(pod({"tessera.io/checkpointable": "True"}), DEFAULTS) == TrainerSpec(
        "p-0", 1024, 2.0, 60.0, None
    )


def test_the_annotations_and_env_shape_the_trainer() -> None:
    spec = trainer_spec(
        pod(
            {
                "tessera.io/checkpointable": "true",
                "tessera.io/sim-state-bytes": "67108864",
                "tessera.io/sim-steps-per-second": "0.5",
                "tessera.io/sim-checkpoint-interval": "never",
            },
            labels={"tessera.io/job-id": "team-a.job-7", "scheduling.x-k8s.io/pod-group": "g"},
            env={"TESSERA_CHECKPOINT_URI": "file:///ckpt/team-a.job-7/step-9-x"},
        ),
        DEFAULTS,
    )
    assert spec == TrainerSpec("team-a.job-7", 67108864, 0.5, None, "file:///ckpt/team-a.job-7/step-9-x")


def test_the_job_id_falls_back_to_the_pod_group_then_the_pod() -> None:
    checkpointable = {"tessera.io/checkpointable": "true"}
    grouped = trainer_spec(pod(checkpointable, labels={"scheduling.x-k8s.io/pod-group": "gang-1"}), DEFAULTS)
    assert grouped is not None and grouped.job_id == "gang-1"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tessera.io/sim-state-bytes", "lots"),
        ("tessera.io/sim-state-bytes", "4"),
        ("tessera.io/sim-steps-per-second", "-1"),
        ("tessera.io/sim-steps-per-second", "nan"),
        ("tessera.io/sim-checkpoint-interval", "soon"),
    ],
)
def test_a_bad_annotation_falls_back_to_the_default(key: str, value: str) -> None:
    spec = trainer_spec(pod({"tessera.io/checkpointable": "true", key: value}), DEFAULTS)
    assert spec == TrainerSpec("p-0", 1024, 2.0, 60.0, None)
