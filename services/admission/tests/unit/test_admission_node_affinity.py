"""What pods require of a node (their nodeSelector and required node affinity) decides which flavors
and which nodes admission tries: a flavor whose node labels (or GPU model) contradict it is dropped,
and a job no flavor of its queue can ever hold waits `NoMatchingFlavor`, naming the requirement, which
its conditions call Inadmissible; the free-shape check places pods only on nodes whose labels match,
and says when no node ever could."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.admission.domain.job_conditions import INADMISSIBLE, JobStatusView, conditions_for
from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import (
    Admit,
    FlavorSpec,
    FreeShapeOracle,
    NodeFree,
    NodeRequirement,
    QueueingConfig,
    QueueingEngine,
    QueueSpec,
    Wait,
    WaitReason,
)
from tessera.admission.domain.queueing.builders import a_job, a_queue
from tessera.admission.domain.workloads import groups_of, to_workload
from tessera.admission.service_layer.shape_view import free_shape
from tessera.contracts.jobs import JobSpec

PRODUCT = "nvidia.com/gpu.product"
ZONE = "topology.kubernetes.io/zone"
A100 = FlavorSpec("a100", "A100-80GB", node_labels={ZONE: "rack-a"})
H100 = FlavorSpec("h100", "H100-80GB", node_labels={ZONE: "rack-b"})


def affinity(*expressions: dict[str, Any], selector: dict[str, str] | None = None) -> NodeRequirement:
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]
                }
            }
        }
        if expressions
        else {}
    }
    if selector:
        spec["nodeSelector"] = selector
    return NodeRequirement.of_pod_spec(spec)


def product_in(*products: str) -> dict[str, Any]:
    return {"key": PRODUCT, "operator": "In", "values": list(products)}


def engine_of(*queues: QueueSpec, flavors: tuple[FlavorSpec, ...] = (A100, H100)) -> QueueingEngine:
    return QueueingEngine(QueueingConfig.build(flavors=flavors, queues=queues))


def two_flavor_queue() -> QueueSpec:
    return a_queue("q").nominal("a100", gpu=8).nominal("h100", gpu=8).build()


def test_a_requirement_reads_as_the_user_wrote_it_and_survives_being_stored() -> None:
    node = affinity(product_in("NVIDIA-H100-80GB-HBM3"), selector={ZONE: "rack-b"})
    assert node.describe() == f"{ZONE}=rack-b; {PRODUCT} In [NVIDIA-H100-80GB-HBM3]"
    assert NodeRequirement.stored(node.to_json()) == node
    assert not NodeRequirement.stored(None) and not NodeRequirement.of_template({"spec": {}})
    with pytest.raises(ValueError, match="operator"):
        affinity({"key": PRODUCT, "operator": "Near", "values": ["x"]})


def test_flavors_whose_labels_or_gpu_model_contradict_the_requirement_are_not_allowed() -> None:
    keys = {ZONE}
    on_b = affinity(selector={ZONE: "rack-b"})
    assert not on_b.allows_flavor(A100.node_labels, keys, A100.gpu_model)
    assert on_b.allows_flavor(H100.node_labels, keys, H100.gpu_model)
    # A key no flavor names says nothing of flavors (the nodes decide), as in Kueue.
    assert affinity(selector={"team": "x"}).allows_flavor(A100.node_labels, keys, A100.gpu_model)
    # The GPU model stands for the product label.
    wants_h100 = affinity(product_in("NVIDIA-H100-80GB-HBM3"))
    assert not wants_h100.allows_flavor(A100.node_labels, keys, A100.gpu_model)
    assert wants_h100.allows_flavor(H100.node_labels, keys, H100.gpu_model)
    assert affinity({"key": ZONE, "operator": "NotIn", "values": ["rack-a"]}).allows_flavor(
        H100.node_labels, keys
    )
    assert not affinity({"key": ZONE, "operator": "NotIn", "values": ["rack-a"]}).allows_flavor(
        A100.node_labels, keys
    )


def test_a_job_goes_to_the_flavor_its_affinity_allows_even_when_the_queue_lists_another_first() -> None:
    engine = engine_of(two_flavor_queue())
    engine.submit(a_job("pinned").queue("q").on_nodes(affinity(product_in("H100"))).gpus(4).build())
    engine.submit(a_job("free").queue("q").gpus(4).build())
    admitted = {d.job: d.flavors for d in engine.run_cycle(0.0).decisions if isinstance(d, Admit)}
    assert admitted == {"pinned": ("h100",), "free": ("a100",)}


def test_a_job_no_flavor_of_its_queue_can_hold_is_inadmissible_naming_the_affinity() -> None:
    engine = engine_of(two_flavor_queue())
    engine.submit(a_job("b200").queue("q").on_nodes(affinity(product_in("NVIDIA-B200"))).gpus(1).build())
    waits = [d for d in engine.run_cycle(0.0).decisions if isinstance(d, Wait)]
    assert [(w.job, w.reason) for w in waits] == [("b200", WaitReason.NO_MATCHING_FLAVOR)]
    message = waits[0].message
    assert message == (
        "queue q: no flavor (a100, h100) matches the pods' required node affinity of pod group g0: "
        f"{PRODUCT} In [NVIDIA-B200]"
    )
    view = JobStatusView(JobState.QUEUED, "q", (waits[0].reason.value, message))
    inadmissible = {c.type: c for c in conditions_for(view)}[INADMISSIBLE]
    assert (inadmissible.status, inadmissible.reason, inadmissible.message) == (
        True,
        "NoMatchingFlavor",
        message,
    )


def test_identical_requests_with_different_affinities_are_judged_apart_in_one_cycle() -> None:
    engine = engine_of(two_flavor_queue())
    engine.submit(
        a_job("lost").queue("q").on_nodes(affinity(selector={ZONE: "rack-z"})).gpus(2).at(1).build()
    )
    engine.submit(a_job("fine").queue("q").gpus(2).at(2).build())
    decisions = engine.run_cycle(0.0).decisions
    assert [d.job for d in decisions if isinstance(d, Admit)] == ["fine"]


def test_the_free_shape_places_pods_only_on_nodes_their_labels_allow() -> None:
    oracle = FreeShapeOracle(
        [
            NodeFree("tight-a", "a100", 2, labels={ZONE: "rack-a"}),
            NodeFree("roomy-b", "a100", 8, labels={ZONE: "rack-b"}),
        ]
    )
    pinned = a_job("p").queue("q").on_nodes(affinity(selector={ZONE: "rack-b"})).gpus(2).build()
    placement = oracle.try_place(pinned, ["a100"])
    assert placement is not None and {s.node for s in placement.slots} == {"roomy-b"}
    nowhere = a_job("n").queue("q").on_nodes(affinity(selector={ZONE: "rack-z"})).gpus(1).build()
    assert oracle.try_place(nowhere, ["a100"]) is None
    # A node whose labels are not known (its source reports none) may hold any pod.
    assert FreeShapeOracle([NodeFree("unlabelled", "a100", 8)]).try_place(nowhere, ["a100"]) is not None


def test_the_shape_check_says_when_no_node_matches_the_affinity_or_none_it_allows_is_big_enough() -> None:
    gpus = [{"uuid": f"g{i}", "model": "A100-80GB"} for i in range(8)]
    small = [{"uuid": f"s{i}", "model": "A100-80GB"} for i in range(2)]
    labels = {"big": {ZONE: "rack-a"}, "small": {ZONE: "rack-b"}}
    oracle = free_shape([("big", gpus), ("small", small)], {}, {}, labels=labels)
    assert oracle is not None
    nowhere = a_job("n").queue("q").on_nodes(affinity(selector={ZONE: "rack-z"})).gpus(1).build()
    assert oracle.never_fits(nowhere) == (
        f"no node shape holds a pod of 'g0': no node matches its required node affinity: {ZONE}=rack-z"
    )
    on_b = a_job("b").queue("q").on_nodes(affinity(selector={ZONE: "rack-b"})).gpus(4).build()
    assert oracle.never_fits(on_b) == (
        "no node shape holds a pod of 'g0' (4 GPUs): the largest node it may use, small, has 2 x A100-80GB"
    )
    assert oracle.never_fits(a_job("a").queue("q").gpus(4).build()) is None


def test_a_label_the_node_source_does_not_report_is_not_held_against_the_node() -> None:
    # the inventory reports a node's zone, not kubernetes.io/os: a pod asking for linux nodes (as
    # most do) is not declared unplaceable, and the scheduler, which sees every label, decides
    oracle = FreeShapeOracle([NodeFree("a", "a100", 8, labels={ZONE: "rack-a"})])
    linux = affinity(selector={"kubernetes.io/os": "linux", ZONE: "rack-a"})
    assert oracle.try_place(a_job("l").queue("q").on_nodes(linux).gpus(2).build(), ["a100"]) is not None
    amd64 = affinity({"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]})
    assert linux.may_match_node({ZONE: "rack-a"}) and amd64.may_match_node({ZONE: "rack-a"})
    # a key it does report still counts, in the selector and in the affinity terms
    assert not affinity(selector={"kubernetes.io/os": "linux", ZONE: "rack-b"}).may_match_node(
        {ZONE: "rack-a"}
    )
    other_zone = affinity({"key": ZONE, "operator": "NotIn", "values": ["rack-a"]})
    assert not other_zone.may_match_node({ZONE: "rack-a"})


def test_a_job_specs_template_carries_its_requirement_into_the_workload() -> None:
    template = {
        "spec": {
            "nodeSelector": {ZONE: "rack-b"},
            "containers": [{"name": "main", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}],
        }
    }
    spec = JobSpec.model_validate(
        {
            "name": "j",
            "tenant": "t",
            "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}, "template": template}],
        }
    )
    groups = groups_of(spec)
    config = QueueingConfig.build(flavors=(A100, H100), queues=(two_flavor_queue(),))
    workload = to_workload(
        "j",
        "q",
        groups,
        priority=0,
        created_at=0.0,
        preemptible=True,
        checkpointable=False,
        config=config,
        open_mode=False,
    )
    assert workload.pod_groups[0].node == affinity(selector={ZONE: "rack-b"})
    untemplated = JobSpec.model_validate(
        {"name": "j", "tenant": "t", "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}}]}
    )
    assert "node" not in groups_of(untemplated)[0], "nothing stored for pods that ask nothing"
