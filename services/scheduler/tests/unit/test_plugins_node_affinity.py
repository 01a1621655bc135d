"""Required node affinity (requiredDuringSchedulingIgnoredDuringExecution) is honoured as kube-scheduler
does: a node must match one of the nodeSelectorTerms, each term all of its expressions; a pod no node
matches is unschedulable, saying so; the terms are read from the pod's manifest."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tessera.cluster.conventions.pods import parse_pod_requirements
from tessera.cluster.domain.affinity import NodeSelectorRequirement, parse_required_affinity
from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.plugins.profiles import build_profile
from tessera.scheduler.domain.plugins.reserve import RecordingBinder


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}


def schedule(cache: SchedulerCache, terms: tuple[tuple[NodeSelectorRequirement, ...], ...]) -> Any:
    pod = replace(make_pod("p", gpus=1), node_affinity=terms)
    framework = Framework(build_profile(cache, GangRegistry(), RecordingBinder(), gangs=False))
    return framework.schedule_pod(CycleState(), pod, cache.snapshot())


def test_a_pod_goes_only_to_a_node_one_of_its_terms_matches() -> None:
    h100 = make_node("h100").gpus(4).label("gpu", "H100").label("zone", "a").build()
    a100 = make_node("a100").gpus(8).label("gpu", "A100").label("zone", "b").build()
    cache = SchedulerCache.rebuild([a100, h100])
    wants_h100 = parse_required_affinity(
        affinity(
            [{"key": "gpu", "operator": "In", "values": ["H100"]}, {"key": "zone", "operator": "Exists"}]
        )
    )
    assert schedule(cache, wants_h100).node == "h100"
    not_zone_a = parse_required_affinity(affinity([{"key": "zone", "operator": "NotIn", "values": ["a"]}]))
    assert schedule(cache, not_zone_a).node == "a100"
    either = parse_required_affinity(
        affinity(
            [{"key": "gpu", "operator": "In", "values": ["B200"]}],
            [{"key": "zone", "operator": "In", "values": ["a"]}],
        )
    )
    assert schedule(cache, either).node == "h100"


def test_a_pod_no_node_matches_is_unschedulable_saying_why() -> None:
    cache = SchedulerCache.rebuild([make_node("n1").gpus(4).label("gpus", "4").build()])
    terms = parse_required_affinity(affinity([{"key": "gpus", "operator": "Gt", "values": ["4"]}]))
    result = schedule(cache, terms)
    assert result.node is None and result.diagnosis is not None
    assert result.diagnosis.message() == "node didn't match the pod's node affinity on 1 node"
    fewer = parse_required_affinity(affinity([{"key": "gpus", "operator": "Lt", "values": ["8"]}]))
    assert schedule(cache, fewer).node == "n1"


def test_the_terms_are_read_from_the_pod_manifest() -> None:
    spec = {
        "containers": [{"name": "c", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}],
        **affinity([{"key": "gpu", "operator": "DoesNotExist"}]),
    }
    requirements = parse_pod_requirements(spec, {})
    assert requirements.node_affinity == ((NodeSelectorRequirement("gpu", "DoesNotExist"),),)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (
            {"key": "gpu", "operator": "Near", "values": ["x"]},
            "matchExpressions[0].operator: expected one of",
        ),
        ({"key": "gpu", "operator": "In"}, "matchExpressions[0].values: required for In"),
        ({"key": "gpu", "operator": "Gt", "values": ["many"]}, "Gt takes one integer"),
    ],
)
def test_a_bad_term_is_refused_naming_the_field(expr: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="nodeSelectorTerms\\[0\\]") as raised:
        parse_required_affinity(affinity([expr]))
    assert message in str(raised.value)
