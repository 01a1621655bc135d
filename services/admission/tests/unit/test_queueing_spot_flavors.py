"""Spot flavors: preemptible jobs try spot capacity first, jobs that may not be preempted stay on
on-demand capacity unless their queue offers nothing else; a node's flavor follows its labels; the
flavor document checks its capacity type, node labels and tolerations."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tessera.admission.domain.documents import FlavorDoc, QueueingDocument, StoredConfig
from tessera.admission.domain.queueing import (
    Admit,
    CapacityType,
    FlavorSpec,
    FreeShapeOracle,
    NodeFree,
    QueueingConfig,
    QueueingEngine,
    QueueingValidationError,
    QueueSpec,
)
from tessera.admission.domain.queueing.builders import a_job, a_queue
from tessera.admission.domain.queueing.flavors import candidate_flavors, flavor_of_node
from tessera.admission.domain.workloads import to_workload

SPOT_LABELS = {"karpenter.sh/capacity-type": "spot"}
ON_DEMAND = FlavorSpec(
    "a100", "A100-80GB", CapacityType.ON_DEMAND, {"karpenter.sh/capacity-type": "on-demand"}
)
SPOT = FlavorSpec("a100-spot", "A100-80GB", CapacityType.SPOT, SPOT_LABELS)


def engine_of(*queues: QueueSpec, flavors: tuple[FlavorSpec, ...] = (ON_DEMAND, SPOT)) -> QueueingEngine:
    return QueueingEngine(QueueingConfig.build(flavors=flavors, queues=queues))


def admitted(engine: QueueingEngine) -> dict[str, tuple[str, ...]]:
    return {d.job: d.flavors for d in engine.run_cycle(0.0).decisions if isinstance(d, Admit)}


def mixed_queue(*order: str, gpus: int = 8) -> QueueSpec:
    builder = a_queue("q")
    for flavor in order:
        builder = builder.nominal(flavor, gpu=gpus)
    return builder.build()


def test_a_preemptible_job_goes_to_spot_even_when_the_queue_lists_on_demand_first() -> None:
    engine = engine_of(mixed_queue("a100", "a100-spot"))
    engine.submit(a_job("trainer").queue("q").gpus(4).build())
    engine.submit(a_job("server").queue("q").gpus(4).not_preemptible().build())
    assert admitted(engine) == {"trainer": ("a100-spot",), "server": ("a100",)}


def test_a_preemptible_job_falls_back_to_on_demand_when_spot_quota_is_used_up() -> None:
    engine = engine_of(mixed_queue("a100-spot", "a100", gpus=4))
    for name in ("first", "second"):
        engine.submit(a_job(name).queue("q").gpus(4).build())
    assert admitted(engine) == {"first": ("a100-spot",), "second": ("a100",)}


def test_a_job_that_may_not_be_preempted_never_takes_spot_while_on_demand_exists() -> None:
    queue = a_queue("q").nominal("a100-spot", gpu=8).nominal("a100", gpu=4).build()
    engine = engine_of(queue)
    with pytest.raises(QueueingValidationError, match="at most 4 in flavor a100"):
        engine.submit(a_job("big").queue("q").gpus(8).not_preemptible().build())
    engine.submit(a_job("spot-ok").queue("q").gpus(8).build())
    engine.submit(a_job("server").queue("q").gpus(1).not_preemptible().build())
    assert admitted(engine) == {"spot-ok": ("a100-spot",), "server": ("a100",)}


def test_with_no_spot_node_free_a_preemptible_job_runs_on_demand_instead() -> None:
    engine = engine_of(mixed_queue("a100-spot", "a100"))
    engine.submit(a_job("trainer").queue("q").gpus(4).build())
    engine.submit(a_job("second").queue("q").gpus(4).build())
    oracle = FreeShapeOracle([NodeFree("od-0", "a100", 4), NodeFree("spot-0", "a100-spot", 0)])
    result = engine.run_cycle(0.0, oracle)
    assert {d.job: d.flavors for d in result.decisions if isinstance(d, Admit)} == {"trainer": ("a100",)}
    assert engine.wait_reason("second") is not None, "no node of either flavor is free for it"


def test_a_spot_only_queue_admits_a_job_that_may_not_be_preempted_on_spot() -> None:
    engine = engine_of(mixed_queue("a100-spot"))
    engine.submit(a_job("server").queue("q").gpus(2).not_preemptible().build())
    assert admitted(engine) == {"server": ("a100-spot",)}


def test_candidate_order_keeps_the_queue_order_within_each_capacity_type() -> None:
    queue = mixed_queue("od-1", "spot-1", "od-2", "spot-2")
    group = a_job("j").queue("q").gpus(1).build().pod_groups[0]
    spot = {"spot-1", "spot-2"}
    assert candidate_flavors(queue, group, True, spot) == ["spot-1", "spot-2", "od-1", "od-2"]
    assert candidate_flavors(queue, group, False, spot) == ["od-1", "od-2"]
    assert candidate_flavors(queue, group, True, ()) == ["od-1", "spot-1", "od-2", "spot-2"], (
        "no spot: Kueue's"
    )


def test_a_node_is_the_flavor_whose_labels_it_carries() -> None:
    plain = FlavorSpec("a100-any", "A100-80GB")
    flavors = [plain, ON_DEMAND, SPOT]
    assert flavor_of_node("A100-80GB", SPOT_LABELS, flavors) == "a100-spot"
    assert flavor_of_node("a100-80gb", {"karpenter.sh/capacity-type": "on-demand"}, flavors) == "a100"
    assert flavor_of_node("A100-80GB", {}, flavors) == "a100-any", "no labels: the flavor that needs none"
    assert flavor_of_node("A100-80GB", {}, [ON_DEMAND, SPOT]) is None
    assert flavor_of_node("H100-80GB", SPOT_LABELS, flavors) is None, "another GPU model"


def test_a_gpu_model_a_job_asks_for_allows_every_flavor_of_that_model() -> None:
    config = QueueingConfig.build(flavors=(ON_DEMAND, SPOT), queues=[mixed_queue("a100", "a100-spot")])
    groups = [{"name": "w", "count": 1, "requests": {"gpu": 1}, "flavors": ["a100-80gb"]}]
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
    assert workload.pod_groups[0].flavors == {"a100", "a100-spot"}


def test_the_flavor_document_carries_capacity_type_node_labels_and_tolerations() -> None:
    doc = QueueingDocument.model_validate(
        {
            "flavors": [
                {"name": "a100-80gb", "gpu_model": "A100-80GB"},
                {
                    "name": "a100-80gb-spot",
                    "gpu_model": "A100-80GB",
                    "capacity_type": "spot",
                    "node_labels": SPOT_LABELS,
                    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
                },
            ],
            "queues": [{"name": "q", "quotas": [{"flavor": "a100-80gb-spot", "resources": {"gpu": 8}}]}],
        }
    )
    config = StoredConfig().merged(doc).build()
    assert config.spot_flavors == {"a100-80gb-spot"}
    spot = config.flavor_specs["a100-80gb-spot"]
    assert dict(spot.node_labels) == SPOT_LABELS
    assert spot.tolerations == ({"operator": "Exists", "key": "spot", "effect": "NoSchedule"},)
    assert config.flavor_specs["a100-80gb"].capacity_type is CapacityType.ON_DEMAND, "the default"


@pytest.mark.parametrize(
    ("flavor", "where"),
    [
        ({"capacity_type": "preemptible"}, ("capacity_type",)),
        ({"node_labels": {"bad key!": "x"}}, ("node_labels", "bad key!", "[key]")),
        (
            {"node_labels": {"karpenter.sh/capacity-type": "not a value"}},
            ("node_labels", "karpenter.sh/capacity-type"),
        ),
        ({"node_labels": {"a/b/c": "x"}}, ("node_labels", "a/b/c", "[key]")),
        ({"tolerations": [{"operator": "Sometimes"}]}, ("tolerations", 0, "operator")),
        (
            {"tolerations": [{"effect": "NoExecute", "toleration_seconds": -1}]},
            ("tolerations", 0, "toleration_seconds"),
        ),
    ],
)
def test_a_bad_flavor_is_refused_naming_the_field(
    flavor: dict[str, object], where: tuple[object, ...]
) -> None:
    with pytest.raises(ValidationError) as caught:
        FlavorDoc.model_validate({"name": "a100", **flavor})
    assert [e["loc"] for e in caught.value.errors()] == [where]
