"""The slicing events: their subjects, what they refuse, and that they survive a JSON round trip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tessera.contracts import subjects
from tessera.contracts.events import BY_TYPE
from tessera.contracts.slicing import GpuLayoutSpec, LayoutPlanned, ReconfigFailed, Reconfigured

MIG_GPU = GpuLayoutSpec(index=0, kind="mig", mig_profiles=["3g.40gb", "3g.40gb"])


def test_slicing_events_go_to_the_slicing_stream_and_are_registered() -> None:
    for message, name in [
        (LayoutPlanned, "layout_planned"),
        (Reconfigured, "reconfigured"),
        (ReconfigFailed, "reconfig_failed"),
    ]:
        assert f"tessera.slicing.evt.{name}" == message.SUBJECT
        assert message.SUBJECT.startswith(subjects.stream_subjects("slicing")[:-1])
        assert BY_TYPE[message.TYPE] is message


def test_a_planned_layout_round_trips_and_is_keyed_by_its_node() -> None:
    planned = LayoutPlanned(
        operation_id="op-1",
        node="a100-0",
        kind="mig",
        config="tessera-a100-0-1",
        gpus=[MIG_GPU],
        drain=False,
        reason="1 pending pod wants nvidia.com/mig-3g.40gb",
    )
    assert LayoutPlanned.model_validate_json(planned.model_dump_json()) == planned
    assert planned.key() == "a100-0"


def test_replicas_below_one_and_an_unknown_outcome_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="replicas"):
        GpuLayoutSpec(index=0, kind="time_slicing", replicas=0)
    with pytest.raises(ValidationError, match="outcome"):
        ReconfigFailed.model_validate(
            {
                "operation_id": "op-1",
                "node": "a100-0",
                "kind": "mig",
                "config": "c",
                "outcome": "half_done",
                "attempts": 3,
                "reason": "x",
            }
        )


def test_reconfigured_carries_the_resources_the_node_advertises() -> None:
    done = Reconfigured(
        operation_id="op-1",
        node="a100-0",
        kind="mig",
        config="c",
        gpus=[MIG_GPU],
        attempts=2,
        duration_s=4.5,
        resources={"nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu": 7},
        reason="r",
    )
    assert Reconfigured.model_validate(done.model_dump(mode="json")).resources["nvidia.com/mig-3g.40gb"] == 2
