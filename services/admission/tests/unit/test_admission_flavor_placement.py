"""An admitted job's Jobs are put on their flavor's nodes: the flavor's node labels become the pod
template's nodeSelector and its tolerations are added, the user's own are kept, and admitting the
job again in another flavor takes the first flavor's away."""

from __future__ import annotations

import copy
from typing import Any

from tessera.admission.domain.flavor_placement import (
    FLAVOR_ANNOTATION,
    FlavorPlacement,
    placement_of,
    template_patch,
)
from tessera.admission.domain.queueing import CapacityType, FlavorSpec
from tessera.devcluster.apiserver.patching import merge_patch

SPOT_TAINT = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
FLAVORS = {
    "a100-spot": FlavorSpec(
        "a100-spot", "A100-80GB", CapacityType.SPOT, {"karpenter.sh/capacity-type": "spot"}, (SPOT_TAINT,)
    ),
    "a100": FlavorSpec(
        "a100", "A100-80GB", CapacityType.ON_DEMAND, {"karpenter.sh/capacity-type": "on-demand"}
    ),
}
USER_TOLERATION = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


def a_job(
    selector: dict[str, str] | None = None, tolerations: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "containers": [{"name": "main", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}]
    }
    if selector is not None:
        pod["nodeSelector"] = selector
    if tolerations is not None:
        pod["tolerations"] = tolerations
    return {
        "metadata": {"name": "train", "annotations": {}},
        "spec": {"suspend": True, "template": {"spec": pod}},
    }


def admitted_in(job: dict[str, Any], flavor: str) -> dict[str, Any]:
    patch = template_patch(job, placement_of(flavor, FLAVORS))
    assert patch is not None
    return dict(merge_patch(copy.deepcopy(job), patch))


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"])


def test_a_spot_flavor_sets_its_node_labels_and_tolerations_and_keeps_the_users_own() -> None:
    job = admitted_in(a_job({"disk": "ssd"}, [USER_TOLERATION]), "a100-spot")
    pod = pod_of(job)
    assert pod["nodeSelector"] == {"disk": "ssd", "karpenter.sh/capacity-type": "spot"}
    assert pod["tolerations"] == [USER_TOLERATION, SPOT_TAINT]
    assert job["metadata"]["annotations"][FLAVOR_ANNOTATION] == "a100-spot"
    assert template_patch(job, placement_of("a100-spot", FLAVORS)) is None, "already there: no change"


def test_admitted_again_in_another_flavor_the_first_flavors_selector_and_tolerations_go() -> None:
    job = admitted_in(admitted_in(a_job({"disk": "ssd"}, [USER_TOLERATION]), "a100-spot"), "a100")
    pod = pod_of(job)
    assert pod["nodeSelector"] == {"disk": "ssd", "karpenter.sh/capacity-type": "on-demand"}
    assert pod["tolerations"] == [USER_TOLERATION]
    assert job["metadata"]["annotations"][FLAVOR_ANNOTATION] == "a100"


def test_the_flavor_wins_a_clash_with_the_users_selector() -> None:
    pod = pod_of(admitted_in(a_job({"karpenter.sh/capacity-type": "on-demand"}), "a100-spot"))
    assert pod["nodeSelector"] == {"karpenter.sh/capacity-type": "spot"}


def test_a_flavor_that_names_no_nodes_changes_nothing() -> None:
    job = a_job({"disk": "ssd"})
    assert template_patch(job, placement_of("any", FLAVORS)) is None, "open mode's flavor"
    assert template_patch(job, FlavorPlacement("plain")) is None


def test_leaving_a_labelled_flavor_for_one_that_names_no_nodes_removes_its_labels() -> None:
    job = admitted_in(a_job(), "a100-spot")
    patch = template_patch(job, FlavorPlacement("plain"))
    assert patch is not None
    pod = pod_of(dict(merge_patch(job, patch)))
    assert "nodeSelector" not in pod and "tolerations" not in pod
