"""Resource paths and the server-side tables kubectl prints."""

from __future__ import annotations

import pytest

from tessera.devcluster.apiserver.resources import NODES, PODS
from tessera.devcluster.apiserver.routes import Route, parse_route
from tessera.devcluster.apiserver.tables import to_table, wants_table


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/api/v1/pods", Route("", "v1", "pods", None, None, None)),
        ("/api/v1/namespaces", Route("", "v1", "namespaces", None, None, None)),
        ("/api/v1/namespaces/default", Route("", "v1", "namespaces", None, "default", None)),
        ("/api/v1/namespaces/default/status", Route("", "v1", "namespaces", None, "default", "status")),
        ("/api/v1/namespaces/ns/pods", Route("", "v1", "pods", "ns", None, None)),
        ("/api/v1/namespaces/ns/pods/p/binding", Route("", "v1", "pods", "ns", "p", "binding")),
        ("/api/v1/nodes/n1/status", Route("", "v1", "nodes", None, "n1", "status")),
        (
            "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/g",
            Route("scheduling.x-k8s.io", "v1alpha1", "podgroups", "ns", "g", None),
        ),
    ],
)
def test_resource_paths(path: str, route: Route) -> None:
    assert parse_route(path) == route


@pytest.mark.parametrize(
    "path", ["/", "/api", "/api/v1", "/apis", "/apis/policy", "/apis/policy/v1", "/version"]
)
def test_discovery_paths_are_not_resource_routes(path: str) -> None:
    assert parse_route(path) is None


def test_kubectl_asks_for_tables_in_its_accept_header() -> None:
    assert wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not wants_table("application/json")


def test_node_table_shows_readiness_cordon_and_roles() -> None:
    node = {
        "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/gpu": ""}},
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        },
    }

    table = to_table(NODES, [node], "7")

    assert table["kind"] == "Table" and table["metadata"]["resourceVersion"] == "7"
    assert table["rows"][0]["cells"][:3] == ["n1", "Ready,SchedulingDisabled", "gpu"]
    assert table["rows"][0]["cells"][5] == "10.0.0.1"
    assert [c["priority"] for c in table["columnDefinitions"]][:5] == [0, 0, 0, 0, 0]


def test_pod_table_shows_node_and_terminating() -> None:
    pod = {
        "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "a", "ready": True, "restartCount": 2}],
        },
    }

    cells = to_table(PODS, [pod], "1")["rows"][0]["cells"]

    assert cells[:4] == ["p", "1/2", "Terminating", 2]
    assert cells[6] == "n1"
