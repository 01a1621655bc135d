"""Server-side apply, simplified, and the resource types a CustomResourceDefinition serves."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.devcluster.apiserver import ApiError, ObjectStore
from tessera.devcluster.apiserver.resources import (
    CUSTOMRESOURCEDEFINITIONS,
    DEPLOYMENTS,
    ResourceType,
    crd_resource_types,
)
from tessera.devcluster.apiserver.semantics import prepare_for_create


def deployment(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}},
        },
    }


def test_apply_creates_then_merges_the_configuration_into_the_object() -> None:
    store = ObjectStore()
    created, was_created = store.apply(DEPLOYMENTS, "ns", "web", deployment(tier="a"))
    assert was_created and created["metadata"]["namespace"] == "ns" and created["status"] == {}

    config = deployment(team="b")
    config["spec"] = {"replicas": 3}
    updated, was_created = store.apply(DEPLOYMENTS, "ns", "web", config)

    assert not was_created
    assert updated["spec"] == {**created["spec"], "replicas": 3}
    # no field ownership: the label an earlier configuration set stays
    assert updated["metadata"]["labels"] == {"tier": "a", "team": "b"}
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])


def test_applying_the_same_configuration_again_writes_nothing() -> None:
    store = ObjectStore()
    first, _ = store.apply(DEPLOYMENTS, "ns", "web", deployment(tier="a"))
    again, _ = store.apply(DEPLOYMENTS, "ns", "web", deployment(tier="a"))
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


@pytest.mark.parametrize(
    "config",
    [
        {**deployment(), "kind": "StatefulSet"},
        {**deployment(), "metadata": {"name": "other"}},
        ["not", "an", "object"],
    ],
    ids=["wrong kind", "other name", "not an object"],
)
def test_a_configuration_for_another_object_is_a_bad_request(config: Any) -> None:
    with pytest.raises(ApiError) as caught:
        ObjectStore().apply(DEPLOYMENTS, "ns", "web", config)
    assert caught.value.code == 400


def crd(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}},
                {"name": "v1beta1", "served": False, "storage": False},
            ],
            **spec,
        },
    }


def test_a_crd_serves_each_of_its_served_versions() -> None:
    assert crd_resource_types(crd()) == [
        ResourceType("example.com", "v1", "widgets", "Widget", False, ("wd",), frozenset({"status"}))
    ]
    assert crd_resource_types({"spec": {}}) == []


def test_a_created_crd_is_established_with_its_names() -> None:
    obj = crd()
    prepare_for_create(CUSTOMRESOURCEDEFINITIONS, obj)
    status = obj["status"]
    assert status["acceptedNames"]["kind"] == "Widget" and status["storedVersions"] == ["v1"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "NamesAccepted": "True",
        "Established": "True",
    }
