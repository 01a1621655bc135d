"""``endpoints.json``: where a running stack's parts can be reached."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tessera.core.embedded.state import write_json_atomically


@dataclass(frozen=True)
class ServiceEndpoint:
    name: str
    base_url: str
    health_url: str
    ready_url: str
    log_file: str | None = None


@dataclass(frozen=True)
class Endpoints:
    nats_url: str
    database_url: str
    admission_api_url: str | None
    services: dict[str, ServiceEndpoint] = field(default_factory=dict)
    kubeconfig: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> Endpoints:
        services_raw = raw.get("services", {})
        if not isinstance(services_raw, dict):
            raise ValueError("endpoints.services: expected an object of service name to endpoint")
        services = {name: ServiceEndpoint(**value) for name, value in services_raw.items()}
        for key in ("nats_url", "database_url"):
            if not isinstance(raw.get(key), str):
                raise ValueError(f"endpoints.{key}: expected a string URL")
        return cls(
            nats_url=str(raw["nats_url"]),
            database_url=str(raw["database_url"]),
            admission_api_url=_optional_str(raw, "admission_api_url"),
            services=services,
            kubeconfig=_optional_str(raw, "kubeconfig"),
        )


def _optional_str(raw: dict[str, object], key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"endpoints.{key}: expected a string or null, got {type(value).__name__}")
    return value


def write_endpoints(path: Path, endpoints: Endpoints) -> None:
    write_json_atomically(path, endpoints.to_json())


def read_endpoints(path: Path) -> Endpoints:
    """Read an ``endpoints.json`` written by ``tessera up``."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no endpoints file; is 'tessera up' running?") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return Endpoints.from_json(raw)
