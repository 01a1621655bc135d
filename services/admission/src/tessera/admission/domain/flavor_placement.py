"""Putting an admitted job's pods on its flavor's nodes. Pure: manifests only.

When admission unsuspends a job's batch/v1 Jobs it writes each pod group's flavor into its Job's pod
template, as Kueue does: the flavor's node labels into `nodeSelector`, its tolerations into
`tolerations`. Kubernetes allows that change while a Job is suspended and has not started (its
`startTime` is cleared while it is suspended), and the scheduler honours both. What admission added
is recorded on the Job (`tessera.io/flavor-injected`), so a job admitted again in another flavor
(after a preemption) loses the old flavor's selector and keeps the user's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.admission.domain.queueing import FlavorSpec

FLAVOR_ANNOTATION = "tessera.io/flavor"
"""The flavor admission admitted the Job's pods in."""
INJECTED_ANNOTATION = "tessera.io/flavor-injected"
"""JSON: the `nodeSelector` entries and `tolerations` admission added to the Job's pod template."""


@dataclass(frozen=True)
class FlavorPlacement:
    """Where a pod group's pods go: its flavor's node labels and tolerations."""

    flavor: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


def placement_of(flavor: str, specs: Mapping[str, FlavorSpec]) -> FlavorPlacement:
    """A flavor the configuration does not describe (open mode's `any`) puts pods anywhere."""
    spec = specs.get(flavor)
    if spec is None:
        return FlavorPlacement(flavor)
    return FlavorPlacement(flavor, dict(spec.node_labels), tuple(dict(t) for t in spec.tolerations))


def template_patch(job: Mapping[str, Any], placement: FlavorPlacement) -> dict[str, Any] | None:
    """The JSON merge patch that puts the Job's pods on ``placement``, or None when they go there
    already. The user's own nodeSelector entries and tolerations are kept; the flavor's win a clash."""
    meta = job.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    pod = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    current_selector: dict[str, str] = dict(pod.get("nodeSelector") or {})
    current_tolerations: list[dict[str, Any]] = [dict(t) for t in pod.get("tolerations") or []]
    before = _injected(annotations.get(INJECTED_ANNOTATION))
    if not (placement.node_selector or placement.tolerations or INJECTED_ANNOTATION in annotations):
        return None  # a flavor that names no nodes, and nothing of an earlier one to take away
    own_selector = {k: v for k, v in current_selector.items() if before["nodeSelector"].get(k) != v}
    own_tolerations = [t for t in current_tolerations if t not in before["tolerations"]]
    selector = {**own_selector, **placement.node_selector}
    added = [dict(t) for t in placement.tolerations if dict(t) not in own_tolerations]
    tolerations = own_tolerations + added
    record = json.dumps({"nodeSelector": dict(placement.node_selector), "tolerations": added}, sort_keys=True)
    if (
        selector == current_selector
        and tolerations == current_tolerations
        and annotations.get(FLAVOR_ANNOTATION) == placement.flavor
        and annotations.get(INJECTED_ANNOTATION) == record
    ):
        return None
    # A merge patch removes a map entry set to null (the whole map when it ends empty); a list is
    # replaced whole.
    selector_patch: dict[str, str | None] | None = None
    if selector:
        selector_patch = {k: None for k in current_selector if k not in selector}
        selector_patch.update(selector)
    return {
        "metadata": {"annotations": {FLAVOR_ANNOTATION: placement.flavor, INJECTED_ANNOTATION: record}},
        "spec": {"template": {"spec": {"nodeSelector": selector_patch, "tolerations": tolerations or None}}},
    }


def _injected(raw: str | None) -> dict[str, Any]:
    empty: dict[str, Any] = {"nodeSelector": {}, "tolerations": []}
    if not raw:
        return empty
    try:
        data = json.loads(raw)
    except ValueError:
        return empty
    if not isinstance(data, dict):
        return empty
    selector = data.get("nodeSelector")
    tolerations = data.get("tolerations")
    return {
        "nodeSelector": selector if isinstance(selector, dict) else {},
        "tolerations": tolerations if isinstance(tolerations, list) else [],
    }


def jobset_placed(
    rjobs: Sequence[Mapping[str, Any]], placements: Sequence[FlavorPlacement | None]
) -> list[dict[str, Any]]:
    """A JobSet's replicated jobs with each one's pods put on its placement (in order), as the whole
    list a merge patch must carry; empty when none changes. Each replicated job's Job template has a
    Job's shape, so `template_patch` applies to it; the JobSet controller carries the pod template's
    nodeSelector and tolerations to the child Jobs when it resumes them."""
    placed: list[dict[str, Any]] = []
    changed = False
    for i, rjob in enumerate(rjobs):
        placement = placements[i] if i < len(placements) else None
        template = rjob.get("template") or {}
        patch = template_patch(template, placement) if placement is not None else None
        changed = changed or patch is not None
        placed.append({**rjob, "template": merge_patched(template, patch)} if patch else dict(rjob))
    return placed if changed else []


def merge_patched(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7386)."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            base = result.get(key)
            result[key] = merge_patched(base if isinstance(base, Mapping) else {}, value)
        else:
            result[key] = value
    return result


def pod_release_spec(pod_spec: Mapping[str, Any], placement: FlavorPlacement) -> dict[str, Any]:
    """What a gated pod's spec gains as its gate goes, to put it on ``placement``: the flavor's node
    labels its `nodeSelector` lacks, and the flavor's tolerations it lacks. Kubernetes lets a gated pod
    gain `nodeSelector` entries and tolerations, never change or lose one, so a key the pod already
    selects keeps its value (a flavor that contradicts the pod's selector is never chosen for it)."""
    current: dict[str, str] = dict(pod_spec.get("nodeSelector") or {})
    tolerations: list[dict[str, Any]] = [dict(t) for t in pod_spec.get("tolerations") or []]
    patch: dict[str, Any] = {}
    added = {k: v for k, v in placement.node_selector.items() if k not in current}
    if added:
        patch["nodeSelector"] = {**current, **added}
    missing = [dict(t) for t in placement.tolerations if dict(t) not in tolerations]
    if missing:
        patch["tolerations"] = tolerations + missing
    return patch
