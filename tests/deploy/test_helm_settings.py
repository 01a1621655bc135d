"""The environment the Helm chart gives each service: every variable is a setting the service reads,
each service settles its settings from it, and NATS and the database are reached through Secrets
(the ones production names, or the evaluation's in-chart NATS and Postgres)."""

from __future__ import annotations

import re
from typing import Any

import helm_python
import pytest
import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from tessera.cluster.rbac import SERVICE_CALLS
from tests.deploy.chart import VALUE_SETS, Rendered, merged, render, workloads
from tests.deploy.chart_schema import SETTINGS

# Read by the NVIDIA container runtime (to expose the driver's NVML to the telemetry pod), not by Tessera.
CONTAINER_RUNTIME_ENV = {"telemetry": {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}}
SHARED_ENV = {"TESSERA_NATS_URL", "TESSERA_DATABASE_URL", "TESSERA_KUBECONFIG"}
# read by no service: Kubernetes puts it into TESSERA_NATS_URL ($(NATS_PASSWORD))
EXPANDED_ENV = {"NATS_PASSWORD"}


def accepted_env(service: str) -> set[str]:
    """Every variable the service's settings read: TESSERA_<SERVICE>_<FIELD> (nested with __), the
    aliases (TESSERA_NATS_URL, ...), and OpenTelemetry's OTEL_* (matched by prefix by the caller)."""
    prefix = f"TESSERA_{service.upper()}_"
    names: set[str] = SHARED_ENV | EXPANDED_ENV

    def walk(model: type[Any], base: str) -> None:
        for name, field in model.model_fields.items():
            names.add(f"{base}{name.upper()}")
            alias = field.validation_alias
            for choice in getattr(alias, "choices", [alias] if isinstance(alias, str) else []):
                if isinstance(choice, str) and choice.isupper():
                    names.add(choice)
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                walk(annotation, f"{base}{name.upper()}__")

    walk(SETTINGS[service], prefix)
    return names | CONTAINER_RUNTIME_ENV.get(service, set())


def test_every_variable_the_chart_sets_is_a_setting_the_service_reads(chart: Rendered) -> None:
    for service, _, container in workloads(chart):
        unknown = {
            e["name"]
            for e in container["env"]
            if e["name"] not in accepted_env(service) and not e["name"].startswith("OTEL_")
        }
        assert not unknown, f"{service} does not read {unknown}"


def _settings_from(env: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment as the kubelet makes it: Secrets read, $(VAR) of earlier variables expanded."""
    made: dict[str, str] = {}
    for entry in env:
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: made.get(m[1], m[0]), entry["value"])
        elif entry["name"] == "NATS_PASSWORD":
            value = "s3cret"
        elif "secretKeyRef" in entry["valueFrom"]:
            value = "postgresql://tessera:secret@postgres:5432/tessera"
        else:
            assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
            value = "gpu-node-1"
        made[entry["name"]] = value
        monkeypatch.setenv(entry["name"], value)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {
            "global": {"otlp": {"endpoint": "http://collector:4318"}, "logLevel": "DEBUG"},
            "scheduler": {"settings": {"gang": {"timeout_s": 30}, "poll_s": 0.5}},
            "checkpoint": {"settings": {"spot": {"taints": {"example.com/going": "node_termination"}}}},
            "telemetry": {"source": "dcgm", "settings": {"dcgm_url": "http://localhost:9400/metrics"}},
            "admission": {"adminToken": {"existingSecret": "tessera-admin"}},
        },
    ],
    ids=["defaults", "settings"],
)
def test_each_service_settles_its_settings_from_the_rendered_environment(
    extra: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    chart = render(merged(VALUE_SETS["default"], extra))
    for service, _, container in workloads(chart):
        with monkeypatch.context() as patch:
            for name in [n for n in __import__("os").environ if n.startswith(("TESSERA_", "OTEL_"))]:
                patch.delenv(name)
            _settings_from(container["env"], patch)
            settings_class: type[BaseSettings] = SETTINGS[service]
            try:
                settings: Any = settings_class()
            except ValidationError as error:
                pytest.fail(f"{service} cannot start with the chart's environment: {error}")
        assert settings.nats_url == f"nats://tessera-{service}:s3cret@nats.nats.svc:4222"
        assert settings.nats_inbox_prefix == f"_INBOX_tessera-{service}"
        assert settings.database_url.get_secret_value().startswith("postgresql://")
        assert settings.http_host == "0.0.0.0"
        assert str(getattr(settings, "kubeconfig", None) or "") == (
            "/etc/tessera/kube/kubeconfig" if SERVICE_CALLS[service] else ""
        )
    if extra:
        assert settings_class is SETTINGS["checkpoint"]
        assert settings.spot.taints == {"example.com/going": "node_termination"}


def test_global_otlp_endpoint_reaches_every_service_s_exporter() -> None:
    chart = render(merged(VALUE_SETS["default"], {"global": {"otlp": {"endpoint": "http://collector:4318"}}}))
    for service, _, container in workloads(chart):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == "http://collector:4318", service
    for service, _, container in workloads(render(VALUE_SETS["default"])):
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in {e["name"] for e in container["env"]}, service


def test_production_uses_the_given_nats_and_database_secret(default: Rendered) -> None:
    assert default.of_kind("StatefulSet") == []
    assert [s["metadata"]["name"] for s in default.of_kind("Secret")] == ["tessera-admission-webhook-tls"]
    for service, _, container in workloads(default):
        env = {e["name"]: e for e in container["env"]}
        assert (
            env["TESSERA_NATS_URL"]["value"]
            == f"nats://tessera-{service}:$(NATS_PASSWORD)@nats.nats.svc:4222"
        )
        assert env["NATS_PASSWORD"]["valueFrom"] == {
            "secretKeyRef": {"name": "tessera-nats-users", "key": service}
        }
        assert env["TESSERA_DATABASE_URL"]["valueFrom"] == {
            "secretKeyRef": {"name": "tessera-database", "key": "url"}
        }


def test_a_database_url_value_is_kept_in_a_secret_the_chart_writes() -> None:
    url = "postgresql://tessera:pw@db.example:5432/tessera"
    nats = {"url": "nats://n:4222", "auth": {"enabled": False}}
    chart = render(merged({"global": {"nats": nats, "database": {"url": url}}}))
    secret = chart.get("Secret", "tessera-database")
    assert secret["stringData"] == {"url": url}
    assert secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert all(url not in yaml.safe_dump(o) for o in chart.objects if o["kind"] != "Secret")


def test_evaluation_runs_nats_with_jetstream_and_postgres_in_the_chart() -> None:
    chart = render(VALUE_SETS["evaluation"])
    nats = chart.get("StatefulSet", "tessera-nats")["spec"]["template"]["spec"]["containers"][0]
    assert "-js" in nats["args"]
    postgres = chart.get("StatefulSet", "tessera-postgres")
    assert postgres["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    secret = chart.get("Secret", "tessera-database")["stringData"]
    assert secret["url"] == "postgresql://tessera:tessera@tessera-postgres:5432/tessera"
    for _, _, container in workloads(chart):
        env = {e["name"]: e for e in container["env"]}
        assert env["TESSERA_NATS_URL"]["value"].endswith(":$(NATS_PASSWORD)@tessera-nats:4222")
    job = chart.get("Job", "tessera-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"


def test_migrations_run_as_a_hook_before_install_and_upgrade(default: Rendered) -> None:
    job = default.get("Job", "tessera-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tessera", "migrate"]
    assert [e["name"] for e in container["env"]] == ["TESSERA_DATABASE_URL"]


def test_without_nats_or_a_database_the_render_says_what_to_set() -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"global\.nats\.url is required"):
        render({})
    with pytest.raises(helm_python.HelmRenderError, match=r"global\.database\.existingSecret\.name"):
        render({"global": {"nats": {"url": "nats://n:4222"}}})
