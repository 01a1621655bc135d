"""Contract tests: the published schemas may grow, never break; examples validate against them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tessera.contracts.events import ALL
from tessera.contracts.export import asyncapi_document, export, json_schemas, schema_name
from tests.contracts.schema_compat import breaking_changes

PINNED = Path(__file__).parent / "pinned"
EXAMPLES = Path(__file__).parents[2] / "examples" / "jobs"


def _pinned() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(PINNED.glob("io.tessera.*.json"))}


def test_every_published_type_is_pinned() -> None:
    assert set(json_schemas()) == set(_pinned()), (
        "pin new schemas with: tessera contracts export tests/contracts/pinned"
    )


@pytest.mark.parametrize("name", sorted(_pinned()))
def test_schema_is_backward_compatible_with_its_pin(name: str) -> None:
    current = json_schemas()[name]
    assert breaking_changes(_pinned()[name], current) == []


def test_compatibility_check_catches_a_removed_and_a_newly_required_field() -> None:
    old = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a"],
    }
    new = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "c": {"type": "string"}},
        "required": ["a", "c"],
    }
    problems = breaking_changes(old, new)
    assert ".b: removed" in problems
    assert ".c: newly required" in problems
    assert any(p.startswith(".a: type") for p in problems)


def test_adding_an_optional_field_is_compatible() -> None:
    old = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    new = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "z": {"type": "string"}},
        "required": ["a"],
    }
    assert breaking_changes(old, new) == []


def test_every_type_carries_a_version() -> None:
    for model in ALL:
        assert model.TYPE.startswith("io.tessera.") and model.TYPE.rsplit(".", 1)[-1].startswith("v")


@pytest.mark.parametrize("example", ["ddp-2x4.yaml", "inference-fractional.yaml"])
def test_exported_job_schema_validates_the_examples(tmp_path: Path, example: str) -> None:
    export(tmp_path)
    schema = json.loads((tmp_path / f"{schema_name_of_job()}.json").read_text())
    jsonschema.validate(yaml.safe_load((EXAMPLES / example).read_text()), schema)


def test_exported_job_schema_rejects_the_invalid_example(tmp_path: Path) -> None:
    export(tmp_path)
    schema = json.loads((tmp_path / f"{schema_name_of_job()}.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = list(validator.iter_errors(yaml.safe_load((EXAMPLES / "invalid.yaml").read_text())))
    assert any(list(e.path) == ["name"] for e in errors)


def test_asyncapi_document_lists_every_subject() -> None:
    doc = asyncapi_document()
    assert doc["asyncapi"].startswith("3.")
    addresses = {c["address"] for c in doc["channels"].values()}
    assert addresses == {m.SUBJECT for m in ALL}
    for op in doc["operations"].values():
        assert op["channel"]["$ref"].removeprefix("#/channels/") in doc["channels"]
    for msg in doc["components"]["messages"].values():
        assert msg["payload"]["$ref"].removeprefix("#/components/schemas/") in doc["components"]["schemas"]


def schema_name_of_job() -> str:
    from tessera.contracts.jobs import JobSpec

    return schema_name(JobSpec)
