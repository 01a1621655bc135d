"""The Helm chart, rendered and linted in-process (helm-python-sdk): its objects and its values.

Value sets: the defaults (plus the NATS and database production must name), evaluation (in-chart
NATS and Postgres), HA (three replicas of every Deployment) and half the services disabled. Every
rendered object is validated against the Kubernetes OpenAPI schemas of two minor versions. RBAC is
checked in test_helm_rbac.py, the environment each service reads (NATS, the database) in
test_helm_settings.py; the `chart` and `default` fixtures are in conftest.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    NAMESPACE,
    SERVICES,
    VALUE_SETS,
    VALUES,
    Rendered,
    merged,
    notes,
    render,
    workloads,
)
from tests.deploy.chart_schema import CHART, SCHEMA, SETTINGS, rendered

ROOT = Path(__file__).parents[2]
# The oldest minor Chart.yaml's kubeVersion allows, the one the devcluster reports, and the newest
# kubernetes-validate knows.
KUBE_VERSIONS = ("1.29", "1.31", kubernetes_validate.latest_version())
# Kinds that are CustomResourceDefinitions, for which kubernetes-validate has no schema.
CRD_KINDS = {
    "ServiceMonitor": "a Prometheus Operator CRD (monitoring.coreos.com): no built-in schema",
    "Issuer": "a cert-manager CRD (cert-manager.io): no built-in schema",
    "Certificate": "a cert-manager CRD (cert-manager.io): no built-in schema",
}
RESTRICTED_CONTAINER = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


# -- lint and schema validation -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict_is_clean(name: str) -> None:
    report = helm_python.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(chart: Rendered, version: str) -> None:
    skipped: dict[str, str] = {}
    for obj in [*chart.objects, *chart.crds]:
        if obj["kind"] in CRD_KINDS:
            skipped[obj["kind"]] = CRD_KINDS[obj["kind"]]
            continue
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{name} is not valid Kubernetes {version}: {path}: {error.message}")
    assert set(skipped) == {kind for kind in CRD_KINDS if chart.of_kind(kind)}


def test_service_monitors_are_optional_and_scrape_metrics() -> None:
    on = merged(VALUE_SETS["default"], {"monitoring": {"serviceMonitors": {"enabled": True}}})
    monitors = render(on).of_kind("ServiceMonitor")
    assert sorted(m["metadata"]["name"] for m in monitors) == sorted(f"tessera-{s}" for s in SERVICES)
    for monitor in monitors:
        assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    assert render(VALUE_SETS["default"]).of_kind("ServiceMonitor") == []


def test_grafana_dashboards_are_optional_configmaps_identical_to_the_repository_s() -> None:
    on = merged(VALUE_SETS["default"], {"monitoring": {"dashboards": {"enabled": True}}})
    maps = [
        m for m in render(on).of_kind("ConfigMap") if m["metadata"]["name"].startswith("tessera-dashboard-")
    ]
    shipped = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
    assert sorted(m["metadata"]["name"] for m in maps) == [f"tessera-dashboard-{p.stem}" for p in shipped]
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, body),) = config_map["data"].items()
        assert json.loads(body) == json.loads((ROOT / "deploy" / "grafana" / name).read_text())
    chart_copies = sorted((ROOT / "helm" / "tessera" / "dashboards").glob("*.json"))
    assert [p.read_bytes() for p in chart_copies] == [p.read_bytes() for p in shipped]
    off = render(VALUE_SETS["default"]).of_kind("ConfigMap")
    assert not [m for m in off if m["metadata"]["name"].startswith("tessera-dashboard-")]


# -- containers -------------------------------------------------------------------------------------------


def test_every_container_runs_restricted(chart: Rendered) -> None:
    for workload, pod in chart.pod_templates():
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not pod.get("hostNetwork") and not pod.get("hostIPC") and not pod.get("hostPID")
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            assert container["securityContext"] == RESTRICTED_CONTAINER, container["name"]
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_probes_ask_each_service_on_its_real_port(chart: Rendered) -> None:
    for service, _, container in workloads(chart):
        env = {e["name"]: e.get("value") for e in container["env"]}
        prefix = f"TESSERA_{service.upper()}_"
        default_port = SETTINGS[service].model_fields["http_port"].default
        assert env[f"{prefix}HTTP_HOST"] == "0.0.0.0"
        assert int(env[f"{prefix}HTTP_PORT"]) == default_port
        assert container["ports"][0] == {"name": "http", "containerPort": default_port, "protocol": "TCP"}
        assert [p["name"] for p in container["ports"][1:]] == (
            ["webhook"] if service == "admission" and chart.values[service]["webhook"]["enabled"] else []
        )
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["command"] == ["python", "-m", f"tessera.{service}"]
        svc = chart.get("Service", f"tessera-{service}")
        assert (
            svc["spec"]["ports"][0]["port"] == default_port
            and svc["spec"]["ports"][0]["targetPort"] == "http"
        )


# -- the workloads ----------------------------------------------------------------------------------------


def test_telemetry_is_a_daemonset_on_gpu_nodes_without_host_access_by_default(default: Rendered) -> None:
    telemetry = default.get("DaemonSet", "tessera-telemetry")
    pod = telemetry["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert "hostPID" not in pod and all("hostPath" not in v for v in pod["volumes"])
    (container,) = pod["containers"]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})  # takes no GPU from the node
    env = {e["name"]: e for e in container["env"]}
    assert env["TESSERA_TELEMETRY_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_telemetry_mounts_the_pod_resources_socket_and_shares_host_pids_only_when_asked() -> None:
    values = merged(
        VALUE_SETS["default"], {"telemetry": {"podResources": {"enabled": True}, "hostPID": True}}
    )
    pod = render(values).get("DaemonSet", "tessera-telemetry")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert {
        "name": "pod-resources",
        "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
    } in pod["volumes"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources")
    assert mount["readOnly"] is True


def test_deployments_have_replicas_and_disruption_budgets(chart: Rendered) -> None:
    for service, workload, _ in workloads(chart):
        if service == "telemetry":
            continue
        assert workload["spec"]["replicas"] == chart.values[service]["replicaCount"]
        pdb = chart.get("PodDisruptionBudget", f"tessera-{service}")
        assert pdb["spec"]["selector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
        assert chart.get("Service", f"tessera-{service}")["spec"]["type"] == "ClusterIP"


def test_ha_runs_three_of_every_deployment_and_warns_about_the_scheduler() -> None:
    chart = render(VALUE_SETS["ha"])
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in chart.of_kind("Deployment")} == {
        f"tessera-{s}": 3 for s in SERVICES if s != "telemetry"
    }
    assert "scheduler replicas elect a leader on the Lease" in notes(VALUE_SETS["ha"])
    assert "leader" not in notes(VALUE_SETS["default"])
    without = merged(VALUE_SETS["ha"], {"scheduler": {"settings": {"leader_election": {"enabled": False}}}})
    assert "WARNING: scheduler.replicaCount is 3 without leader election" in notes(without)


def test_disabled_services_render_nothing() -> None:
    chart = render(VALUE_SETS["half-disabled"])
    assert chart.enabled() == ["admission", "scheduler", "checkpoint"]
    components = {o["metadata"].get("labels", {}).get("app.kubernetes.io/component") for o in chart.objects}
    assert not components & {"telemetry", "forecaster", "slicing"}
    assert {o["metadata"]["name"] for o in chart.of_kind("ServiceAccount")} == {
        "tessera-admission",
        "tessera-scheduler",
        "tessera-checkpoint",
    }


def test_admission_and_the_scheduler_must_agree_on_the_jobs_namespace() -> None:
    values = merged(VALUE_SETS["default"], {"admission": {"jobNamespace": "ml-jobs"}})
    with pytest.raises(
        helm_python.HelmRenderError, match=r"admission\.jobNamespace \(ml-jobs\) and scheduler"
    ):
        render(values)
    both = merged(values, {"scheduler": {"jobNamespace": "ml-jobs"}})
    assert render(both).get("Role", "tessera-admission")["metadata"]["namespace"] == "ml-jobs"


# -- values: schema and documentation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bad-type.yaml", "at '/scheduler/replicaCount': got string, want integer"),
        ("bad-unknown-service.yaml", "additional properties 'autoscaler' not allowed"),
        ("bad-setting.yaml", "at '/scheduler/settings/gang/timeout_s': got string, want number"),
        ("bad-setting.yaml", "additional properties 'speed' not allowed"),
    ],
)
def test_a_bad_values_file_fails_with_the_schema_message(name: str, message: str) -> None:
    values = yaml.safe_load((VALUES / name).read_text())
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render(merged(VALUE_SETS["default"], values))
    assert message in str(caught.value)
    report = helm_python.lint(CHART, merged(VALUE_SETS["default"], values), strict=True)
    assert any(message in error for error in report["errors"])


def test_the_schema_file_is_the_generated_one() -> None:
    assert SCHEMA.read_text() == rendered(), "run: uv run --frozen python -m tests.deploy.chart_schema"


def _leaves(values: Any, schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Dotted keys of `values`, down to the schema's free-form maps (resources, nodeSelector, ...)."""
    if isinstance(values, dict) and values and "properties" in schema:
        for key, value in values.items():
            yield from _leaves(value, schema["properties"][key], f"{path}.{key}" if path else key)
    else:
        yield path


def test_the_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"`([\w<>./-]+)`", readme))
    schema = json.loads(SCHEMA.read_text())
    umbrella = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [key for key in _leaves(umbrella, schema) if key not in documented]
    for service in SERVICES:
        values = yaml.safe_load((CHART / "charts" / service / "values.yaml").read_text())
        for key in _leaves(values, schema["properties"][service]):
            if f"{service}.{key}" not in documented and f"<service>.{key}" not in documented:
                missing.append(f"{service}.{key}")
    assert missing == []


@pytest.mark.parametrize(
    "name", ["scheduling.x-k8s.io_podgroups.yaml", "tessera.io_predictiveautoscalers.yaml"]
)
def test_the_chart_ships_the_crds_of_deploy_crds(name: str) -> None:
    assert (CHART / "crds" / name).read_bytes() == (ROOT / "deploy" / "crds" / name).read_bytes()
    assert sorted(crd["metadata"]["name"] for crd in render(VALUE_SETS["default"]).crds) == [
        "podgroups.scheduling.x-k8s.io",
        "predictiveautoscalers.tessera.io",
    ]
