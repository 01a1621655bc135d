"""Docker cannot run here, so the compose file and the Dockerfile are checked by reading them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tessera.contracts.subjects import SERVICES

ROOT = Path(__file__).parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_compose_runs_the_infrastructure_and_all_six_services() -> None:
    services = compose()["services"]
    assert {"nats", "postgres", "jaeger", "migrate", *SERVICES} <= set(services)
    assert "-js" in services["nats"]["command"]


def test_jaeger_is_version_2_and_takes_otlp_from_the_other_containers() -> None:
    jaeger = compose()["services"]["jaeger"]
    image, _, tag = jaeger["image"].partition(":")
    assert image == "jaegertracing/jaeger" and tag.split(".")[0] == "2", "Jaeger 2, pinned"
    assert len(tag.split(".")) == 3, "a pinned release, not a moving tag"
    # the OTLP receivers listen beyond the container's loopback, so the services reach them
    assert "--set=receivers.otlp.protocols.http.endpoint=0.0.0.0:4318" in jaeger["command"]
    assert "--set=receivers.otlp.protocols.grpc.endpoint=0.0.0.0:4317" in jaeger["command"]
    assert {"16686:16686", "4317:4317", "4318:4318"} <= set(jaeger["ports"])


def test_each_service_runs_its_module_against_the_shared_nats_and_postgres() -> None:
    services = compose()["services"]
    for name in SERVICES:
        spec = services[name]
        assert spec["command"] == ["python", "-m", f"tessera.{name}"]
        env = spec["environment"]
        assert env["TESSERA_NATS_URL"] == "nats://nats:4222"
        assert env["TESSERA_DATABASE_URL"].startswith("postgresql://tessera:tessera@postgres:5432/")
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
        assert env[f"TESSERA_{name.upper()}_HTTP_HOST"] == "0.0.0.0"
        assert spec["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_the_services_reading_for_tenants_are_as_open_as_admission() -> None:
    """A local stack has no tokens: the routes that check a tenant's token with admission are open
    there as admission is (they would answer every request 401 or 403 otherwise)."""
    services = compose()["services"]
    assert services["admission"]["environment"]["TESSERA_ADMISSION_AUTH"] == "disabled"
    for name in ("telemetry", "checkpoint", "forecaster"):
        assert services[name]["environment"][f"TESSERA_{name.upper()}_AUTH"] == "disabled", name


def test_mounted_files_exist_in_the_repository() -> None:
    for spec in compose()["services"].values():
        for volume in spec.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source


def test_dockerfile_builds_from_the_lock_and_ships_the_migrations() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "uv sync --frozen --no-dev" in text
    assert "COPY migrations" in text and "TESSERA_MIGRATIONS_DIR" in text
    for copied in ("pyproject.toml", "uv.lock", "libs", "services", "migrations"):
        assert (ROOT / copied).exists(), copied


def test_the_image_is_built_in_two_stages_and_runs_as_a_numeric_non_root_user() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) == 2 and stages[0].endswith(" AS build"), stages
    assert "COPY --from=build" in text  # the runtime stage takes the environment, not the build tools
    (user,) = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user  # runAsNonRoot can check a numeric user
