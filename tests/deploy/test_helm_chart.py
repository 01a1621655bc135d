"""The Helm chart, rendered and linted in-process (helm-python-sdk) and checked against the code.

Value sets: the defaults (plus the NATS and database production must name), evaluation (in-chart
NATS and Postgres), HA (three replicas of every Deployment) and half the services disabled. Every
rendered object is validated against the Kubernetes OpenAPI schemas of two minor versions.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from tessera.cluster.rbac import (
    CACHE_CALLS,
    CLIENT_CALLS,
    CUSTOM_OBJECT_CALLS,
    LEASE_CALLS,
    PORT_CALLS,
    SERVICE_CALLS,
    ApiCall,
    Scope,
)
from tests.deploy.chart import NAMESPACE, SERVICES, VALUE_SETS, VALUES, Rendered, merged, notes, render
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
# Read by the NVIDIA container runtime (to expose the driver's NVML to the telemetry pod), not by Tessera.
CONTAINER_RUNTIME_ENV = {"telemetry": {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}}
SHARED_ENV = {"TESSERA_NATS_URL", "TESSERA_DATABASE_URL", "TESSERA_KUBECONFIG"}
# read by no service: Kubernetes puts it into TESSERA_NATS_URL ($(NATS_PASSWORD))
EXPANDED_ENV = {"NATS_PASSWORD"}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def chart(request: pytest.FixtureRequest) -> Rendered:
    return render(VALUE_SETS[request.param])


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render(VALUE_SETS["default"])


def workloads(chart: Rendered) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(service, workload, its container) of every enabled service."""
    for service in chart.enabled():
        kind = "DaemonSet" if service == "telemetry" else "Deployment"
        workload = chart.get(kind, f"tessera-{service}")
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        yield service, workload, container


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


# -- RBAC: exactly the table in libs/cluster --------------------------------------------------------------


# Slicing writes its ConfigMaps only in the GPU operator's namespace and its Events only in the events
# namespace (services/slicing/src/tessera/slicing/adapters/kube.py), so the table in libs/cluster scopes
# them `namespace` and the chart grants them by a Role in each: a ClusterRole that updates ConfigMaps
# could rewrite any (kube-system's aws-auth included). The namespace of each, from settings.
SLICING_NAMESPACED = {
    "configmaps": ("operator_namespace", "gpu-operator"),
    "events": ("events_namespace", "default"),
}


def expected_calls(service: str) -> set[ApiCall]:
    """What the service's ServiceAccount must be granted, each call in its scope: the table's."""
    return set(SERVICE_CALLS[service])


def role_namespace(chart: Rendered, service: str, resource: str) -> str:
    """Where a service's `namespace`-scoped calls on a resource are granted."""
    if service == "slicing":
        setting, default = SLICING_NAMESPACED[resource]
        return str(chart.values["slicing"]["settings"].get(setting) or default)
    return str(chart.values[service]["jobNamespace"])


def lease_namespace(chart: Rendered, service: str) -> str:
    """Where a service keeps its leader's Lease: settings.leader_election.namespace, else the release's."""
    election = chart.values[service].get("settings", {}).get("leader_election") or {}
    return str(election.get("namespace") or NAMESPACE)


def granted(chart: Rendered, service: str) -> set[ApiCall]:
    """Every call the roles bound to the service's ServiceAccount allow, with the scope of each."""
    found: set[ApiCall] = set()
    for binding in chart.of_kind("ClusterRoleBinding", "RoleBinding"):
        subjects = binding["subjects"]
        if {"kind": "ServiceAccount", "name": f"tessera-{service}", "namespace": NAMESPACE} not in subjects:
            continue
        kind = binding["roleRef"]["kind"]
        namespace = binding["metadata"].get("namespace")
        role = next(
            r
            for r in chart.of_kind(kind)
            if r["metadata"]["name"] == binding["roleRef"]["name"]
            and r["metadata"].get("namespace") == namespace
        )
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    scope: Scope
                    if kind == "ClusterRole":
                        scope = "cluster"
                    elif role["metadata"]["name"].endswith("-release"):
                        scope = "release"  # the Lease of its leader election
                        assert namespace == lease_namespace(chart, service), "a Lease Role elsewhere"
                    else:
                        scope = "namespace"
                        assert namespace == role_namespace(chart, service, resource), (service, resource)
                    found |= {ApiCall(group, resource, verb, scope) for verb in rule["verbs"]}
    return found


def test_rbac_of_each_service_is_exactly_the_table(chart: Rendered) -> None:
    for service in chart.enabled():
        assert granted(chart, service) == expected_calls(service), service
        account = chart.get("ServiceAccount", f"tessera-{service}")
        assert account["automountServiceAccountToken"] is bool(SERVICE_CALLS[service]), service


def test_no_cluster_role_writes_config_maps(chart: Rendered) -> None:
    for role in chart.of_kind("ClusterRole"):
        for rule in role["rules"]:
            if "" in rule["apiGroups"] and "configmaps" in rule["resources"]:
                assert not {"create", "update", "patch", "delete"} & set(rule["verbs"]), role["metadata"]


def _roles_of(chart: Rendered, service: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(namespace, name) -> rules of each Role bound to the service's ServiceAccount."""
    bound = {
        (b["metadata"]["namespace"], b["roleRef"]["name"])
        for b in chart.of_kind("RoleBinding")
        if {"kind": "ServiceAccount", "name": f"tessera-{service}", "namespace": NAMESPACE} in b["subjects"]
    }
    return {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r["rules"]
        for r in chart.of_kind("Role")
        if (r["metadata"]["namespace"], r["metadata"]["name"]) in bound
    }


CONFIG_MAPS = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "update"]}
EVENTS = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
LEASES = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]}


@pytest.mark.parametrize(
    ("settings", "roles"),
    [
        (
            {},
            {
                ("gpu-operator", "tessera-slicing"): [CONFIG_MAPS],
                ("default", "tessera-slicing"): [EVENTS],
                (NAMESPACE, "tessera-slicing-release"): [LEASES],
            },
        ),
        (
            {
                "operator_namespace": "nvidia",
                "events_namespace": "nvidia",
                "leader_election": {"namespace": "ha"},
            },
            {
                ("nvidia", "tessera-slicing"): [CONFIG_MAPS, EVENTS],
                ("ha", "tessera-slicing-release"): [LEASES],
            },
        ),
    ],
)
def test_slicing_writes_config_maps_and_events_only_in_their_namespaces(
    settings: dict[str, Any], roles: dict[tuple[str, str], list[dict[str, Any]]]
) -> None:
    chart = render(merged(VALUE_SETS["default"], {"slicing": {"settings": settings}}))
    assert _roles_of(chart, "slicing") == roles


def test_the_chart_s_slicing_namespaces_are_the_settings_defaults() -> None:
    fields = SETTINGS["slicing"].model_fields
    for setting, default in SLICING_NAMESPACED.values():
        assert fields[setting].default == default, setting


@pytest.mark.parametrize("service", ["scheduler", "slicing", "forecaster"])
def test_the_lease_role_is_where_the_lease_is_kept(service: str) -> None:
    values = {service: {"settings": {"leader_election": {"namespace": "elections"}}}}
    chart = render(merged(VALUE_SETS["default"], values))
    leases = {key: rules for key, rules in _roles_of(chart, service).items() if key[1].endswith("-release")}
    assert leases == {("elections", f"tessera-{service}-release"): [LEASES]}
    assert granted(chart, service) == expected_calls(service)


def test_no_role_grants_a_wildcard(chart: Rendered) -> None:
    for role in chart.of_kind("ClusterRole", "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"], rule)
            assert "nonResourceURLs" not in rule


def test_a_wildcard_rule_in_values_is_refused() -> None:
    wildcard = {"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}
    values = merged(VALUE_SETS["default"], {"scheduler": {"rbac": {"clusterRules": [wildcard]}}})
    with pytest.raises(helm_python.HelmValuesError, match="/scheduler/rbac/clusterRules/0/verbs/0"):
        render(values)


def _imports(tree: ast.AST) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
    return modules


KUBE_MODULES = ("kubernetes", "tessera.cluster.kube", "tessera.cluster.port", "tessera.cluster.cache")
KUBE_MODULES += ("tessera.cluster.reflector",)
# Raw API paths a service may request outside the Kubernetes client, and why that needs no RBAC.
RAW_API_PATHS = {
    "services/telemetry/src/tessera/telemetry/adapters/sources/devcluster.py": (
        "the devcluster source reads the devcluster's own HTTP server, never a real cluster"
    ),
    "services/forecaster/src/tessera/forecaster/entrypoints/api.py": (
        "the forecaster serves the external metrics API (an APIService's backend); it requests nothing"
    ),
}


def calls_in_code(service: str) -> set[tuple[str, str, str]]:
    """The API calls a service's source makes: port methods, client methods and cluster caches used
    in the modules that import the Kubernetes client or the cluster port."""
    found: set[ApiCall] = set()
    for path in sorted((ROOT / "services" / service / "src").rglob("*.py")):
        text = path.read_text()
        relative = str(path.relative_to(ROOT))
        if re.search(r"[\"']/apis?/", text):
            assert relative in RAW_API_PATHS, f"{relative} requests the API server directly"
        tree = ast.parse(text)
        if not any(m == k or m.startswith(f"{k}.") for m in _imports(tree) for k in KUBE_MODULES):
            continue
        custom = CUSTOM_OBJECT_CALLS.get(service, {})  # its custom objects are not PodGroups
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in custom:
                found |= custom[node.attr]
            elif isinstance(node, ast.Attribute) and node.attr in PORT_CALLS:
                found |= PORT_CALLS[node.attr]
            elif isinstance(node, ast.Attribute) and node.attr in CLIENT_CALLS:
                found.add(CLIENT_CALLS[node.attr])
            elif isinstance(node, ast.Name) and node.id == "ClusterCache":
                found |= CACHE_CALLS
            elif isinstance(node, ast.Name) and node.id in ("KubernetesLeaseLock", "leader_elector"):
                found |= LEASE_CALLS
    return {call.unscoped() for call in found}


@pytest.mark.parametrize("service", SERVICES)
def test_the_table_lists_what_each_service_calls(service: str) -> None:
    assert calls_in_code(service) == {call.unscoped() for call in SERVICE_CALLS[service]}


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


def test_the_kubeconfig_uses_the_service_account(default: Rendered) -> None:
    config = yaml.safe_load(default.get("ConfigMap", "tessera-kubeconfig")["data"]["kubeconfig"])
    (cluster,) = config["clusters"]
    (user,) = config["users"]
    assert cluster["cluster"]["server"] == "https://kubernetes.default.svc"
    assert user["user"] == {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}
    for service, workload, container in workloads(default):
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert ("kubeconfig" in mounts) is bool(SERVICE_CALLS[service]), service
        assert workload["spec"]["template"]["spec"]["automountServiceAccountToken"] is bool(
            SERVICE_CALLS[service]
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
