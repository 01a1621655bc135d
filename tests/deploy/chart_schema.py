"""The umbrella chart's values.schema.json, made here and checked in (a test keeps the two equal).

Each service's ``settings`` is derived from its pydantic settings class, less the settings the chart
sets itself, so a setting that does not exist or has the wrong type fails `helm install`.

Write it again after changing a settings class or the chart's values:
    uv run --frozen python -m tests.deploy.chart_schema
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from tessera.admission.config import AdmissionSettings
from tessera.checkpoint.config import CheckpointSettings
from tessera.forecaster.config import ForecasterSettings
from tessera.scheduler.config import SchedulerSettings
from tessera.slicing.config import SlicingSettings
from tessera.telemetry.config import TelemetrySettings

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "tessera"
SCHEMA = CHART / "values.schema.json"

SETTINGS: dict[str, type[BaseSettings]] = {
    "telemetry": TelemetrySettings,
    "forecaster": ForecasterSettings,
    "admission": AdmissionSettings,
    "scheduler": SchedulerSettings,
    "slicing": SlicingSettings,
    "checkpoint": CheckpointSettings,
}
# Settings the chart sets from its own values (or from the pod), never from <service>.settings.
CHART_OWNED = {
    "nats_url",
    "nats_inbox_prefix",
    "database_url",
    "http_host",
    "http_port",
    "log_level",
    "kubeconfig",
}
CHART_OWNED_BY_SERVICE = {
    "telemetry": {"node_name", "source"},
    "admission": {"admin_token", "webhook", "namespace"},
    "scheduler": {"namespace"},
    "forecaster": {"metrics_tls"},
}
_DROPPED_KEYS = ("title", "default")


def _string(description: str = "", **extra: Any) -> dict[str, Any]:
    return {"type": "string", **({"description": description} if description else {}), **extra}


def _closed(properties: dict[str, Any], description: str = "", **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if description:
        schema["description"] = description
    return {**schema, **extra}


def _map(description: str = "") -> dict[str, Any]:
    return {"type": "object", **({"description": description} if description else {})}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs, drop null alternatives (leave a setting out instead) and close every model."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    out = {k: _resolve(v, defs) for k, v in node.items() if k not in _DROPPED_KEYS and k != "$defs"}
    if "anyOf" in out:
        options = [option for option in out["anyOf"] if option != {"type": "null"}]
        out.pop("anyOf")
        if len(options) == 1:
            out = {**options[0], **out}
        else:
            out["anyOf"] = options
    if out.get("format") == "path":
        out.pop("format")
    if "properties" in out:
        out["additionalProperties"] = False
    return out


def settings_schema(service: str) -> dict[str, Any]:
    """`<service>.settings`: the service's pydantic settings, less what the chart sets itself."""
    raw = SETTINGS[service].model_json_schema(mode="validation", by_alias=False)
    resolved = _resolve(raw, raw.get("$defs", {}))
    owned = CHART_OWNED | CHART_OWNED_BY_SERVICE.get(service, set())
    properties = {name: spec for name, spec in resolved["properties"].items() if name not in owned}
    return _closed(
        properties,
        f"settings of {service}, each set as TESSERA_{service.upper()}_<NAME> (groups as JSON)",
    )


def _probe() -> dict[str, Any]:
    number = {"type": "integer", "minimum": 0}
    return _closed(
        {
            key: number
            for key in (
                "initialDelaySeconds",
                "periodSeconds",
                "timeoutSeconds",
                "failureThreshold",
                "successThreshold",
            )
        }
    )


def _rules() -> dict[str, Any]:
    no_wildcard = {"type": "array", "items": {"type": "string", "not": {"const": "*"}}, "minItems": 1}
    rule = _closed(
        {"apiGroups": no_wildcard, "resources": no_wildcard, "verbs": no_wildcard},
        required=["apiGroups", "resources", "verbs"],
    )
    return {"type": "array", "items": rule}


def service_schema(service: str) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "enabled": {"type": "boolean"},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "logLevel": _string(enum=["", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]),
        "settings": settings_schema(service),
        "resources": _map("the container's resources"),
        "service": _closed({"type": _string(enum=["ClusterIP", "NodePort", "LoadBalancer"])}),
        "serviceAccount": _closed({"create": {"type": "boolean"}, "name": _string(), "annotations": _map()}),
        "probes": _closed({"startup": _probe(), "readiness": _probe(), "liveness": _probe()}),
        "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
        "priorityClassName": _string(),
        "podAnnotations": _map(),
        "podLabels": _map(),
        "nodeSelector": _map(),
        "tolerations": {"type": "array", "items": {"type": "object"}},
        "affinity": _map(),
        "global": {"type": "object"},
    }
    if service == "telemetry":
        properties |= {
            "updateStrategy": _map(),
            "source": _string("where readings come from", enum=["auto", "nvml", "dcgm"]),
            "nvidiaContainerRuntime": _closed({"enabled": {"type": "boolean"}}),
            "runtimeClassName": _string(),
            "podResources": _closed({"enabled": {"type": "boolean"}, "hostPath": _string()}),
            "hostPID": {"type": "boolean"},
        }
    else:
        properties |= {
            "replicaCount": {"type": "integer", "minimum": 0},
            "strategy": _map(),
            "podDisruptionBudget": _closed(
                {
                    "enabled": {"type": "boolean"},
                    "maxUnavailable": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                }
            ),
        }
    if service in ("telemetry", "scheduler", "checkpoint", "forecaster", "slicing", "admission"):
        properties |= {
            "kubernetesApi": _closed({"enabled": {"type": "boolean"}}),
            "rbac": _closed(
                {
                    "create": {"type": "boolean"},
                    "clusterRules": _rules(),
                    "namespaceRules": _rules(),
                    "releaseRules": _rules(),
                }
            ),
        }
    if service == "slicing":  # its ConfigMaps and Events: Roles in the namespace of each (its settings)
        properties["rbac"]["properties"] |= {
            "operatorNamespaceRules": _rules(),
            "eventsNamespaceRules": _rules(),
        }
    if service == "scheduler":
        properties["jobNamespace"] = _string("where the pods and PodGroups of admitted jobs are made")
    if service == "forecaster":
        properties["grpcPort"] = {"type": "integer", "minimum": 1, "maximum": 65535}
        properties["externalMetrics"] = _external_metrics()
    if service == "admission":
        properties["adminToken"] = _closed({"existingSecret": _string(), "key": _string()})
        properties["jobNamespace"] = _string("where the Jobs and Service of submitted jobs are made")
        properties["webhook"] = _webhook()
    return _closed(properties, f"the {service} service")


def _webhook() -> dict[str, Any]:
    issuer = _closed(
        {
            "name": _string("an Issuer or ClusterIssuer; empty: the chart's"),
            "kind": _string(enum=["Issuer", "ClusterIssuer"]),
        }
    )
    return _closed(
        {
            "enabled": {"type": "boolean"},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "timeoutSeconds": {"type": "integer", "minimum": 1, "maximum": 30},
            "certManager": _closed(
                {
                    "enabled": {"type": "boolean"},
                    "issuerRef": issuer,
                    "duration": _string(
                        "a Go duration, e.g. 2160h", pattern="^([0-9]+(\\.[0-9]+)?(h|m|s))*$"
                    ),
                }
            ),
            "selfSigned": _closed({"validityDays": {"type": "integer", "minimum": 1}}),
        },
        "the mutating webhook over HTTPS and its certificate",
    )


def _external_metrics() -> dict[str, Any]:
    return _closed(
        {
            "apiService": _closed({"enabled": {"type": "boolean"}}),
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "certManager": _closed(
                {
                    "enabled": {"type": "boolean"},
                    "issuerRef": _closed(
                        {
                            "name": _string("your Issuer or ClusterIssuer (required with cert-manager)"),
                            "kind": _string(enum=["Issuer", "ClusterIssuer"]),
                        }
                    ),
                    "duration": _string(
                        "a Go duration, e.g. 2160h", pattern="^([0-9]+(\\.[0-9]+)?(h|m|s))*$"
                    ),
                }
            ),
            "selfSigned": _closed({"validityDays": {"type": "integer", "minimum": 1}}),
        },
        "the external metrics API over HTTPS and its APIService",
    )


def _store(image: str) -> dict[str, Any]:
    return _closed(
        {"image": _string(image), "storage": _string(), "resources": _map(), "password": _string()}
    )


def schema() -> dict[str, Any]:
    image = _closed(
        {
            "repository": _string(),
            "tag": _string(),
            "pullPolicy": _string(enum=["Always", "IfNotPresent", "Never"]),
            "uid": {"type": "integer", "minimum": 1},
        }
    )
    global_ = _closed(
        {
            "image": image,
            "imagePullSecrets": {"type": "array", "items": {"type": "object"}},
            "nats": _closed(
                {
                    "url": _string("nats://host:4222", pattern="^(nats://.*)?$"),
                    "auth": _closed(
                        {
                            "enabled": {"type": "boolean"},
                            "existingSecret": _string("a Secret with each service's NATS password"),
                        }
                    ),
                }
            ),
            "database": _closed(
                {
                    "url": _string("postgresql://...", pattern="^(postgres(ql)?(\\+asyncpg)?://.*)?$"),
                    "existingSecret": _closed({"name": _string(), "key": _string()}),
                }
            ),
            "otlp": _closed(
                {"endpoint": _string(), "protocol": _string(enum=["http/protobuf"])},
            ),
            "logLevel": _string(enum=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]),
        }
    )
    nats, postgres = _store("NATS"), _store("PostgreSQL")
    nats["properties"].pop("password")
    nats["properties"]["tenants"] = {
        "type": "array",
        "description": "tenants whose publishers get a NATS user",
        "items": _string(pattern="^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"),
        "uniqueItems": True,
    }
    properties: dict[str, Any] = {
        "global": global_,
        "evaluation": _closed(
            {
                "enabled": {"type": "boolean"},
                "nats": nats,
                "postgres": postgres,
                "storageClassName": _string(),
            }
        ),
        "migrations": _closed(
            {
                "enabled": {"type": "boolean"},
                "backoffLimit": {"type": "integer", "minimum": 0},
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                "resources": _map(),
            }
        ),
        "monitoring": _closed(
            {
                "serviceMonitors": _closed(
                    {"enabled": {"type": "boolean"}, "interval": _string(), "labels": _map()}
                ),
                "dashboards": _closed({"enabled": {"type": "boolean"}, "labels": _map()}),
            }
        ),
        "tessera-lib": {"type": "object"},
        **{service: service_schema(service) for service in SETTINGS},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Tessera's Helm chart values",
        **_closed(properties),
    }


def rendered() -> str:
    return json.dumps(copy.deepcopy(schema()), indent=2, sort_keys=False) + "\n"


def main() -> None:
    SCHEMA.write_text(rendered())
    print(f"wrote {SCHEMA.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
