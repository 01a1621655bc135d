"""A Job's `podFailurePolicy`: which rule, if any, a failed pod matches, and what it asks for.

Rules are tried in order and the first that matches decides: `FailJob` fails the Job at once,
`Ignore` does not count the failure against `backoffLimit`, `Count` (and `FailIndex`, which needs
`backoffLimitPerIndex`, not simulated) counts it. `onExitCodes` matches a container that ended with
a non-zero code `In` or `NotIn` the values (optionally one named container); `onPodConditions`
matches a condition the pod carries with the given status (`True` by default), such as the
`DisruptionTarget` that evictions and node loss leave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    action: str
    message: str


def evaluate(policy: dict[str, Any] | None, pod: dict[str, Any]) -> Verdict | None:
    """The first rule the failed pod matches, or None (count it, as without a policy)."""
    if not policy:
        return None
    meta = pod["metadata"]
    for index, rule in enumerate(policy.get("rules") or []):
        action = str(rule.get("action", "Count"))
        on_exit = rule.get("onExitCodes")
        if on_exit:
            match = _exit_code_match(on_exit, pod)
            if match is not None:
                container, code = match
                return Verdict(
                    action,
                    f"Container {container} for pod {meta.get('namespace')}/{meta['name']} failed with "
                    f"exit code {code} matching {action} rule at index {index}",
                )
        for wanted in rule.get("onPodConditions") or []:
            if _has_condition(pod, str(wanted.get("type")), str(wanted.get("status", "True"))):
                return Verdict(
                    action,
                    f"Pod {meta.get('namespace')}/{meta['name']} has condition {wanted.get('type')} "
                    f"matching {action} rule at index {index}",
                )
    return None


def _exit_code_match(rule: dict[str, Any], pod: dict[str, Any]) -> tuple[str, int] | None:
    status = pod.get("status") or {}
    values = {int(v) for v in rule.get("values") or []}
    operator = rule.get("operator", "In")
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        if rule.get("containerName") and container.get("name") != rule["containerName"]:
            continue
        terminated = (container.get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        if code is None or int(code) == 0:
            continue
        if (int(code) in values) == (operator == "In"):
            return str(container.get("name")), int(code)
    return None


def _has_condition(pod: dict[str, Any], kind: str, value: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == value
        for c in (pod.get("status") or {}).get("conditions") or []
    )
