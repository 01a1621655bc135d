"""The shipped PodGroup CRD agrees with the conventions and accepts the manifests we build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from tessera.cluster.builders import pod_group_manifest
from tessera.cluster.conventions import (
    POD_GROUP_API_GROUP,
    POD_GROUP_KIND,
    POD_GROUP_PLURAL,
    POD_GROUP_VERSION,
    parse_pod_group,
)

CRD = Path(__file__).resolve().parents[4] / "deploy" / "crds" / "scheduling.x-k8s.io_podgroups.yaml"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return loaded


def test_crd_names_match_the_conventions(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{POD_GROUP_PLURAL}.{POD_GROUP_API_GROUP}"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
        POD_GROUP_API_GROUP,
        POD_GROUP_KIND,
        POD_GROUP_PLURAL,
    )
    assert spec["scope"] == "Namespaced"
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (POD_GROUP_VERSION, True, True)
    assert "status" in version["subresources"]


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_built_manifests_validate_and_parse(crd: dict[str, Any]) -> None:
    manifest = pod_group_manifest("train", 8, "team-a")
    manifest["spec"]["scheduleTimeoutSeconds"] = 60
    manifest["spec"]["minResources"] = {"cpu": "16", "nvidia.com/gpu": 8}
    jsonschema.validate(manifest, _schema(crd))
    group = parse_pod_group(manifest)
    assert (group.min_member, group.schedule_timeout_seconds) == (8, 60)


@pytest.mark.parametrize(
    "spec",
    [
        {"minMember": "eight"},
        {"minMember": 2, "scheduleTimeoutSeconds": "soon"},
        {"minResources": {"cpu": "lots"}},
    ],
)
def test_schema_rejects_malformed_specs(crd: dict[str, Any], spec: dict[str, Any]) -> None:
    manifest = pod_group_manifest("train", 1)
    manifest["spec"] = spec
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest, _schema(crd))
