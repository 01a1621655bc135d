"""A JobSet's conditions are `metav1.Condition`s: admission writes its own beside the JobSet
controller's without `lastProbeTime` and with reasons the schema accepts (CamelCase, no spaces)."""

from __future__ import annotations

import re

from tessera.admission.domain.job_conditions import (
    Condition,
    JobStatusView,
    condition_reason,
    conditions_for,
    merged,
)
from tessera.admission.domain.model import JobState

METAV1_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
"""The pattern `metav1.Condition.reason` must match."""


def test_jobset_conditions_have_no_probe_time_and_keep_the_controllers_own() -> None:
    controller = {
        "type": "Suspended",
        "status": "True",
        "reason": "SuspendedJobs",
        "message": "jobset is suspended",
        "lastTransitionTime": "t0",
    }
    waiting = conditions_for(JobStatusView(JobState.QUEUED, "team-a", ("QuotaExhausted", "needs 6 GPUs")))
    change = merged([controller], waiting, "t1", probe=False)
    assert change is not None
    written, changed = change
    assert written[0] == controller
    ours = {c["type"]: c for c in written[1:]}
    assert set(ours) == {"QuotaReserved", "Admitted", "Inadmissible"}
    assert all("lastProbeTime" not in c for c in ours.values())
    assert ours["QuotaReserved"] == {
        "type": "QuotaReserved",
        "status": "False",
        "reason": "QuotaExhausted",
        "message": "queue team-a: needs 6 GPUs",
        "lastTransitionTime": "t1",
    }
    assert len(changed) == 3
    assert merged(written, waiting, "t2", probe=False) is None, "written as it is: nothing changed"


def test_a_reason_with_spaces_or_other_characters_becomes_a_valid_camel_case_reason() -> None:
    for reason, expected in (
        ("QuotaExhausted", "QuotaExhausted"),
        ("no node shape holds", "NoNodeShapeHolds"),
        ("9 lives-left", "LivesLeft"),
        ("...", "Unknown"),
    ):
        assert condition_reason(reason) == expected
        assert METAV1_REASON.match(condition_reason(reason))
    odd = [Condition("QuotaReserved", False, "waiting for room", "m")]
    change = merged([], odd, "t", probe=False)
    assert change is not None and change[0][0]["reason"] == "WaitingForRoom"
    assert merged(change[0], odd, "t2", probe=False) is None, "the sanitised reason counts as unchanged"
