"""The framework runner: status semantics, cycle state, extension-point order, diagnosis."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tessera.scheduler.domain.framework.builders import make_node, make_pod
from tessera.scheduler.domain.framework.cycle_state import CycleState, StateKey
from tessera.scheduler.domain.framework.interfaces import FilterPlugin, PermitPlugin, ReservePlugin
from tessera.scheduler.domain.framework.pod import InvalidSpec, PodSpec
from tessera.scheduler.domain.framework.runtime import Framework, Profile, WeightedScore
from tessera.scheduler.domain.framework.status import Code, Diagnosis, Reason, Status
from tessera.scheduler.domain.snapshot import NodeInfo, Snapshot

SEEN: StateKey[list[str]] = StateKey("seen")


@dataclass
class Recorder:
    """A plugin at every extension point that records calls and answers as told."""

    name: str
    filter_status: Status = field(default_factory=Status.success)
    pre_status: Status = field(default_factory=Status.success)
    reserve_status: Status = field(default_factory=Status.success)
    permit_answer: tuple[Status, float] = (Status(), 0.0)
    score_of: dict[str, int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status:
        self.calls.append("pre_filter")
        state.write(SEEN, [])
        return self.pre_status

    def filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status:
        seen = state.get(SEEN)
        if seen is not None:
            seen.append(node.name)
        self.calls.append(f"filter:{node.name}")
        return self.filter_status

    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int:
        return self.score_of.get(node.name, 0)

    def reserve(self, state: CycleState, pod: PodSpec, node: str) -> Status:
        self.calls.append("reserve")
        return self.reserve_status

    def unreserve(self, state: CycleState, pod: PodSpec, node: str) -> None:
        self.calls.append("unreserve")

    def permit(self, state: CycleState, pod: PodSpec, node: str) -> tuple[Status, float]:
        return self.permit_answer

    def bind(self, state: CycleState, pod: PodSpec, node: str) -> Status:
        self.calls.append("bind")
        return Status.success()


def snapshot(*names: str) -> Snapshot:
    return Snapshot.of(make_node(name).gpus(8).build() for name in names)


def test_recorder_satisfies_every_protocol() -> None:
    plugin = Recorder("r")
    assert isinstance(plugin, FilterPlugin)
    assert isinstance(plugin, ReservePlugin)
    assert isinstance(plugin, PermitPlugin)


def test_pre_filter_state_is_read_back_by_filter_in_the_same_cycle() -> None:
    plugin = Recorder("r")
    framework = Framework(Profile(pre_filter=[plugin], filter=[plugin]))
    state = CycleState()
    result = framework.schedule_pod(state, make_pod("p"), snapshot("a", "b", "c"))
    assert result.ok
    assert state.read(SEEN) == ["a", "b", "c"]
    assert plugin.calls[0] == "pre_filter"


def test_pre_filter_skip_takes_the_plugin_out_of_filter() -> None:
    plugin = Recorder("r", pre_status=Status.skip(), filter_status=Status.unschedulable("never"))
    framework = Framework(Profile(pre_filter=[plugin], filter=[plugin]))
    result = framework.schedule_pod(CycleState(), make_pod("p"), snapshot("a"))
    assert result.node == "a"
    assert not any(call.startswith("filter") for call in plugin.calls)


def test_pre_filter_rejection_is_a_whole_pod_diagnosis() -> None:
    plugin = Recorder("r", pre_status=Status.unresolvable("gang missing"))
    result = Framework(Profile(pre_filter=[plugin])).schedule_pod(CycleState(), make_pod("p"), snapshot("a"))
    assert result.node is None and result.diagnosis is not None
    assert result.diagnosis.pre_filter is not None
    assert result.diagnosis.pre_filter.plugin == "r"
    assert result.diagnosis.message() == "gang missing"


def test_reading_state_no_pre_filter_wrote_names_the_key() -> None:
    with pytest.raises(KeyError, match="seen"):
        CycleState().read(SEEN)


def test_highest_weighted_score_wins_and_ties_go_to_snapshot_order() -> None:
    low = Recorder("low", score_of={"a": 10, "b": 60, "c": 60})
    high = Recorder("high", score_of={"a": 40, "b": 0, "c": 0})
    framework = Framework(Profile(score=[WeightedScore(low, 1), WeightedScore(high, 1)]))
    assert framework.schedule_pod(CycleState(), make_pod("p"), snapshot("a", "b", "c")).node == "b"
    weighted = Framework(Profile(score=[WeightedScore(low, 1), WeightedScore(high, 3)]))
    assert weighted.schedule_pod(CycleState(), make_pod("p"), snapshot("a", "b", "c")).node == "a"


def test_a_score_outside_0_to_100_is_an_error() -> None:
    bad = Recorder("bad", score_of={"a": 101})
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        Framework(Profile(score=[WeightedScore(bad)])).schedule_pod(
            CycleState(), make_pod("p"), snapshot("a", "b")
        )


def test_unschedulable_nodes_are_rejected_before_any_filter() -> None:
    plugin = Recorder("r")
    snap = Snapshot.of([make_node("a").gpus(8).cordoned().build(), make_node("b").gpus(8).build()])
    result = Framework(Profile(filter=[plugin])).schedule_pod(CycleState(), make_pod("p"), snap)
    assert result.node == "b"
    assert "filter:a" not in plugin.calls


def test_a_failed_reserve_unreserves_every_reserve_plugin() -> None:
    first, second = Recorder("first"), Recorder("second", reserve_status=Status.error("disk full"))
    framework = Framework(Profile(reserve=[first, second]))
    status = framework.run_reserve(CycleState(), make_pod("p"), "a")
    assert status.code is Code.ERROR and status.plugin == "second"
    assert first.calls == ["reserve", "unreserve"]
    assert second.calls == ["reserve", "unreserve"]


@pytest.mark.parametrize(
    ("answers", "code", "timeout"),
    [
        ([(Status(), 0.0), (Status(), 0.0)], Code.SUCCESS, 0.0),
        ([(Status.wait(), 30.0), (Status.wait(), 10.0)], Code.WAIT, 10.0),
        ([(Status.wait(), 30.0), (Status.unschedulable("no"), 0.0)], Code.UNSCHEDULABLE, 0.0),
        ([(Status(), 0.0), (Status.wait(), 5.0)], Code.WAIT, 5.0),
    ],
)
def test_permit_rejection_wins_and_wait_takes_the_shortest_timeout(
    answers: list[tuple[Status, float]], code: Code, timeout: float
) -> None:
    plugins = [Recorder(f"p{i}", permit_answer=answer) for i, answer in enumerate(answers)]
    status, got = Framework(Profile(permit=plugins)).run_permit(CycleState(), make_pod("p"), "a")
    assert (status.code, got) == (code, timeout)


def test_a_plugin_listed_twice_is_refused() -> None:
    plugin = Recorder("dup")
    with pytest.raises(ValueError, match=r"profile\.filter"):
        Profile(filter=[plugin, plugin])


def test_bind_without_a_bind_plugin_is_an_error() -> None:
    assert Framework(Profile()).run_bind(CycleState(), make_pod("p"), "a").code is Code.ERROR


def test_diagnosis_message_counts_nodes_per_reason_largest_first() -> None:
    diagnosis = Diagnosis(
        {Reason.UNHEALTHY_GPU: 3, Reason.INSUFFICIENT_GPU: 1102, Reason.MODEL_NOT_ALLOWED: 96}, 1201
    )
    assert (
        diagnosis.message() == "insufficient GPU on 1,102 nodes; model not allowed on 96; unhealthy GPU on 3"
    )


def test_diagnosis_of_statuses_counts_each_reason() -> None:
    statuses = [Status.unschedulable(Reason.INSUFFICIENT_GPU)] * 2 + [
        Status.unresolvable(Reason.MODEL_NOT_ALLOWED)
    ]
    assert Diagnosis.of(statuses, 3).message() == "insufficient GPU on 2 nodes; model not allowed on 1"
    assert (
        Diagnosis.of([Status.unschedulable(Reason.INSUFFICIENT_GPU)], 1).message()
        == "insufficient GPU on 1 node"
    )


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"gpu_count": -1}, "gpu_count"),
        ({"gpu_count": 2, "gpu_milli": 500}, "gpu_milli"),
        ({"gpu_count": 1, "gpu_milli": 0}, "gpu_milli"),
        ({"cpu_milli": -5}, "cpu_milli"),
        ({"gang": ""}, "gang"),
    ],
)
def test_bad_pod_specs_name_the_field(kwargs: dict[str, object], field_name: str) -> None:
    args: dict[str, object] = {"name": "p", "gang": "g"} | kwargs
    with pytest.raises(InvalidSpec) as error:
        PodSpec(**args)  # type: ignore[arg-type]
    assert error.value.field.endswith(field_name)


def test_pod_from_resources_reads_gpu_and_mig_resources() -> None:
    pod = PodSpec.from_resources("p", "g", {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 3})
    assert pod.gpu_count == 2
    assert dict(pod.mig) == {"1g.10gb": 3}
    with pytest.raises(InvalidSpec, match=r"example\.com/fpga"):
        PodSpec.from_resources("p", "g", {"example.com/fpga": 1})
