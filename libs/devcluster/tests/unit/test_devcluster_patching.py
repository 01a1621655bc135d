"""JSON patch, merge patch and strategic merge patch."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.patching import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)

NODE: dict[str, Any] = {
    "metadata": {"name": "n", "labels": {"a": "1", "b": "2"}},
    "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
    "status": {
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]
    },
}


def test_merge_patch_merges_maps_deletes_nulls_and_replaces_lists() -> None:
    patched = merge_patch(NODE, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"taints": []}})

    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert patched["spec"]["taints"] == []
    assert NODE["metadata"]["labels"] == {"a": "1", "b": "2"}  # the input is left alone


def test_strategic_merge_patch_merges_lists_by_their_key() -> None:
    patched = strategic_merge_patch(NODE, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})

    assert patched["status"]["conditions"] == [
        {"type": "Ready", "status": "False"},
        {"type": "DiskPressure", "status": "False"},
    ]


def test_strategic_merge_patch_honours_delete_and_replace_directives() -> None:
    deleted = strategic_merge_patch(NODE, {"spec": {"taints": [{"key": "gpu", "$patch": "delete"}]}})
    replaced = strategic_merge_patch(NODE, {"metadata": {"labels": {"$patch": "replace", "only": "me"}}})

    assert deleted["spec"]["taints"] == []
    assert replaced["metadata"]["labels"] == {"only": "me"}


@pytest.mark.parametrize(
    ("operations", "expected_labels"),
    [
        ([{"op": "add", "path": "/metadata/labels/c", "value": "3"}], {"a": "1", "b": "2", "c": "3"}),
        ([{"op": "remove", "path": "/metadata/labels/a"}], {"b": "2"}),
        ([{"op": "replace", "path": "/metadata/labels/b", "value": "9"}], {"a": "1", "b": "9"}),
        ([{"op": "move", "from": "/metadata/labels/a", "path": "/metadata/labels/z"}], {"b": "2", "z": "1"}),
        (
            [{"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/z"}],
            {"a": "1", "b": "2", "z": "1"},
        ),
        ([{"op": "test", "path": "/metadata/labels/a", "value": "1"}], {"a": "1", "b": "2"}),
    ],
)
def test_json_patch_operations(operations: list[dict[str, Any]], expected_labels: dict[str, str]) -> None:
    assert json_patch(NODE, operations)["metadata"]["labels"] == expected_labels


@pytest.mark.parametrize(
    "operations",
    [
        [{"op": "test", "path": "/metadata/labels/a", "value": "2"}],
        [{"op": "remove", "path": "/metadata/labels/none"}],
        [{"op": "frobnicate", "path": "/metadata"}],
        [{"path": "/metadata"}],
    ],
)
def test_json_patch_failures_are_bad_requests(operations: list[dict[str, Any]]) -> None:
    with pytest.raises(ApiError) as caught:
        json_patch(NODE, operations)
    assert caught.value.code == 400


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (JSON_PATCH, [{"op": "add", "path": "/spec/unschedulable", "value": True}]),
        (MERGE_PATCH, {"spec": {"unschedulable": True}}),
        (STRATEGIC_MERGE_PATCH + "; charset=utf-8", {"spec": {"unschedulable": True}}),
    ],
)
def test_apply_patch_picks_the_flavour_by_content_type(content_type: str, body: Any) -> None:
    assert apply_patch(NODE, body, content_type)["spec"]["unschedulable"] is True


def test_server_side_apply_is_refused_with_415() -> None:
    with pytest.raises(ApiError) as caught:
        apply_patch(NODE, {}, "application/apply-patch+yaml")
    assert caught.value.code == 415
