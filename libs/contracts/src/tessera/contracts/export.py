"""JSON Schema files and an AsyncAPI 3 document, for systems that publish to or consume from Tessera."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tessera.contracts.events import ALL
from tessera.contracts.jobs import JobSpec

ASYNCAPI_VERSION = "3.0.0"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_name(model: type[BaseModel]) -> str:
    type_ = getattr(model, "TYPE", None)
    return str(type_) if type_ else f"io.tessera.{model.__name__.lower()}"


def json_schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema, for the job spec and every message."""
    out: dict[str, dict[str, Any]] = {}
    models: list[type[BaseModel]] = [JobSpec, *ALL]
    for model in models:
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = JSON_SCHEMA_DIALECT
        schema["$id"] = f"https://tessera.io/schemas/{schema_name(model)}.json"
        out[f"{schema_name(model)}.json"] = schema
    return out


def asyncapi_document() -> dict[str, Any]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for model in ALL:
        name = model.__name__
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        defs = schema.pop("$defs", {})
        messages[name] = {
            "name": model.TYPE,
            "title": name,
            "summary": model.SUMMARY,
            "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/CloudEventHeaders"},
            "payload": {"$ref": f"#/components/schemas/{name}"},
        }
        components_schemas = {name: schema, **defs}
        messages[name]["x-schemas"] = sorted(components_schemas)
        channel_id = name[0].lower() + name[1:]
        channels[channel_id] = {
            "address": model.SUBJECT,
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }
        is_command = ".cmd." in model.SUBJECT
        operations[f"{'send' if is_command else 'receive'}{name}"] = {
            "action": "send" if is_command else "receive",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "summary": model.SUMMARY,
        }
    schemas: dict[str, Any] = {"CloudEventHeaders": _cloudevent_headers()}
    for model in ALL:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for msg in messages.values():
        msg.pop("x-schemas")
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "Tessera",
            "version": "1.0.0",
            "description": "Commands and events of Tessera over NATS JetStream. CloudEvents 1.0 binary mode: "
            "the attributes travel as ce-* headers, the body is JSON.",
        },
        "defaultContentType": "application/json",
        "servers": {"nats": {"host": "localhost:4222", "protocol": "nats"}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def _cloudevent_headers() -> dict[str, Any]:
    required = ["ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "Nats-Msg-Id"]
    props = {h: {"type": "string"} for h in [*required, "ce-subject", "traceparent", "tracestate"]}
    return {"type": "object", "properties": props, "required": required}


def export(directory: Path) -> list[Path]:
    """Write every schema and `asyncapi.json` into `directory`; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, schema in json_schemas().items():
        path = directory / file_name
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    path = directory / "asyncapi.json"
    path.write_text(json.dumps(asyncapi_document(), indent=2, sort_keys=True) + "\n")
    written.append(path)
    return written
