"""Reading a node's termination marks: the default taints of the AWS Node Termination Handler,
Karpenter and GKE, configured labels, and the deadline an annotation may carry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tessera.checkpoint.config import CheckpointSettings
from tessera.checkpoint.domain.signals import NodeSignal, NodeState, TerminationPolicy, parse_time

NOW = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)


def policy(**spot: object) -> TerminationPolicy:
    return CheckpointSettings.model_validate({"spot": spot}).spot.policy()


@pytest.mark.parametrize(
    ("taint", "reason"),
    [
        ("aws-node-termination-handler/spot-itn", "spot_interruption"),
        ("aws-node-termination-handler/rebalance-recommendation", "spot_interruption"),
        ("aws-node-termination-handler/scheduled-maintenance", "node_termination"),
        ("aws-node-termination-handler/asg-lifecycle-termination", "node_termination"),
        ("karpenter.sh/disrupted", "node_termination"),
        ("karpenter.sh/disruption", "node_termination"),
        ("cloud.google.com/impending-node-termination", "spot_interruption"),
    ],
)
def test_the_default_taints_announce_the_end_with_30s_notice(taint: str, reason: str) -> None:
    node = NodeState("gpu-0", taints={taint: "evt-1", "nvidia.com/gpu": "present"})
    assert policy().signals(node, NOW) == [
        NodeSignal("gpu-0", f"taint:{taint}", "evt-1", reason, NOW, NOW + timedelta(seconds=30))
    ]


def test_an_unmarked_node_has_no_signal() -> None:
    node = NodeState("gpu-0", labels={"karpenter.sh/capacity-type": "spot"}, taints={"dedicated": "gpu"})
    assert policy().signals(node, NOW) == []


def test_labels_match_by_key_or_by_value_when_configured() -> None:
    labelled = policy(
        labels={"example.com/draining": "node_termination", "lifecycle=Terminating": "spot_interruption"}
    )
    node = NodeState("n", labels={"example.com/draining": "yes", "lifecycle": "Terminating"})
    assert [(s.key, s.reason) for s in labelled.signals(node, NOW)] == [
        ("label:example.com/draining", "node_termination"),
        ("label:lifecycle", "spot_interruption"),
    ]
    assert labelled.signals(NodeState("n", labels={"lifecycle": "Ec2Spot"}), NOW) == []


def test_a_deadline_annotation_replaces_the_notice() -> None:
    node = NodeState(
        "n",
        taints={"karpenter.sh/disrupted": ""},
        annotations={"karpenter.sh/nodeclaim-termination-timestamp": "2026-11-24T09:02:00Z"},
    )
    [signal] = policy(notice_s=5).signals(node, NOW)
    assert signal.deadline == NOW + timedelta(minutes=2)
    tessera = NodeState(
        "n",
        taints={"karpenter.sh/disrupted": ""},
        annotations={"tessera.io/termination-deadline": str(NOW.timestamp() + 90)},
    )
    assert policy().signals(tessera, NOW)[0].deadline == NOW + timedelta(seconds=90)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-24T09:00:00Z", NOW),
        ("2026-11-24T10:00:00+01:00", NOW),
        ("2026-11-24T09:00:00", NOW),
        (str(int(NOW.timestamp())), NOW),
        ("soon", None),
        ("", None),
    ],
)
def test_times_parse_as_rfc3339_or_unix_seconds(text: str, expected: datetime | None) -> None:
    assert parse_time(text) == expected


def test_the_lists_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_CHECKPOINT_SPOT__TAINTS", '{"example.com/going": "node_termination"}')
    monkeypatch.setenv("TESSERA_CHECKPOINT_SPOT__NOTICE_S", "120")
    configured = CheckpointSettings().spot.policy()
    assert dict(configured.taints) == {"example.com/going": "node_termination"}
    assert configured.notice == timedelta(minutes=2)
