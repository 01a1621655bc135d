"""The RBAC table says what the Kubernetes adapter really calls: read from the adapter's source."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest

from tessera.cluster import cache as cache_module
from tessera.cluster.kube import adapter
from tessera.cluster.kube.adapter import KubernetesCluster
from tessera.cluster.kube.lease import KubernetesLeaseLock
from tessera.cluster.rbac import (
    CACHE_CALLS,
    CLIENT_CALLS,
    LEASE_CALLS,
    PORT_CALLS,
    SERVICE_CALLS,
    ApiCall,
    policy_rules,
)

CLIENTS = {"_core", "_custom"}  # the adapter's CoreV1Api and CustomObjectsApi


def _methods() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(KubernetesCluster)))
    (cls,) = tree.body
    assert isinstance(cls, ast.ClassDef)
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _reached(name: str, methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> tuple[set[str], bool]:
    """Client methods that `name` reaches through the adapter's own helpers; and whether it watches."""
    client: set[str] = set()
    watches = False
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in ast.walk(methods[current]):
            if not isinstance(node, ast.Attribute) or not isinstance(node.value, ast.Attribute | ast.Name):
                continue
            owner = node.value
            if isinstance(owner, ast.Attribute) and owner.attr in CLIENTS:
                client.add(node.attr)
            elif isinstance(owner, ast.Name) and owner.id == "self" and node.attr in methods:
                watches |= node.attr == "_watch"
                todo.append(node.attr)
    return client, watches


_RAW_PATH = re.compile(r"^/api/v1/namespaces/\{\}/(\w+)/\{\}/(\w+)$")


def _raw_posts(name: str, methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> set[ApiCall]:
    """The API calls `name` POSTs itself (`KubernetesCluster._post`, `bind_blocking`), without the
    client's generated methods: read from the paths it builds (f-strings below ``/api/v1``), in its
    own code, the adapter's helpers it reaches and the module's functions it calls."""
    functions = {
        n.name: n
        for n in ast.parse(inspect.getsource(adapter)).body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    calls: set[ApiCall] = set()
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in ast.walk(methods.get(current) or functions[current]):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "self" and node.attr in methods:
                    todo.append(node.attr)
            elif isinstance(node, ast.Name) and node.id in functions:
                todo.append(node.id)
            elif isinstance(node, ast.JoinedStr):
                path = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
                if path.startswith("/api"):
                    found = _RAW_PATH.match(path)
                    assert found, f"{current} POSTs to {path}: teach this test its API call"
                    calls.add(ApiCall("", f"{found[1]}/{found[2]}", "create"))
    return calls


def test_the_adapter_posts_itself_only_by_the_post_method() -> None:
    """What `_raw_posts` reads as a create is a POST: the adapter serialises raw requests only as
    POSTs."""
    serialise = _methods()["_serialise_post"]
    methods = {
        k.value.value
        for k in ast.walk(serialise)
        if isinstance(k, ast.keyword) and k.arg == "method" and isinstance(k.value, ast.Constant)
    }
    assert methods == {"POST"}


def _public() -> list[str]:
    return sorted(n for n in _methods() if not n.startswith("_") and n != "close")


def test_every_port_method_of_the_adapter_is_in_the_table() -> None:
    assert set(_public()) == set(PORT_CALLS)


@pytest.mark.parametrize("method", _public())
def test_a_port_method_makes_exactly_the_calls_the_table_names(method: str) -> None:
    client, watches = _reached(method, _methods())
    unknown = client - set(CLIENT_CALLS)
    assert not unknown, f"{method} calls {unknown}: add them to CLIENT_CALLS"
    found = {CLIENT_CALLS[name] for name in client}
    if watches:  # a watch goes through the list method with watch=True
        found = {ApiCall(c.group, c.resource, "watch" if c.verb == "list" else c.verb) for c in found}
    found |= _raw_posts(method, _methods())
    assert found == set(PORT_CALLS[method])


def test_the_custom_objects_the_adapter_touches_are_podgroups() -> None:
    source = inspect.getsource(adapter)
    assert "POD_GROUP_PLURAL" in source and "POD_GROUP_API_GROUP" in source
    assert all(c.resource == "podgroups" for n, c in CLIENT_CALLS.items() if "custom_object" in n)


def test_the_cache_watches_what_the_table_says() -> None:
    used = {
        node.attr
        for node in ast.walk(ast.parse(inspect.getsource(cache_module.ClusterCache)))
        if isinstance(node, ast.Attribute) and node.attr in PORT_CALLS
    }
    assert frozenset().union(*(PORT_CALLS[m] for m in used)) == CACHE_CALLS


def test_no_service_is_granted_a_wildcard_and_every_service_is_listed() -> None:
    assert set(SERVICE_CALLS) == {
        "telemetry",
        "forecaster",
        "admission",
        "scheduler",
        "slicing",
        "checkpoint",
    }
    for calls in SERVICE_CALLS.values():
        for call in calls:
            assert "*" not in (call.group, call.resource, call.verb)


def test_policy_rules_group_verbs_by_resource_per_scope() -> None:
    calls = SERVICE_CALLS["scheduler"]
    assert policy_rules(calls, "namespace") == [], "the scheduler creates no pods"
    assert {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]} in policy_rules(
        calls, "cluster"
    )
    slicing = SERVICE_CALLS["slicing"]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]} in policy_rules(
        slicing, "cluster"
    )
    assert policy_rules(slicing, "release") == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]}
    ]
    # its ConfigMaps and Events only where it makes them (Roles there), never cluster-wide
    assert policy_rules(slicing, "namespace") == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "update"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    assert not {"configmaps", "events"} & {
        r for rule in policy_rules(slicing, "cluster") for r in rule["resources"]
    }


def test_the_lease_lock_makes_exactly_the_lease_calls() -> None:
    called = {
        node.attr
        for node in ast.walk(ast.parse(inspect.getsource(KubernetesLeaseLock)))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_leases"
    }
    assert {CLIENT_CALLS[name] for name in called} == LEASE_CALLS
    assert all(call.scope == "release" for call in LEASE_CALLS)
    assert policy_rules(SERVICE_CALLS["scheduler"], "release") == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]}
    ]
