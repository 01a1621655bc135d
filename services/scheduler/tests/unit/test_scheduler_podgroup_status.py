"""A PodGroup's phase and counts from its pods, as the scheduler-plugins controller computes them."""

from __future__ import annotations

import pytest

from tessera.cluster.domain import Pod, PodGroup, PodPhase
from tessera.cluster.port import EventType, WatchEvent
from tessera.scheduler.entrypoints.podgroup_status import PodGroupStatusWriter, members, status_of


def pod(name: str, phase: PodPhase = PodPhase.PENDING, node: str | None = None, group: str = "g") -> Pod:
    return Pod("default", name, node_name=node, phase=phase, pod_group=group)


P, R, S, F = PodPhase.PENDING, PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED


@pytest.mark.parametrize(
    ("pods", "phase"),
    [
        ([], "Pending"),
        ([pod("a")], "Pending"),
        ([pod("a"), pod("b")], "PreScheduling"),
        ([pod("a", node="n"), pod("b")], "PreScheduling"),
        ([pod("a", node="n"), pod("b", node="n")], "Scheduled"),
        ([pod("a", R, "n"), pod("b", node="n")], "Scheduled"),
        ([pod("a", R, "n"), pod("b", R, "n")], "Running"),
        ([pod("a", S, "n"), pod("b", R, "n")], "Running"),
        ([pod("a", F, "n"), pod("b", R, "n")], "Failed"),
        ([pod("a", F, "n"), pod("b", node="n")], "Scheduled"),  # not enough ended or running yet
        ([pod("a", S, "n"), pod("b", S, "n")], "Finished"),
    ],
)
def test_the_phase_follows_the_members(pods: list[Pod], phase: str) -> None:
    assert status_of(PodGroup("default", "g", 2), pods)["phase"] == phase


def test_counts_and_a_final_phase_that_stays() -> None:
    pods = [pod("a", S, "n"), pod("b", F, "n"), pod("c", R, "m"), pod("d")]
    assert status_of(PodGroup("default", "g", 3), pods) == {
        "phase": "Failed",
        "scheduled": 3,
        "running": 1,
        "succeeded": 1,
        "failed": 1,
    }
    finished = PodGroup("default", "g", 2, phase="Finished")
    assert status_of(finished, [pod("a", F, "n"), pod("b", F, "n")])["phase"] == "Finished"


def test_members_are_the_pods_of_the_group_in_its_namespace() -> None:
    group = PodGroup("default", "g", 1)
    pods = [pod("a"), pod("b", group="other"), Pod("elsewhere", "c", pod_group="g"), pod("d", S, "n")]
    assert [p.name for p in members(pods, group)] == ["a", "d"]


async def test_only_changed_statuses_are_written_and_a_failed_write_is_tried_again() -> None:
    writes: list[tuple[str, str]] = []
    fail = [True]

    def patch(namespace: str, name: str, status: dict[str, object]) -> None:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("the API is away")
        writes.append((name, str(status["phase"])))

    writer = PodGroupStatusWriter(patch)
    group = PodGroup("default", "g", 1)
    writer.on_event("pod", WatchEvent(EventType.ADDED, pod("a"), "1"))
    assert writer.dirty == {"default/g"}
    assert await writer.write({"default/g": group}, [pod("a")]) == 0  # failed: marked again
    assert writer.dirty == {"default/g"}
    assert await writer.write({"default/g": group}, [pod("a")]) == 1
    writer.on_event(
        "podgroup", WatchEvent(EventType.MODIFIED, PodGroup("default", "g", 1, phase="PreScheduling"), "2")
    )
    unchanged = PodGroup("default", "g", 1, phase="PreScheduling")
    assert await writer.write({"default/g": unchanged}, [pod("a")]) == 0  # nothing new to say
    assert writes == [("g", "PreScheduling")]
