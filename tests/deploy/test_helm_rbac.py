"""The Helm chart's RBAC: each service's ServiceAccount is granted exactly the table in libs/cluster
(tessera.cluster.rbac), no more, and the table lists exactly what each service's code calls."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

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
from tests.deploy.chart import NAMESPACE, SERVICES, VALUE_SETS, Rendered, merged, render, workloads
from tests.deploy.chart_schema import SETTINGS

ROOT = Path(__file__).parents[2]


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
